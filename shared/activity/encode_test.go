package activity

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// The hand-written encoding of a timeline record is byte for byte what
// encoding/json writes for it, on records of every shape and on strings
// with everything encoding/json escapes.
func TestRecordEncodingIsJSON(t *testing.T) {
	pieces := []string{"", "a", "UABC234", "request:x", "\"", "\\", "\n\r\t\b\f", "\x00\x01\x1f", "<>&", "é", "😀",
		"\u2028\u2029", "\xff", "a\xc3", "2026-11-24T20:00:00.000Z", "OFFERING_NOT_FOUND"}
	rnd := rand.New(rand.NewPCG(1, 2))
	str := func() string {
		s := ""
		for range rnd.IntN(4) {
			s += pieces[rnd.IntN(len(pieces))]
		}
		return s
	}
	item := func() Item {
		return Item{TS: str(), ObservedAt: str(), Kind: str(), Type: str(), From: str(), To: str(), ID: str(),
			InReplyTo: str(), TaskID: str(), TraceID: str(), SpanID: str(), Status: str(), Error: str()}
	}
	for range 5000 {
		r := record{Item: item()}
		if rnd.IntN(2) == 0 {
			a := item()
			r.Answer = &a
		}
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.appendJSON(nil); string(got) != string(want) {
			t.Fatalf("record %+v:\n got  %s\n want %s", r, got, want)
		}
	}
}

func FuzzRecordEncodingIsJSON(f *testing.F) {
	f.Add("2026-11-24T20:00:00.000Z", "UABC", "id-1", "completed", "\u2028<\xff")
	f.Fuzz(func(t *testing.T, ts, from, id, status, odd string) {
		r := record{Item: Item{TS: ts, Kind: KindRequest, From: from, ID: id, Status: odd},
			Answer: &Item{TS: odd, Kind: KindResponse, To: from, InReplyTo: id, Status: status}}
		want, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.appendJSON(nil); string(got) != string(want) {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
	})
}
