package daemon

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/nats-io/nats.go"
)

// A handshake the broker cut short may be its refusal of the credential
// (it closed the socket before the client read "Authorization Violation"),
// so it is put to the control plane; a dial that failed, or no server at
// all, is a mesh that is not there.
func TestCutShort(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("node: connect: %w", io.EOF), true},
		{io.ErrUnexpectedEOF, true},
		{&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true},
		{&net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}, true},
		{fmt.Errorf("node: connect: %w", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}), false},
		{fmt.Errorf("node: connect: %w", nats.ErrNoServers), false},
		{nats.ErrTimeout, false},
		{&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, false},
		{errors.New("something else"), false},
	} {
		if got := cutShort(tc.err); got != tc.want {
			t.Errorf("cutShort(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
