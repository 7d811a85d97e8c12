package protocol_test

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

func TestInputSHA256(t *testing.T) {
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		payload map[string]any
		want    string
	}{
		{"object input", map[string]any{"offering": "chat", "input": map[string]any{"text": "hi", "a": 1}}, sum(`{"a":1,"text":"hi"}`)},
		{"string input", map[string]any{"offering": "chat", "input": "hé"}, sum(`"hé"`)},
		{"no input", map[string]any{"offering": "chat"}, sum("null")},
	} {
		t.Run(c.name, func(t *testing.T) {
			env, err := protocol.New(protocol.TypeRequest, k.Public(), c.payload)
			if err != nil {
				t.Fatal(err)
			}
			if got := protocol.InputSHA256(env); got != c.want {
				t.Fatalf("built: %s, want %s", got, c.want)
			}
			// The receiver computes the same from the signed bytes.
			if err := env.Sign(k); err != nil {
				t.Fatal(err)
			}
			b, err := env.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			got, err := protocol.DefaultDecoder.Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			if d := protocol.InputSHA256(got); d != c.want {
				t.Fatalf("received: %s, want %s", d, c.want)
			}
		})
	}
}

func TestIsStreamChunk(t *testing.T) {
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	for payload, want := range map[string]bool{
		`{"status":"completed","chunk_index":3,"final":true}`: true,
		`{"status":"completed","output":{"chunk_index":3}}`:   false,
		`{"status":"completed"}`:                              false,
	} {
		env, err := protocol.New(protocol.TypeRespond, k.Public(), map[string]any{})
		if err != nil {
			t.Fatal(err)
		}
		env.Payload = []byte(payload)
		if got := protocol.IsStreamChunk(env); got != want {
			t.Errorf("%s: %v", payload, got)
		}
	}
}
