package rooms

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Requester sends a pairwise request and waits for its answer: the hosted
// agent (*node.Agent), through which invites go.
type Requester interface {
	Request(ctx context.Context, to, offering string, input any, opts node.RequestOptions) (*node.Result, error)
}

// Config is what New needs.
type Config struct {
	// Conn is the node's connection; Key the agent key every call and room
	// message is signed with.
	Conn *nats.Conn
	Key  *keys.Agent
	// Agent sends invites (the hosted agent); nil refuses Invite.
	Agent Requester
	// Store remembers the rooms held; required.
	Store *Store
	// Handle is the agent's handle, told in its join messages.
	Handle string
	// ServicesKey, when set, refuses answers signed by any other key.
	ServicesKey string
	// URL is the broker the acl second connection dials (default: the
	// server Conn is connected to); ConnectOptions are added to it (TLS).
	URL            string
	ConnectOptions []nats.Option
	// OnACLStop is told when an acl room's connection stops for good: the
	// rooms service refused to renew its credential (expelled, left,
	// reclaimed).
	OnACLStop func(roomID string, why error)
	// Timeout bounds one call (30 s).
	Timeout time.Duration
	Now     func() time.Time
	Log     *slog.Logger
}

// DefaultTimeout bounds one call to a rooms or board verb, and an invite.
const DefaultTimeout = 30 * time.Second

// Client is one agent's rooms and board client. It is safe for concurrent
// use; Close ends its acl connections.
type Client struct {
	cfg Config
	log *slog.Logger

	aclMu  sync.Mutex
	acl    map[string]*ACLConn
	closed bool

	// presented are the rooms this process has presented the descriptor
	// of (present): once per process, so a room joined before, or one
	// provisioned again under the same id (its holders forgotten), is
	// presented before its first message here.
	presented sync.Map
}

// New makes a client.
func New(cfg Config) (*Client, error) {
	switch {
	case cfg.Conn == nil:
		return nil, errors.New("rooms: Config.Conn is required")
	case cfg.Key == nil:
		return nil, errors.New("rooms: Config.Key is required")
	case cfg.Store == nil:
		return nil, errors.New("rooms: Config.Store is required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Client{cfg: cfg, log: cfg.Log, acl: map[string]*ACLConn{}}, nil
}

// AgentID is the agent this client speaks for.
func (c *Client) AgentID() string { return c.cfg.Key.Public() }

// Store is the client's store of held rooms.
func (c *Client) Store() *Store { return c.cfg.Store }

// Close ends every acl connection.
func (c *Client) Close() {
	c.aclMu.Lock()
	conns := make([]*ACLConn, 0, len(c.acl))
	for _, a := range c.acl {
		conns = append(conns, a)
	}
	c.acl, c.closed = map[string]*ACLConn{}, true
	c.aclMu.Unlock()
	for _, a := range conns {
		a.Close()
	}
}

// call signs a request from the agent to subject, and decodes the answer's
// payload into out (nil: discard). A refusal comes back as its
// *errs.Error; nothing answering means this mesh runs no such service.
func (c *Client) call(ctx context.Context, subject string, payload, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	rep, err := bus.Call(ctx, c.cfg.Conn, c.cfg.Key, subject, protocol.TypeRequest, "", payload)
	if errs.CodeOf(err) == errs.TransportNoResponders {
		return errs.Newf(errs.TransportNoResponders, "nothing answers on %s: this mesh runs no %s service", subject, serviceOf(subject))
	}
	if err != nil {
		return err
	}
	if pin := c.cfg.ServicesKey; pin != "" && rep.From != pin {
		return errs.Newf(errs.IdentityMismatch, "the answer on %s is signed by %s, not the mesh's services key", subject, rep.From)
	}
	if out == nil {
		return nil
	}
	if err := rep.DecodePayload(out); err != nil {
		return errs.Wrap(errs.InvalidEnvelope, "the answer on "+subject+" does not have the expected shape", err)
	}
	return nil
}

// serviceOf names the service behind a verb subject, for people.
func serviceOf(subject string) string {
	switch {
	case strings.HasPrefix(subject, "mesh.board."):
		return "work board"
	case strings.HasPrefix(subject, "mesh.artifacts."):
		return "artifacts"
	}
	return "rooms"
}

// roomCall is a call naming a room: the payload carries its descriptor.
func (c *Client) roomCall(ctx context.Context, subject string, r Room, extra map[string]any, out any) error {
	p := map[string]any{"descriptor": json.RawMessage(r.Raw)}
	for k, v := range extra {
		p[k] = v
	}
	return c.call(ctx, subject, p, out)
}

// durable refuses, before anything is sent, a verb that needs the mesh's
// record of an ephemeral room.
func durable(r Room, what string) error {
	if !r.Durable() {
		return errs.Newf(errs.InputInvalid, "room %s is ephemeral: the mesh keeps no %s for it (create the room without --ephemeral)", r.RoomID, what)
	}
	return nil
}

// room resolves a held room.
func (c *Client) room(ref string) (Held, Room, error) {
	h, err := c.cfg.Store.Get(ref)
	if err != nil {
		return Held{}, Room{}, err
	}
	r, err := h.Room()
	if err != nil {
		return Held{}, Room{}, fmt.Errorf("the descriptor kept for room %s no longer verifies: %w", h.RoomID, err)
	}
	return h, r, nil
}

// Lookup finds a held room by id, name or token.
func (c *Client) Lookup(ref string) (Held, error) {
	h, _, err := c.room(ref)
	return h, err
}
