package creds

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/keys/keystest"
)

func TestLoadOrCreateReusesKeys(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")

	first, created, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatalf("first LoadOrCreate: %v", err)
	}
	if !created {
		t.Fatal("first run did not create keys")
	}
	second, created, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatalf("second LoadOrCreate: %v", err)
	}
	if created {
		t.Fatal("second run created new keys")
	}
	if first.PublicKeys() != second.PublicKeys() {
		t.Fatalf("keys differ after reload:\n%+v\n%+v", first.PublicKeys(), second.PublicKeys())
	}
	// The reloaded keys sign: the mesh account JWT they make verifies as the operator's.
	ac, err := second.MeshAccountJWT()
	if err != nil {
		t.Fatal(err)
	}
	claims, err := jwt.DecodeAccountClaims(ac)
	if err != nil {
		t.Fatal(err)
	}
	if claims.Issuer != first.PublicKeys().Operator {
		t.Fatalf("issuer = %s, want operator %s", claims.Issuer, first.PublicKeys().Operator)
	}
}

func TestSavedKeyFileModes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	if _, _, err := LoadOrCreate(dir); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("dir mode = %04o, want 0700", fi.Mode().Perm())
	}
	for _, name := range []string{operatorFile, systemFile, meshFile, meshSigningFile} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s mode = %04o, want 0600", name, fi.Mode().Perm())
		}
	}
	// Nothing but the four seed files (no leftover temporary directory beside it).
	siblings, err := os.ReadDir(filepath.Dir(dir))
	if err != nil {
		t.Fatal(err)
	}
	if len(siblings) != 1 {
		t.Errorf("parent holds %d entries, want only the keys directory", len(siblings))
	}
}

func TestLoadRefusesBadTrustDirectories(t *testing.T) {
	other, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	accountSeed := other.mesh.Seed()

	tests := []struct {
		name    string
		spoil   func(t *testing.T, dir string)
		wantErr string
	}{
		{
			name:    "missing file",
			spoil:   func(t *testing.T, dir string) { must(t, os.Remove(filepath.Join(dir, meshSigningFile))) },
			wantErr: "holds only 3 of 4",
		},
		{
			name:    "readable by others",
			spoil:   func(t *testing.T, dir string) { must(t, os.Chmod(filepath.Join(dir, operatorFile), 0o644)) },
			wantErr: "readable by its owner only (chmod 600 ",
		},
		{
			name: "account seed in the operator's place",
			spoil: func(t *testing.T, dir string) {
				must(t, os.WriteFile(filepath.Join(dir, operatorFile), accountSeed, 0o600))
			},
			wantErr: "want operator",
		},
		{
			name: "garbage",
			spoil: func(t *testing.T, dir string) {
				must(t, os.WriteFile(filepath.Join(dir, systemFile), []byte("not a seed"), 0o600))
			},
			wantErr: "decode account seed",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "keys")
			if _, _, err := LoadOrCreate(dir); err != nil {
				t.Fatal(err)
			}
			tc.spoil(t, dir)
			_, _, err := LoadOrCreate(dir)
			if err == nil {
				t.Fatal("LoadOrCreate accepted a spoiled directory")
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), string(accountSeed)) {
				t.Fatal("error message contains a seed")
			}
		})
	}
}

func TestSaveNeverOverwrites(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	first, _, err := LoadOrCreate(dir)
	if err != nil {
		t.Fatal(err)
	}
	second, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Save(dir); err == nil {
		t.Fatal("Save replaced an existing trust directory")
	}
	reloaded, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if reloaded.PublicKeys() != first.PublicKeys() {
		t.Fatal("keys on disk changed")
	}
}

func TestTrustJWTs(t *testing.T) {
	tr, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	pk := tr.PublicKeys()

	opJWT, err := tr.OperatorJWT()
	if err != nil {
		t.Fatal(err)
	}
	op, err := jwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		t.Fatal(err)
	}
	if op.Subject != pk.Operator || op.Issuer != pk.Operator {
		t.Errorf("operator jwt: subject %s issuer %s, want self-signed %s", op.Subject, op.Issuer, pk.Operator)
	}
	if op.SystemAccount != pk.SystemAccount {
		t.Errorf("operator jwt names system account %s, want %s", op.SystemAccount, pk.SystemAccount)
	}

	sysJWT, err := tr.SystemAccountJWT()
	if err != nil {
		t.Fatal(err)
	}
	sys, err := jwt.DecodeAccountClaims(sysJWT)
	if err != nil {
		t.Fatal(err)
	}
	if sys.Subject != pk.SystemAccount || sys.Issuer != pk.Operator {
		t.Errorf("system account jwt: subject %s issuer %s", sys.Subject, sys.Issuer)
	}
	if sys.Limits.IsJSEnabled() {
		t.Error("system account has JetStream")
	}

	meshJWT, err := tr.MeshAccountJWT()
	if err != nil {
		t.Fatal(err)
	}
	mesh, err := jwt.DecodeAccountClaims(meshJWT)
	if err != nil {
		t.Fatal(err)
	}
	if mesh.Subject != pk.MeshAccount || mesh.Issuer != pk.Operator {
		t.Errorf("mesh account jwt: subject %s issuer %s", mesh.Subject, mesh.Issuer)
	}
	if !mesh.SigningKeys.Contains(pk.MeshSigningKey) {
		t.Error("mesh account does not list its signing key")
	}
	if !mesh.Limits.IsJSEnabled() {
		t.Error("mesh account has no JetStream")
	}
	if !mesh.Limits.DisallowBearer {
		t.Error("mesh account accepts bearer tokens")
	}
}

