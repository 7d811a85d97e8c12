// Package control is the running adapter's local control socket: the
// short commands (inbox, reply, ack, send) talk to the long-lived adapter
// through it. One connection carries one JSON request and one JSON answer.
// The socket lives in the private state directory and is itself 0600, so
// only the adapter's owner reaches it.
package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"syscall"
	"time"
)

// ErrNotRunning means no adapter answers on the socket.
var ErrNotRunning = errors.New("no inbox-mode adapter running: start one with `mesh-adapter start --inbox --name <name>` (or `mesh-adapter up <agent-key>`)")

// Request is one command.
type Request struct {
	Op string `json:"op"` // status | inbox | reply | refuse | ack | send | contacts | guard | unguard | room | registration | commerce | credits
	// inbox
	All bool `json:"all,omitempty"`
	// reply, refuse, ack
	Ref  string   `json:"ref,omitempty"`
	Refs []string `json:"refs,omitempty"`
	Text string   `json:"text,omitempty"`
	// refuse
	Estimate string `json:"estimate,omitempty"`
	// send; registration: the agent whose registry record to read
	To          string  `json:"to,omitempty"`
	WaitSeconds float64 `json:"wait_seconds,omitempty"`
	// AcceptNewBinding accepts a handle's new agent (send
	// --accept-new-binding).
	AcceptNewBinding bool `json:"accept_new_binding,omitempty"`
	// WaitHeld waits for the answer to a message the recipient holds for
	// a person (send with an explicit --wait).
	WaitHeld bool `json:"wait_held,omitempty"`
	// RegistrarURL resolves a handle instead of the running adapter's own
	// registrar (send --registrar-url, MESH_REGISTRAR_URL).
	RegistrarURL string `json:"registrar_url,omitempty"`
	// guard: the owner-signed admission roster to submit (null keeps the
	// one the admission service holds).
	Roster json.RawMessage `json:"roster,omitempty"`
	// Room is a rooms or board command (adapter/rooms.Command), run by
	// the running adapter's rooms client.
	Room json.RawMessage `json:"room,omitempty"`
	// Commerce is an agreements command (daemon.CommerceCommand): agree,
	// revoke, list, run with the running adapter's owner key.
	Commerce json.RawMessage `json:"commerce,omitempty"`
}

// Answer is the reply to a Request: OK with a result, or an error message.
type Answer struct {
	OK     bool            `json:"ok"`
	Error  string          `json:"error,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
}

// Handler executes one request.
type Handler func(ctx context.Context, r Request) (any, error)

// maxRequest bounds a request (a reply text included).
const maxRequest = 4 << 20

// Listen opens the socket at path, replacing a stale one left by a crash;
// it refuses when another adapter is already answering there.
func Listen(path string) (net.Listener, error) {
	if c, err := net.DialTimeout("unix", path, 500*time.Millisecond); err == nil {
		_ = c.Close()
		return nil, fmt.Errorf("an adapter is already running with this state directory (%s answers)", path)
	}
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	return l, nil
}

// Serve answers connections on l with h until ctx ends. The listener is
// closed (and its socket file removed) when Serve returns.
func Serve(ctx context.Context, l net.Listener, h Handler, log *slog.Logger) error {
	go func() {
		<-ctx.Done()
		_ = l.Close()
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("control socket: %w", err)
		}
		go serveConn(ctx, c, h, log)
	}
}

func serveConn(ctx context.Context, c net.Conn, h Handler, log *slog.Logger) {
	defer c.Close()
	var req Request
	if err := json.NewDecoder(io.LimitReader(c, maxRequest)).Decode(&req); err != nil {
		writeAnswer(c, Answer{Error: "the request is not JSON: " + err.Error()})
		return
	}
	res, err := h(ctx, req)
	if err != nil {
		writeAnswer(c, Answer{Error: err.Error()})
		return
	}
	b, err := json.Marshal(res)
	if err != nil {
		log.Warn("control: answer", "op", req.Op, "err", err)
		writeAnswer(c, Answer{Error: "internal error: " + err.Error()})
		return
	}
	writeAnswer(c, Answer{OK: true, Result: b})
}

func writeAnswer(c net.Conn, a Answer) {
	_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_ = json.NewEncoder(c).Encode(a)
}

// Call sends r to the adapter at path and decodes the result into out
// (which may be nil). It waits at most timeout for the answer.
func Call(path string, r Request, out any, timeout time.Duration) error {
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			return ErrNotRunning
		}
		return fmt.Errorf("control socket %s: %w", path, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if err := json.NewEncoder(c).Encode(r); err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	var a Answer
	if err := json.NewDecoder(c).Decode(&a); err != nil {
		return fmt.Errorf("control socket: no answer from the adapter: %w", err)
	}
	if !a.OK {
		return errors.New(a.Error)
	}
	if out != nil && len(a.Result) > 0 {
		return json.Unmarshal(a.Result, out)
	}
	return nil
}
