package cloudsecrets

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"agentmesh.dev/mesh/shared/creds"
)

// DefaultResolverDir is where the NATS servers keep the account JWTs of
// their directory resolver. It must be on the server's persistent disk:
// the revocations the control plane pushes live there, and the preloaded
// JWTs replace a stored one only when they are newer. The servers of
// terraform/ mount their data disk at /data (terraform/nats-startup.sh).
const DefaultResolverDir = "/data/jwt"

// ServerConfig is the NATS server configuration fragment of the trust
// chain t, which every server of the cluster includes at boot: the operator
// JWT inline, the system account, the directory ("full") resolver at dir
// with deletion refused (an account JWT is never removed, only revoked in),
// and the system and mesh account JWTs preloaded so a fresh server trusts
// them before the first update arrives. Everything else (listen addresses,
// cluster routes, JetStream) is the including file's.
func ServerConfig(t *creds.Trust, dir, meshName string) ([]byte, error) {
	op, err := t.OperatorJWT()
	if err != nil {
		return nil, err
	}
	sys, err := t.SystemAccountJWT()
	if err != nil {
		return nil, err
	}
	mesh, err := t.MeshAccountJWT()
	if err != nil {
		return nil, err
	}
	pk := t.PublicKeys()
	var b bytes.Buffer
	fmt.Fprintf(&b, "# NATS trust of the mesh %s, written by `meshd cloud init` (docs/secrets.md).\n", strconv.Quote(meshName))
	fmt.Fprintf(&b, "# Include it from each server's configuration; it holds no seed.\n")
	fmt.Fprintf(&b, "operator: %s\n", strconv.Quote(op))
	fmt.Fprintf(&b, "system_account: %s\n", pk.SystemAccount)
	fmt.Fprintf(&b, "resolver: {\n  type: full\n  dir: %s\n  allow_delete: false\n  interval: \"2s\"\n}\n", strconv.Quote(dir))
	fmt.Fprintf(&b, "resolver_preload: {\n  %s: %s\n  %s: %s\n}\n", pk.SystemAccount, strconv.Quote(sys), pk.MeshAccount, strconv.Quote(mesh))
	return b.Bytes(), nil
}

var operatorLine = regexp.MustCompile(`(?m)^operator:\s*"([^"]+)"\s*$`)

// configOperator is the operator public key a fragment written by
// ServerConfig names.
func configOperator(data []byte) (string, error) {
	m := operatorLine.FindSubmatch(data)
	if m == nil {
		return "", fmt.Errorf("it has no inline operator JWT")
	}
	oc, err := jwt.DecodeOperatorClaims(string(m[1]))
	if err != nil {
		return "", fmt.Errorf("its operator JWT: %w", err)
	}
	if !nkeys.IsValidPublicOperatorKey(oc.Subject) {
		return "", fmt.Errorf("its operator JWT is for %q, not an operator key", oc.Subject)
	}
	return oc.Subject, nil
}
