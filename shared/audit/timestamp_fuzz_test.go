package audit

import (
	"crypto"
	"crypto/sha256"
	"math/big"
	"testing"

	"github.com/digitorus/timestamp"

	"agentmesh.dev/mesh/shared/audit/tsa"
)

// FuzzTimestampToken feeds arbitrary bytes to the two decoders of
// authority answers: responseToken (a TimeStampResp) and VerifyToken (a
// TimeStampToken). Neither may panic or hang, and a token VerifyToken
// accepts must stamp the expected message with the expected nonce.
func FuzzTimestampToken(f *testing.F) {
	a, err := tsa.New("fuzz")
	if err != nil {
		f.Fatal(err)
	}
	digest := sha256.Sum256([]byte("fuzz"))
	nonce := big.NewInt(1234567)
	for _, certs := range []bool{true, false} {
		q, err := (&timestamp.Request{HashAlgorithm: crypto.SHA256, HashedMessage: digest[:], Nonce: nonce, Certificates: certs}).Marshal()
		if err != nil {
			f.Fatal(err)
		}
		resp, err := a.Respond(q)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(resp)
		tok, err := responseToken(resp)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(tok)
	}
	f.Add([]byte{0x30, 0x80, 0x00, 0x00})
	check := TokenCheck{Digest: digest[:], Nonce: nonce, Root: a.Root()}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = responseToken(data)
		info, err := VerifyToken(data, check)
		if err != nil {
			return
		}
		ts, perr := timestamp.Parse(data)
		if info == nil || perr != nil || ts.Nonce.Cmp(nonce) != 0 || string(ts.HashedMessage) != string(digest[:]) {
			t.Fatalf("accepted a token that does not stamp the message with the nonce: %v", perr)
		}
	})
}
