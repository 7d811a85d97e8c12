package secretfake

import (
	"context"
	"errors"
	"hash/crc32"
	"testing"
	"time"

	secretmanager "cloud.google.com/go/secretmanager/apiv1"
	"cloud.google.com/go/secretmanager/apiv1/secretmanagerpb"
	"github.com/googleapis/gax-go/v2/apierror"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func start(t *testing.T) (*Fake, *secretmanager.Client) {
	t.Helper()
	f, err := Start("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	c, err := f.NewClient(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return f, c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// The real client reaches the fake with its token; a wrong token is refused.
func TestTokenChecked(t *testing.T) {
	f, c := start(t)
	f.Put("p", "s", []byte("hello"))
	res, err := c.AccessSecretVersion(ctx(t), &secretmanagerpb.AccessSecretVersionRequest{Name: "projects/p/secrets/s/versions/latest"})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.GetPayload().GetData()) != "hello" || res.GetName() != "projects/p/secrets/s/versions/1" {
		t.Fatalf("got %q from %s", res.GetPayload().GetData(), res.GetName())
	}
	if got, want := res.GetPayload().GetDataCrc32C(), int64(crc32.Checksum([]byte("hello"), castagnoli)); got != want {
		t.Fatalf("crc32c = %d, want %d", got, want)
	}

	bad, err := secretmanager.NewClient(t.Context(), f.ClientOptions("someone-else")...)
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	_, err = bad.GetSecret(ctx(t), &secretmanagerpb.GetSecretRequest{Name: "projects/p/secrets/s"})
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("wrong token: %v", err)
	}
}

// Errors carry an ErrorInfo that the client's apierror parses.
func TestErrorInfo(t *testing.T) {
	f, c := start(t)
	cases := []struct {
		name   string
		call   func() error
		code   codes.Code
		reason string
	}{
		{"missing secret", func() error {
			_, err := c.GetSecret(ctx(t), &secretmanagerpb.GetSecretRequest{Name: "projects/p/secrets/nope"})
			return err
		}, codes.NotFound, "SECRET_NOT_FOUND"},
		{"no version", func() error {
			f.Create("p", "empty")
			_, err := c.AccessSecretVersion(ctx(t), &secretmanagerpb.AccessSecretVersionRequest{Name: "projects/p/secrets/empty/versions/latest"})
			return err
		}, codes.NotFound, "SECRET_VERSION_NOT_FOUND"},
		{"disabled latest", func() error {
			f.Put("p", "off", []byte("x"))
			f.SetState("p", "off", 1, secretmanagerpb.SecretVersion_DISABLED)
			_, err := c.AccessSecretVersion(ctx(t), &secretmanagerpb.AccessSecretVersionRequest{Name: "projects/p/secrets/off/versions/latest"})
			return err
		}, codes.FailedPrecondition, "SECRET_VERSION_NOT_ENABLED"},
		{"denied", func() error {
			f.Put("p", "locked", []byte("x"))
			f.Deny("p", "locked")
			_, err := c.AccessSecretVersion(ctx(t), &secretmanagerpb.AccessSecretVersionRequest{Name: "projects/p/secrets/locked/versions/1"})
			return err
		}, codes.PermissionDenied, "IAM_PERMISSION_DENIED"},
		{"bad checksum", func() error {
			f.Create("p", "w")
			_, err := c.AddSecretVersion(ctx(t), &secretmanagerpb.AddSecretVersionRequest{Parent: "projects/p/secrets/w",
				Payload: &secretmanagerpb.SecretPayload{Data: []byte("data"), DataCrc32C: proto.Int64(1)}})
			return err
		}, codes.InvalidArgument, "DATA_CRC32C_MISMATCH"},
		{"exists", func() error {
			f.Create("p", "dup")
			_, err := c.CreateSecret(ctx(t), &secretmanagerpb.CreateSecretRequest{Parent: "projects/p", SecretId: "dup",
				Secret: &secretmanagerpb.Secret{Replication: &secretmanagerpb.Replication{Replication: &secretmanagerpb.Replication_Automatic_{Automatic: &secretmanagerpb.Replication_Automatic{}}}}})
			return err
		}, codes.AlreadyExists, "SECRET_ALREADY_EXISTS"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var ae *apierror.APIError
			if !errors.As(err, &ae) {
				t.Fatalf("not an apierror: %v", err)
			}
			if ae.GRPCStatus().Code() != tc.code || ae.Reason() != tc.reason || ae.Domain() != Domain {
				t.Fatalf("got %v %q %q, want %v %q", ae.GRPCStatus().Code(), ae.Reason(), ae.Domain(), tc.code, tc.reason)
			}
		})
	}
	if f.Versions("p", "w") != 0 {
		t.Fatal("a payload with a wrong checksum was stored")
	}
}

// Versions list newest first; the state filter applies; latest is the
// newest whatever its state.
func TestVersions(t *testing.T) {
	f, c := start(t)
	for _, d := range []string{"a", "b", "c"} {
		f.Put("p", "s", []byte(d))
	}
	f.SetState("p", "s", 2, secretmanagerpb.SecretVersion_DISABLED)
	list := func(filter string) (names []string) {
		it := c.ListSecretVersions(ctx(t), &secretmanagerpb.ListSecretVersionsRequest{Parent: "projects/p/secrets/s", Filter: filter})
		for v, err := range it.All() {
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, v.GetName())
		}
		return names
	}
	if got := list(""); len(got) != 3 || got[0] != "projects/p/secrets/s/versions/3" {
		t.Fatalf("all: %v", got)
	}
	if got := list("state:ENABLED"); len(got) != 2 || got[1] != "projects/p/secrets/s/versions/1" {
		t.Fatalf("enabled: %v", got)
	}
	f.Corrupt("p", "s")
	res, err := c.AccessSecretVersion(ctx(t), &secretmanagerpb.AccessSecretVersionRequest{Name: "projects/p/secrets/s/versions/latest"})
	if err != nil {
		t.Fatal(err)
	}
	if int64(crc32.Checksum(res.GetPayload().GetData(), castagnoli)) == res.GetPayload().GetDataCrc32C() {
		t.Fatal("a corrupted payload still matches its checksum")
	}
	if got := f.CountCalls("AccessSecretVersion"); got != 1 {
		t.Fatalf("AccessSecretVersion calls = %d", got)
	}
}