func TestEncodeAccountRefusesForeignAccounts(t *testing.T) {
	tr, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	other, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.EncodeAccount(other.MeshAccountClaims()); err == nil {
		t.Fatal("operator signed another operator's account")
	}
	if _, err := tr.EncodeAccount(nil); err == nil {
		t.Fatal("EncodeAccount(nil) succeeded")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestTrustNeverShowsItsSeeds covers the values of this package that hold
// keys; package keys tests the renderings of a single key.
func TestTrustNeverShowsItsSeeds(t *testing.T) {
	tr := mustTrust(t)
	key := mustUserKey(t)
	user := UserCreds{JWT: "j", Key: key}
	secrets := keystest.Secrets(t, key.Seed(), tr.operator.Seed(), tr.system.Seed(), tr.mesh.Seed(), tr.meshSigning.Seed())

	tests := []struct {
		name   string
		render func() string
		// want is a public key the rendering must show ("" for none).
		want string
	}{
		{"user creds %+v", func() string { return fmt.Sprintf("%+v", user) }, key.Public()},
		{"user creds %#v", func() string { return fmt.Sprintf("%#v", user) }, key.Public()},
		{"user creds json", func() string { b, _ := json.Marshal(user); return string(b) }, key.Public()},
		{"user creds slog json", func() string { return keystest.LogJSON("u", user) }, key.Public()},
		{"trust %v", func() string { return fmt.Sprintf("%v", tr) }, tr.meshSigning.Public()},
		{"trust %#v", func() string { return fmt.Sprintf("%#v", tr) }, tr.operator.Public()},
		{"trust %x", func() string { return fmt.Sprintf("%x", tr) }, ""},
		// A dereferenced Trust has no String method; its key fields print
		// as addresses.
		{"trust value %+v", func() string { return fmt.Sprintf("%+v", *tr) }, ""},
		{"trust value %#v", func() string { return fmt.Sprintf("%#v", *tr) }, ""},
		{"trust slog text", func() string { return keystest.LogText("trust", tr) }, tr.mesh.Public()},
		{"trust slog json", func() string { return keystest.LogJSON("trust", tr) }, tr.system.Public()},
		{"public keys json", func() string { b, _ := json.Marshal(tr.PublicKeys()); return string(b) }, tr.operator.Public()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { keystest.NoSecret(t, tc.render(), secrets, tc.want) })
	}
}

func mustTrust(t testing.TB) *Trust {
	t.Helper()
	tr, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func mustUserKey(t *testing.T) *keys.Credential {
	t.Helper()
	k, err := keys.Generate[keys.CredentialRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestFromKeys(t *testing.T) {
	gen := func() *keys.Account {
		k, err := keys.Generate[keys.AccountRole]()
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	op, err := keys.Generate[keys.OperatorRole]()
	if err != nil {
		t.Fatal(err)
	}
	sys, mesh, signing := gen(), gen(), gen()
	tr, err := FromKeys(op, sys, mesh, signing)
	if err != nil {
		t.Fatal(err)
	}
	want := PublicKeys{Operator: op.Public(), SystemAccount: sys.Public(), MeshAccount: mesh.Public(), MeshSigningKey: signing.Public()}
	if tr.PublicKeys() != want {
		t.Fatalf("public keys = %+v, want %+v", tr.PublicKeys(), want)
	}
	// The chain works: a user minted with the signing key names the mesh account.
	u, err := tr.MintServiceUser("worker-test")
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(u.JWT)
	if err != nil {
		t.Fatal(err)
	}
	if uc.Issuer != signing.Public() || uc.IssuerAccount != mesh.Public() {
		t.Fatalf("user issued by %s for %s, want %s for %s", uc.Issuer, uc.IssuerAccount, signing.Public(), mesh.Public())
	}

	for _, c := range []struct {
		name                  string
		system, mesh, signing *keys.Account
	}{
		{"missing key", sys, nil, signing},
		{"signing is the account", sys, mesh, mesh},
		{"system is the mesh", sys, sys, signing},
	} {
		if _, err := FromKeys(op, c.system, c.mesh, c.signing); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
}
