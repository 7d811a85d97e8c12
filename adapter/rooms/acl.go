package rooms

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// The acl grade's traffic rides mesh.aclroom.<room>.> on a second
// connection, made with a short-lived credential the rooms service mints
// for members only (mesh.rooms.credential). The connection is renewed at
// two thirds of the credential's life; a refused renewal is the end of the
// membership (expelled, left, or the room reclaimed), and the connection
// stops for good. Expel also revokes the credential at the broker, which
// closes the connection at once: the next renewal, refused, says why.

// aclRetry is the pause between renewal attempts the service did not
// answer (it never refused them).
const aclRetry = 30 * time.Second

// ACLConn is one acl room's connection.
type ACLConn struct {
	c    *Client
	room Room

	mu      sync.Mutex
	nc      *nats.Conn
	expires time.Time
	renewAt time.Time
	subs    []*aclSub
	stopped error // why the connection stopped for good

	closed chan struct{} // a connection closed (the broker dropped it)
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

type aclSub struct {
	subject string
	cb      nats.MsgHandler
	sub     *nats.Subscription
}

// roomCredential is the answer of mesh.rooms.credential. The seed is a
// secret: it goes only into the connection, never into a log.
type roomCredential struct {
	JWT         string `json:"jwt"`
	Seed        string `json:"seed"`
	InboxPrefix string `json:"inbox_prefix"`
}

// ACL returns the room's acl connection, connecting it on first use.
func (c *Client) ACL(ctx context.Context, r Room) (*ACLConn, error) {
	if !r.ACL() {
		return nil, errs.Newf(errs.InputInvalid, "room %s is of the %s grade; only acl rooms use a room credential", r.RoomID, r.Privacy)
	}
	c.aclMu.Lock()
	if c.closed {
		c.aclMu.Unlock()
		return nil, errors.New("rooms: the client is closed")
	}
	if a := c.acl[r.RoomID]; a != nil {
		c.aclMu.Unlock()
		if err := a.Err(); err != nil {
			return nil, err
		}
		return a, nil
	}
	c.aclMu.Unlock()
	a := &ACLConn{c: c, room: r, closed: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if err := a.connect(ctx); err != nil {
		return nil, err
	}
	c.aclMu.Lock()
	if prev := c.acl[r.RoomID]; (prev != nil && prev.Err() == nil) || c.closed {
		c.aclMu.Unlock()
		a.closeConn()
		close(a.done)
		if c.closed {
			return nil, errors.New("rooms: the client is closed")
		}
		return prev, nil
	}
	c.acl[r.RoomID] = a
	c.aclMu.Unlock()
	go a.renewLoop()
	return a, nil
}

// dropACL closes a room's acl connection (the agent left).
func (c *Client) dropACL(roomID string) {
	c.aclMu.Lock()
	a := c.acl[roomID]
	delete(c.acl, roomID)
	c.aclMu.Unlock()
	if a != nil {
		a.Close()
	}
}

// credential asks the rooms service for a room credential.
func (a *ACLConn) credential(ctx context.Context) (roomCredential, time.Time, time.Time, error) {
	var cred roomCredential
	if err := a.c.roomCall(ctx, protocol.RoomVerbSubject("credential"), a.room, nil, &cred); err != nil {
		return cred, time.Time{}, time.Time{}, err
	}
	claims, err := jwt.DecodeUserClaims(cred.JWT)
	if err != nil || cred.Seed == "" {
		return cred, time.Time{}, time.Time{}, errs.New(errs.InvalidEnvelope, "the rooms service answered the credential request without a usable credential")
	}
	issued := time.Unix(claims.IssuedAt, 0)
	var expires, renewAt time.Time
	if claims.Expires > 0 {
		expires = time.Unix(claims.Expires, 0)
		renewAt = issued.Add(expires.Sub(issued) * 2 / 3)
	}
	return cred, expires, renewAt, nil
}

// connect gets a credential and connects with it, moving the
// subscriptions over from the connection it replaces.
func (a *ACLConn) connect(ctx context.Context) error {
	cred, expires, renewAt, err := a.credential(ctx)
	if err != nil {
		return fmt.Errorf("room credential for %s: %w", a.room.RoomID, err)
	}
	prefix := cred.InboxPrefix
	if prefix == "" {
		prefix = protocol.ACLRoomInboxPrefix(a.room.RoomID)
	}
	url := a.c.cfg.URL
	if url == "" {
		url = a.c.cfg.Conn.ConnectedUrl()
	}
	opts := append([]nats.Option{
		nats.Name("mesh-adapter acl room " + a.room.RoomID),
		nats.UserJWTAndSeed(cred.JWT, cred.Seed),
		nats.CustomInboxPrefix(prefix),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
		nats.ClosedHandler(func(*nats.Conn) {
			select {
			case a.closed <- struct{}{}:
			default:
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, s *nats.Subscription, err error) {
			a.c.log.Warn("acl room connection", "room", a.room.RoomID, "err", err)
		}),
	}, a.c.cfg.ConnectOptions...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return errs.Wrap(errs.TransportTimeout, "the room credential did not connect to the mesh", err)
	}
	a.mu.Lock()
	old := a.nc
	a.nc, a.expires, a.renewAt = nc, expires, renewAt
	for _, s := range a.subs {
		if s.sub, err = nc.Subscribe(s.subject, s.cb); err != nil {
			a.c.log.Warn("acl room: resubscribe", "room", a.room.RoomID, "subject", s.subject, "err", err)
		}
	}
	a.mu.Unlock()
	if old != nil {
		// The new connection has the subscriptions; the old one is let go
		// without its ClosedHandler counting as a drop.
		old.SetClosedHandler(nil)
		old.Close()
	}
	return nil
}

// renewLoop renews the credential at two thirds of its life, and at once
// when the broker closed the connection; it stops for good on a refusal.
func (a *ACLConn) renewLoop() {
	defer close(a.done)
	for {
		a.mu.Lock()
		renewAt := a.renewAt
		a.mu.Unlock()
		var tick <-chan time.Time
		var t *time.Timer
		if !renewAt.IsZero() {
			t = time.NewTimer(max(renewAt.Sub(a.c.cfg.Now()), 0))
			tick = t.C
		}
		select {
		case <-a.stop:
		case <-a.closed:
		case <-tick:
		}
		if t != nil {
			t.Stop()
		}
		select {
		case <-a.stop:
			return
		default:
		}
		for {
			ctx, cancel := context.WithTimeout(context.Background(), a.c.cfg.Timeout)
			err := a.connect(ctx)
			cancel()
			if err == nil {
				break
			}
			if refused(err) {
				a.halt(fmt.Errorf("room %s: the room credential was refused, so this agent's access to the room has ended: %w", a.room.RoomID, err))
				return
			}
			a.c.log.Warn("acl room: renewal failed; retrying", "room", a.room.RoomID, "err", err)
			select {
			case <-a.stop:
				return
			case <-time.After(aclRetry):
			}
		}
	}
}

// refused reports whether err is the rooms service saying no, rather than
// nobody answering.
func refused(err error) bool {
	switch errs.CodeOf(err) {
	case errs.Forbidden, errs.NotFound, errs.IdentityMismatch, errs.InputInvalid, errs.NotNamed:
		return true
	}
	return false
}

// halt stops the connection for good with why.
func (a *ACLConn) halt(why error) {
	a.mu.Lock()
	if a.stopped == nil {
		a.stopped = why
	}
	a.mu.Unlock()
	a.closeConn()
	if f := a.c.cfg.OnACLStop; f != nil {
		f(a.room.RoomID, why)
	}
}

func (a *ACLConn) closeConn() {
	a.mu.Lock()
	nc := a.nc
	a.nc = nil
	a.mu.Unlock()
	if nc != nil {
		nc.SetClosedHandler(nil)
		nc.Close()
	}
}

// Err is why the connection stopped for good (nil while it serves).
func (a *ACLConn) Err() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stopped
}

// Conn is the current connection (nil once stopped).
func (a *ACLConn) Conn() *nats.Conn {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.nc
}

// Publish publishes one room message on the acl connection and waits for
// the broker to have it.
func (a *ACLConn) Publish(ctx context.Context, subject string, data []byte) error {
	a.mu.Lock()
	nc, stopped := a.nc, a.stopped
	a.mu.Unlock()
	if stopped != nil {
		return stopped
	}
	if nc == nil {
		return errs.Newf(errs.Unavailable, "room %s: the acl connection is closed", a.room.RoomID)
	}
	if err := protocol.CheckEnvelopeSize(len(data), int(nc.MaxPayload())); err != nil {
		return err
	}
	if err := nc.Publish(subject, data); err != nil {
		return errs.Wrap(errs.TransportTimeout, "the room message was not published", err)
	}
	return flush(ctx, nc.FlushWithContext)
}

// Subscribe subscribes subject (under mesh.aclroom.<room>.>) on the acl
// connection, and again on every renewed one.
func (a *ACLConn) Subscribe(subject string, cb nats.MsgHandler) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped != nil {
		return a.stopped
	}
	s := &aclSub{subject: subject, cb: cb}
	if a.nc != nil {
		sub, err := a.nc.Subscribe(subject, cb)
		if err != nil {
			return err
		}
		s.sub = sub
	}
	a.subs = append(a.subs, s)
	return nil
}

// Close ends the connection and its renewals.
func (a *ACLConn) Close() {
	a.once.Do(func() {
		close(a.stop)
		a.closeConn()
	})
	<-a.done
}
