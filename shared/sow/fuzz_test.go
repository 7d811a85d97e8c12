package sow_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/sow"
)

// FuzzParseDocument: no input panics; a refusal is INVALID_ENVELOPE; a
// document accepted once is accepted again from its canonical bytes with
// the same id, version, signed bytes and enforced clauses, and its id can
// be minted.
func FuzzParseDocument(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*.json"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"sow":"v1"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := sow.Parse(data)
		if err != nil {
			if c := errs.CodeOf(err); c != errs.InvalidEnvelope {
				t.Fatalf("refused with %s: %v", c, err)
			}
			return
		}
		canon, err := protocol.Canonical(d.Value)
		if err != nil {
			t.Fatalf("an accepted document does not canonicalise: %v", err)
		}
		again, err := sow.Parse(canon)
		if err != nil {
			t.Fatalf("accepted, then refused from its canonical bytes: %v", err)
		}
		if again.ID != d.ID || again.Version != d.Version || !slices.Equal(again.Enforced(), d.Enforced()) {
			t.Fatalf("the canonical re-read differs: %+v vs %+v", again, d)
		}
		b1, err1 := sow.SignedBytes(d.Value)
		b2, err2 := sow.SignedBytes(again.Value)
		if err1 != nil || err2 != nil || string(b1) != string(b2) {
			t.Fatalf("signed bytes differ: %v %v", err1, err2)
		}
		if _, err := sow.MintID(d.Value); err != nil {
			t.Fatalf("mint: %v", err)
		}
		_ = d.Phase(time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC))
	})
}

// FuzzVerdictAndDuration: the verdict reader and the duration grammar
// never panic, refuse only with INVALID_ENVELOPE, and an accepted verdict
// divides exactly its disputed amount.
func FuzzVerdictAndDuration(f *testing.F) {
	f.Add([]byte(`{"verdict":"v1","role":"arbiter","engagement":"e","dispute":"d","disputed":{"currency":"XCR","amount":10},
	 "split":{"provider":4,"client":6},"attribution":"a","basis":{"count":0,"ids_sha256":"ae05bca4d877cf19be01435525fd52fa9b24122d530196711993cd999967a4d8"},
	 "heard":{"provider":true,"client":false},"reasons":"r","produced_at":"2026-08-09T16:40:00Z","by":"UBMBH4BK6EIHQFVMHLSABFSQXB3JXUFZOXVZQTIERO33AD4HHAI3D7QP","signatures":[]}`), "P1DT12H")
	f.Add([]byte(`{}`), "P999999W")
	f.Fuzz(func(t *testing.T, data []byte, duration string) {
		if ms, err := sow.DurationMillis(duration); err != nil {
			if errs.CodeOf(err) != errs.InvalidEnvelope {
				t.Fatalf("duration refused with %v", err)
			}
		} else if ms <= 0 {
			t.Fatalf("%q accepted as %d ms", duration, ms)
		}
		v, err := protocol.ParseJSON(data)
		if err != nil {
			return
		}
		w, err := sow.VerdictFromValue(v, nil)
		if err != nil {
			if errs.CodeOf(err) != errs.InvalidEnvelope {
				t.Fatalf("verdict refused with %v", err)
			}
			return
		}
		if w.SplitProvider+w.SplitClient != w.Amount || w.SplitProvider < 0 || w.SplitClient < 0 {
			t.Fatalf("accepted a verdict that does not divide its amount: %+v", w)
		}
		_ = sow.VerifyVerdict(w)
	})
}
