// Package bus is the plumbing every bus worker shares: a NATS micro
// service whose endpoints take signed envelopes in and answer with signed
// envelopes out (spec §4.3), in a queue group so several copies share the
// load; signed calls to such endpoints; compare-and-set on JetStream KV so
// copies never race; and platform events.
//
// Every envelope is decoded and verified before a handler runs (spec §5):
// a Handler only ever sees a verified request.
package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Service is one worker on the bus: its connection, its JetStream handle,
// and the key its answers are signed with.
type Service struct {
	Name string
	NC   *nats.Conn
	JS   jetstream.JetStream
	// Key signs every answer and event. All copies of all workers of one
	// mesh share the services key, whose public half clients may pin.
	Key keys.Signer
	Log *slog.Logger
	Now func() time.Time

	dec   *protocol.Decoder
	dedup *protocol.DedupMemory
	micro micro.Service

	// slots bounds the requests this copy serves at once (MaxConcurrent);
	// inflight are those being served, which Stop waits for.
	slots    chan struct{}
	mu       sync.Mutex
	stopped  bool
	inflight sync.WaitGroup
	// ctx is every handler's parent, cancelled by Stop so that handlers
	// waiting on the bus give up rather than hold the stop.
	ctx    context.Context
	cancel context.CancelFunc
}

// MaxConcurrent is how many requests one copy of a worker serves at once.
// Each is served on its own goroutine, so a handler waiting on the bus (a
// JetStream request lost while a cluster server went away waits out its
// deadline) holds one slot, not the whole endpoint, whose other requests
// would otherwise queue behind it and time out. When every slot is taken
// the endpoint waits, as it did serving one at a time.
const MaxConcurrent = 16

// Config describes a worker.
type Config struct {
	Name, Version, Description string
	NC                         *nats.Conn
	Key                        keys.Signer
	Log                        *slog.Logger
	Now                        func() time.Time
	// PublishAsyncTimeout bounds the acknowledgement of an asynchronous
	// publish on the service's JS (PublishAsyncTimeout when 0).
	PublishAsyncTimeout time.Duration
}

// PublishAsyncTimeout bounds the wait for the acknowledgement of an
// asynchronous JetStream publish (Service.JS.PublishAsync). Without it a
// publish whose acknowledgement never comes (its server taken down after
// it took the message, on a cluster losing a server) would leave its
// future unresolved for ever, and a worker that waits on its futures in
// order would wait behind it for good.
const PublishAsyncTimeout = 10 * time.Second

// QueueGroup is the queue group of a worker's endpoints: every copy of the
// worker joins it, so each request is answered by exactly one copy.
func QueueGroup(name string) string { return "mesh-" + name }

