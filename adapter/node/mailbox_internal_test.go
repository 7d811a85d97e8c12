package node

import (
	"testing"

	"agentmesh.dev/mesh/shared/mailbox"
)

// The drain purges below a sequence only for a batch whose sequences rise
// strictly from where it fetched.
func TestAscending(t *testing.T) {
	m := func(seqs ...uint64) []mailbox.Mail {
		var out []mailbox.Mail
		for _, s := range seqs {
			out = append(out, mailbox.Mail{Seq: s})
		}
		return out
	}
	for _, tc := range []struct {
		mail  []mailbox.Mail
		after uint64
		want  bool
	}{
		{m(), 0, true},
		{m(1, 2, 5), 0, true},
		{m(6, 9), 5, true},
		{m(5, 9), 5, false},     // at or below where it fetched from
		{m(2, 2), 0, false},     // twice
		{m(3, 2), 0, false},     // out of order
		{m(7, 999999), 6, true}, // gaps are the other agents' messages
	} {
		if got := ascending(tc.mail, tc.after); got != tc.want {
			t.Errorf("ascending(%v, %d) = %v, want %v", tc.mail, tc.after, got, tc.want)
		}
	}
}
