package creds_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	"agentmesh.dev/mesh/shared/creds"
)

// An operator credential is minted only with exactly its wide set, hosting
// nothing, expiring within a day; it is named and tagged for what it is.
func TestOperatorCredentialRules(t *testing.T) {
	tr, _, err := creds.LoadOrCreate(filepath.Join(t.TempDir(), "keys"))
	if err != nil {
		t.Fatal(err)
	}
	key := credKey(t).Public()
	ok := creds.UserSpec{PublicKey: key, Name: creds.OperatorLabel, Kind: creds.KindOperator,
		Permissions: creds.OperatorPermissions(), Expires: time.Now().Add(time.Hour)}
	tok, err := tr.MintUser(ok)
	if err != nil {
		t.Fatalf("mint: %v", err)
	}
	uc, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		t.Fatal(err)
	}
	if !uc.Tags.Contains(creds.OperatorTag) || !strings.HasPrefix(uc.Name, "OPERATOR TEST CREDENTIAL") {
		t.Errorf("name %q, tags %v", uc.Name, uc.Tags)
	}
	for _, deny := range []string{"$SYS.>", "$KV.>", "$JS.>", "mesh.internal.>"} {
		if !uc.Pub.Deny.Contains(deny) || !uc.Sub.Deny.Contains(deny) {
			t.Errorf("%s is not denied both ways", deny)
		}
	}
	for _, allow := range []string{"mesh.>", "_INBOX.>"} {
		if !uc.Pub.Allow.Contains(allow) || !uc.Sub.Allow.Contains(allow) {
			t.Errorf("%s is not allowed both ways", allow)
		}
	}

	wider := creds.OperatorPermissions()
	wider.PubAllow = append(wider.PubAllow, "$JS.API.>")
	fewerDenies := creds.OperatorPermissions()
	fewerDenies.SubDeny = fewerDenies.SubDeny[1:]
	for name, mut := range map[string]func(*creds.UserSpec){
		"no expiry":        func(s *creds.UserSpec) { s.Expires = time.Time{} },
		"more than a day":  func(s *creds.UserSpec) { s.Expires = time.Now().Add(25 * time.Hour) },
		"hosts an agent":   func(s *creds.UserSpec) { s.Hosted = []string{key} },
		"a wider set":      func(s *creds.UserSpec) { s.Permissions = wider },
		"a deny missing":   func(s *creds.UserSpec) { s.Permissions = fewerDenies },
		"another kind set": func(s *creds.UserSpec) { s.Permissions = creds.ServicePermissions() },
	} {
		spec := ok
		mut(&spec)
		if _, err := tr.MintUser(spec); err == nil {
			t.Errorf("%s: minted", name)
		}
	}
	if creds.KindOperator.String() != "operator" || creds.KindOperator.Guarded() {
		t.Errorf("kind %s guarded=%v", creds.KindOperator, creds.KindOperator.Guarded())
	}
}