// NewService registers a micro service for a worker.
func NewService(cfg Config) (*Service, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Version == "" {
		cfg.Version = "1.0.0"
	}
	if cfg.PublishAsyncTimeout <= 0 {
		cfg.PublishAsyncTimeout = PublishAsyncTimeout
	}
	// A worker bounds its own asynchronous publishes (the activity
	// worker's ack queue); the client's cap sits above every such bound,
	// so a slow broker makes the worker wait at its own limit instead of
	// failing publishes at the client's default 4,000. Each publish's ack
	// is awaited at most PublishAsyncTimeout.
	js, err := jetstream.New(cfg.NC, jetstream.WithPublishAsyncMaxPending(MaxPublishAsyncPending),
		jetstream.WithPublishAsyncTimeout(cfg.PublishAsyncTimeout))
	if err != nil {
		return nil, fmt.Errorf("%s: jetstream: %w", cfg.Name, err)
	}
	m, err := micro.AddService(cfg.NC, micro.Config{Name: "mesh-" + cfg.Name, Version: cfg.Version,
		Description: cfg.Description, QueueGroup: QueueGroup(cfg.Name)})
	if err != nil {
		return nil, fmt.Errorf("%s: micro service: %w", cfg.Name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Service{ctx: ctx, cancel: cancel, Name: cfg.Name, NC: cfg.NC, JS: js, Key: cfg.Key, Log: cfg.Log.With("worker", cfg.Name), Now: cfg.Now,
		dec: protocol.DefaultDecoder, dedup: protocol.NewDedupMemory(0), micro: m, slots: make(chan struct{}, MaxConcurrent)}, nil
}

// Stop unsubscribes the worker's endpoints and waits for the requests
// being served.
func (s *Service) Stop() error {
	err := s.micro.Stop()
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.cancel()
	s.inflight.Wait()
	return err
}

// Request is a verified request envelope and where it arrived.
type Request struct {
	Env     *protocol.Envelope
	Subject string
	// Reply is the NATS reply subject the request named ("" for none).
	Reply string
	// Payload is the decoded payload (generic JSON value).
	Payload any
}

// PrivateReply reports whether the request's reply subject is one only
// the requester can read: a client's private prefix or the services'. An
// answer to a reply under the shared _INBOX. is readable by every
// credential holding the shared grant (docs/security.md), so what only the
// requester may see is sent on private replies alone.
func (r *Request) PrivateReply() bool {
	return strings.HasPrefix(r.Reply, protocol.PrivateInboxPrefix("")) ||
		strings.HasPrefix(r.Reply, protocol.ServiceInboxPrefix+".")
}

// Decode unmarshals the payload into dst; a payload that does not fit is
// INVALID_ENVELOPE.
func (r *Request) Decode(dst any) error {
	if err := r.Env.DecodePayload(dst); err != nil {
		return errs.Wrap(errs.InvalidEnvelope, "payload does not fit "+r.Subject, err)
	}
	return nil
}

// Object returns the payload as an object ({} when it is not one).
func (r *Request) Object() map[string]any {
	m, _ := r.Payload.(map[string]any)
	if m == nil {
		m = map[string]any{}
	}
	return m
}

// Handler serves one endpoint. It returns the reply payload (a Go value or
// decoded JSON) or an error; a protocol error (*errs.Error) is answered
// with its code, anything else as INTERNAL_ERROR.
type Handler func(ctx context.Context, r *Request) (any, error)

// Endpoint adds an endpoint on subject (wildcards allowed) to the service.
// Requests are verified first: structure, version, signature, the live
// freshness window and (from, id) dedup. A refused request is answered
// with its code when it has a reply subject, and never reaches h.
func (s *Service) Endpoint(name, subject string, h Handler) error {
	return s.micro.AddEndpoint(name, micro.HandlerFunc(func(req micro.Request) {
		s.slots <- struct{}{}
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			<-s.slots
			return
		}
		s.inflight.Add(1)
		s.mu.Unlock()
		go func() {
			defer func() {
				<-s.slots
				s.inflight.Done()
			}()
			s.serve(req, h)
		}()
	}), micro.WithEndpointSubject(subject))
}

func (s *Service) serve(req micro.Request, h Handler) {
	if r := req.Reply(); r != "" && !protocol.IsReplySubject(r) {
		// A signed answer published where the request points would be the
		// services' signature on a subject of the sender's choosing (an
		// event, a feed, an inbox): such a request is not served at all.
		s.Log.Debug("request with a reply subject outside the reply namespaces dropped", "subject", req.Subject(), "reply", r)
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	env, err := s.dec.Decode(req.Data())
	if err != nil {
		s.answerError(req, nil, errs.As(err))
		return
	}
	if err := protocol.CheckFreshness(env.TS, s.Now(), protocol.SourceLive); err != nil {
		return // stale: silent, like every receiver (upstream §5)
	}
	if s.dedup.Seen(env.From, env.ID) {
		return // a copy of a request this copy already answered
	}
	payload, err := env.PayloadValue()
	if err != nil {
		s.answerError(req, env, errs.Wrap(errs.InvalidEnvelope, "payload is not valid JSON", err))
		return
	}
	out, err := h(ctx, &Request{Env: env, Subject: req.Subject(), Reply: req.Reply(), Payload: payload})
	if err != nil {
		e := errs.As(err)
		switch {
		case e.Code == errs.InternalError && Transient(err):
			// The bus itself did not answer in time: on a cluster, a server
			// is going or a stream is electing a leader. Worth a retry.
			s.Log.Warn("handler: the bus did not answer", "subject", req.Subject(), "err", err)
			e = errs.As(errs.Wrap(errs.Unavailable, "the mesh's state could not be reached just now; retry", err))
		case e.Code == errs.InternalError:
			s.Log.Error("handler failed", "subject", req.Subject(), "err", err)
		}
		s.answerError(req, env, e)
		return
	}
	if req.Reply() == "" {
		return
	}
	reply, err := s.reply(env, out)
	if err != nil {
		s.Log.Error("reply", "subject", req.Subject(), "err", err)
		return
	}
	_ = req.Respond(reply)
}

// Transient reports whether err is the bus failing to answer rather than
// a fault of the handler or the request: a timeout, a connection between
// servers, no responder (a stream without a leader), or JetStream's own
// "unavailable" (HTTP-style code 503). On a cluster these come and go
// while a server is lost and its streams elect new leaders.
func Transient(err error) bool {
	for _, t := range []error{context.DeadlineExceeded, nats.ErrTimeout, nats.ErrNoResponders, nats.ErrConnectionClosed,
		nats.ErrConnectionReconnecting, nats.ErrDisconnected, jetstream.ErrNoStreamResponse, jetstream.ErrServerShutdown} {
		if errors.Is(err, t) {
			return true
		}
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.Code == 503
}

// RequireServices refuses, with FORBIDDEN, a request that is not signed by
// the services key (the key this worker signs with). Endpoints under
// mesh.internal.> call it first: the broker already keeps agent and guest
// credentials off that namespace, and this is defence in depth should a
// permission ever be granted too widely.
func (s *Service) RequireServices(r *Request) error {
	if r.Env.From != s.Key.Public() {
		return errs.Newf(errs.Forbidden, "only the mesh's services may call %s", r.Subject)
	}
	return nil
}

// reply signs a respond envelope to req carrying payload.
func (s *Service) reply(req *protocol.Envelope, payload any) ([]byte, error) {
	var e *protocol.Envelope
	var err error
	if req != nil {
		e, err = protocol.NewReply(req, s.Key.Public(), payload)
	} else {
		e, err = protocol.New(protocol.TypeRespond, s.Key.Public(), payload)
	}
	if err != nil {
		return nil, err
	}
	if err := e.Sign(s.Key); err != nil {
		return nil, err
	}
	return e.Marshal()
}

func (s *Service) answerError(req micro.Request, env *protocol.Envelope, e *errs.Error) {
	if req.Reply() == "" {
		return
	}
	b, err := s.reply(env, e.BusPayload())
	if err != nil {
		s.Log.Error("error reply", "err", err)
		return
	}
	_ = req.Respond(b)
}

// Emit publishes a signed platform event on mesh.event.<domain>.<event>
// with payload {domain, event_type, data} (upstream §6.4).
func (s *Service) Emit(domain, event string, data any) error {
	e, err := protocol.New(protocol.TypeEmit, s.Key.Public(), map[string]any{"domain": domain, "event_type": event, "data": data})
	if err != nil {
		return err
	}
	if err := e.Sign(s.Key); err != nil {
		return err
	}
	b, err := e.Marshal()
	if err != nil {
		return err
	}
	return s.NC.Publish(protocol.EventSubject(domain+"."+event), b)
}

// Call signs a request envelope of type typ from signer, sends it to
// subject and returns the verified answer. An answer carrying an error
// object comes back as that *errs.Error. No answer within ctx is
// TRANSPORT_TIMEOUT; nobody listening is TRANSPORT_NO_RESPONDERS.
func Call(ctx context.Context, nc *nats.Conn, signer keys.Signer, subject string, typ protocol.Type, to string, payload any) (*protocol.Envelope, error) {
	req, err := protocol.New(typ, signer.Public(), payload)
	if err != nil {
		return nil, err
	}
	req.To = to
	if err := req.Sign(signer); err != nil {
		return nil, err
	}
	data, err := req.Marshal()
	if err != nil {
		return nil, err
	}
	msg, err := nc.RequestWithContext(ctx, subject, data)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return nil, errs.Newf(errs.TransportNoResponders, "nothing answers on %s", subject)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return nil, errs.Newf(errs.TransportTimeout, "no answer on %s in time", subject)
	case err != nil:
		if strings.Contains(err.Error(), "Permissions Violation") {
			return nil, errs.Wrap(errs.TransportPermissionDenied, "this credential may not publish on "+subject, err)
		}
		return nil, errs.Wrap(errs.TransportTimeout, "request failed", err)
	}
	rep, err := protocol.Decode(msg.Data)
	if err != nil {
		return nil, err
	}
	if rep.InReplyTo != req.ID {
		return nil, errs.New(errs.InvalidEnvelope, "the answer is not in reply to the request")
	}
	if e := ErrorOf(rep); e != nil {
		return rep, e
	}
	return rep, nil
}

// ErrorOf returns the error object a respond envelope carries, if any: in
// payload.error, or as the envelope member error (protocol 0.3).
func ErrorOf(e *protocol.Envelope) *errs.Error {
	v := protocol.ErrorObject(e)
	if v == nil {
		return nil
	}
	return errs.FromWire(v)
}

// Env is what one copy of a worker is started with: its own connection, the
// services key, a logger and a clock.
type Env struct {
	NC  *nats.Conn
	Key keys.Signer
	Log *slog.Logger
	Now func() time.Time
}

// NewServiceIn registers a worker's micro service in env.
func NewServiceIn(env Env, name, description string) (*Service, error) {
	return NewService(Config{Name: name, Description: description, NC: env.NC, Key: env.Key, Log: env.Log, Now: env.Now})
}

// Caller makes signed calls to the bus workers with one key: the control
// plane's way onto the bus.
type Caller struct {
	NC  *nats.Conn
	Key keys.Signer
}

// Call signs a discover (or request) envelope to subject and returns the
// answer's payload as a generic object.
func (c *Caller) Call(ctx context.Context, subject string, typ protocol.Type, payload any) (map[string]any, error) {
	rep, err := Call(ctx, c.NC, c.Key, subject, typ, "", payload)
	if err != nil {
		return nil, err
	}
	v, err := rep.PayloadValue()
	if err != nil {
		return nil, err
	}
	m, _ := v.(map[string]any)
	return m, nil
}

// Every calls f every d until ctx ends, each call with a context that ends
// after d at most: the loop of a worker's periodic job (reaping, sweeping).
// It returns when ctx ends.
func Every(ctx context.Context, d time.Duration, f func(ctx context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fctx, cancel := context.WithTimeout(ctx, d)
			f(fctx)
			cancel()
		}
	}
}

// MaxPublishAsyncPending is the JetStream client's cap on unacknowledged
// asynchronous publishes of a worker's connection; it must stay above every
// worker's own bound (activity's ack queue).
const MaxPublishAsyncPending = 16384
