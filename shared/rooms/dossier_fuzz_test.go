package rooms_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"testing"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/rooms"
)

// signedDossier builds a valid dossier offline, signed by signer.
func signedDossier(t testing.TB, signer keys.Signer) []byte {
	t.Helper()
	data := []byte("bytes of the output")
	sum := sha256.Sum256(data)
	files := []rooms.DossierFile{{DriveFile: rooms.DriveFile{Ref: "r1", Name: "out.txt", Version: "1", Digest: "sha256:" + hex.EncodeToString(sum[:]),
		Size: int64(len(data)), AttachedBy: signer.Public(), AttachedAt: "2026-07-27T15:00:00.000Z", Role: rooms.RoleOutput},
		DataB64: base64.StdEncoding.EncodeToString(data)}}
	record := []rooms.DossierEntry{{Seq: 3, TS: "2026-07-27T15:00:00.000Z", From: signer.Public(), Type: "say", Body: json.RawMessage(`"hi"`)}}
	hash := func(v any) string {
		b, err := protocol.Canonical(v)
		if err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256(b)
		return hex.EncodeToString(s[:])
	}
	m := rooms.DossierManifest{Format: rooms.DossierFormat, RoomID: "r", Creator: signer.Public(), Operator: "ana@example.org",
		CreatedAt: "2026-07-27T15:00:00.000Z", Why: rooms.WhyExport, Capture: rooms.DurableRecord("r"), Entries: 1,
		EntriesSHA256: hash(record), Files: 1, Outputs: 1, FilesSHA256: hash([]rooms.DriveFile{files[0].DriveFile}), SignerPub: signer.Public()}
	var err error
	if m.Sig, err = protocol.SignObject(rooms.DossierFormat, m, signer, protocol.Base64URL); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(rooms.Dossier{Manifest: m, Record: record, Files: files})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestVerifyDossierOffline(t *testing.T) {
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	good := signedDossier(t, k)
	if err := rooms.VerifyDossier(good); err != nil {
		t.Fatalf("a well-made dossier: %v\n%s", err, good)
	}
	for _, bad := range []string{``, `null`, `[]`, `{}`, `{"manifest":{},"record":[],"files":[]}`, `{"manifest":null,"record":null,"files":null}`} {
		if rooms.VerifyDossier([]byte(bad)) == nil {
			t.Fatalf("%q verifies", bad)
		}
	}
}

// VerifyDossier reads untrusted bytes: it never panics, and whatever it
// accepts is a dossier whose manifest names a signer.
func FuzzVerifyDossier(f *testing.F) {
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(signedDossier(f, k))
	f.Add([]byte(`{"manifest":{"format":"agentmesh-room-dossier-v1"},"record":[],"files":[{"data_b64":"!!"}]}`))
	f.Add([]byte(`{"manifest":{},"record":[1e400],"files":{}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if rooms.VerifyDossier(b) != nil {
			return
		}
		var d struct {
			Manifest struct {
				SignerPub string `json:"signer_pub"`
			} `json:"manifest"`
		}
		if err := json.Unmarshal(b, &d); err != nil || !keys.IsUserPublicKey(d.Manifest.SignerPub) {
			t.Fatalf("accepted a dossier without a signer: %s", b)
		}
	})
}
