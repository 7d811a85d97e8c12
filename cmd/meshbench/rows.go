package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/cmd/meshbench/internal/load"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// A row is one way of doing request-reply, set up with the load's shape:
// s.nodes connections, s.responders answering identities dealt over them
// round-robin (responder j on connection j mod nodes), and on every
// connection one calling identity. Caller goroutine g sends from
// connection g mod nodes, and its n-th request goes to responder
// (g+n) mod responders, so every responder takes an even share.
//
// Every row sends the same request, {"offering":"echo","input":{"text":…}}
// with s.size bytes of text, and gets the same answer,
// {"status":"completed","output":{"text":"ok"}}; the rows differ only in
// what carries them and what signs them.
type row interface {
	call(ctx context.Context, caller, seq int) error
	close()
}

func openRow(ctx context.Context, t *target, name string, s shape) (row, error) {
	switch name {
	case "mesh":
		return openMeshRow(ctx, t, s)
	case "signed":
		return openNATSRow(t, s, true)
	case "raw":
		return openNATSRow(t, s, false)
	case "http":
		return openHTTPRow(s)
	}
	return nil, fmt.Errorf("unknown row %q", name)
}

// requestPayload is the payload every row sends.
func requestPayload(size int) map[string]any {
	return map[string]any{"offering": "echo", "input": map[string]any{"text": strings.Repeat("x", size)}}
}

// answerPayload is the payload every row answers with.
func answerPayload() map[string]any {
	return map[string]any{"status": protocol.StateCompleted, "output": map[string]any{"text": "ok"}}
}

// rowError is a failure that has no protocol error code.
type rowError struct{ kind, msg string }

func (e *rowError) Error() string { return e.msg }

// classify names a failure: its protocol error code when it carries one
// (whatever the row: the mesh's own, or one a baseline responder answered
// with), else its kind.
func classify(err error) load.Failure {
	var e *errs.Error
	var re *rowError
	var ne net.Error
	switch {
	case errors.As(err, &e):
		return load.Failure{Code: string(e.Code)}
	case errors.As(err, &re):
		return load.Failure{Kind: re.kind}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout), errors.Is(err, os.ErrDeadlineExceeded):
		return load.Failure{Kind: "timeout"}
	case errors.Is(err, nats.ErrNoResponders):
		return load.Failure{Kind: "no_responders"}
	case errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrConnectionDraining), errors.Is(err, nats.ErrDisconnected):
		return load.Failure{Kind: "connection_closed"}
	case errors.Is(err, nats.ErrMaxPayload):
		return load.Failure{Kind: "max_payload"}
	case errors.Is(err, nats.ErrPermissionViolation):
		return load.Failure{Kind: "permission_denied"}
	case errors.Is(err, nats.ErrSlowConsumer):
		return load.Failure{Kind: "slow_consumer"}
	case errors.Is(err, syscall.ECONNREFUSED):
		return load.Failure{Kind: "connection_refused"}
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return load.Failure{Kind: "connection_reset"}
	case errors.As(err, &ne) && ne.Timeout():
		return load.Failure{Kind: "timeout"}
	}
	return load.Failure{Kind: "other"}
}

// meshRow is the mesh: meshbench's own nodes, each with a node credential
// it mints from the trust chain (as POST /v1/node-credential would), each
// hosting one calling agent and its share of the "echo" agents. A request
// is node.Agent.Request: pre-flight, sign, publish to the responder's
// inbox, the responder's receive order, its signed accept and signed
// answer, the caller's receive order on both.
type meshRow struct {
	nodes      []*node.Node
	callers    []*node.Agent
	responders []*node.Agent
	input      any
	// track, when set (a failover run), counts handlings and answers by
	// request id.
	track *requestTrack
}

func openMeshRow(ctx context.Context, t *target, s shape) (_ *meshRow, err error) {
	r := &meshRow{input: requestPayload(s.size)["input"], responders: make([]*node.Agent, s.responders)}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	echo := func(ctx context.Context, c *node.Call) error {
		if r.track != nil {
			r.track.handle(c.Env.ID)
		}
		return c.Reply(answerPayload()["output"])
	}
	for i := range s.nodes {
		nk, err := keys.Generate[keys.NodeRole]()
		if err != nil {
			return nil, err
		}
		// The calling agent first, then responders i, i+nodes, …
		agentKeys := []*keys.Agent{}
		for j := -1; j < s.responders; j++ {
			if j >= 0 && j%s.nodes != i {
				continue
			}
			ak, err := keys.Generate[keys.AgentRole]()
			if err != nil {
				return nil, err
			}
			agentKeys = append(agentKeys, ak)
		}
		ids := make([]string, len(agentKeys))
		for k, ak := range agentKeys {
			ids[k] = ak.Public()
		}
		jwtStr, err := t.trust.MintUser(creds.UserSpec{PublicKey: nk.Public(), Name: "meshbench", Kind: creds.KindNode, Hosted: ids,
			Permissions: creds.NodePermissions(ids, creds.PrivateOnly(nk.Public())), Expires: time.Now().Add(24 * time.Hour)})
		if err != nil {
			return nil, fmt.Errorf("mint a node credential: %w", err)
		}
		n, err := node.Start(ctx, node.Config{NATSURL: t.url, NodeKey: nk, Name: fmt.Sprintf("meshbench-%d", i),
			Credential: node.Credential{JWT: jwtStr, Sign: nk.SignNonce}})
		if err != nil {
			return nil, fmt.Errorf("start node %d: %w", i, err)
		}
		r.nodes = append(r.nodes, n)
		for k, ak := range agentKeys {
			name := "meshbench caller"
			if k > 0 {
				name = "meshbench echo"
			}
			a, err := n.Host(ctx, node.AgentConfig{Key: ak, Name: name, AvailabilityClass: "always_on",
				Offerings: []node.Offering{{ID: "echo", Name: "Echo"}}, Handler: echo})
			if err != nil {
				return nil, fmt.Errorf("host an agent on node %d: %w", i, err)
			}
			if k == 0 {
				r.callers = append(r.callers, a)
			} else {
				r.responders[i+(k-1)*s.nodes] = a
			}
		}
	}
	return r, nil
}

func (r *meshRow) call(ctx context.Context, g, seq int) error {
	from, to := r.callers[g%len(r.callers)], r.responders[(g+seq)%len(r.responders)]
	res, err := from.Request(ctx, to.ID(), "echo", r.input, node.RequestOptions{})
	if err != nil {
		return err
	}
	if r.track != nil {
		r.track.answer(res.RequestID)
	}
	if res.Status != protocol.StateCompleted {
		return &rowError{kind: "unexpected_status", msg: fmt.Sprintf("answered %q, not completed", res.Status)}
	}
	return nil
}

// close deregisters meshbench's agents, which also deletes their
// mailboxes, so runs against a long-lived meshd leave nothing behind.
func (r *meshRow) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, a := range append(append([]*node.Agent{}, r.callers...), r.responders...) {
		if a != nil {
			_ = a.Deregister(ctx)
		}
	}
	for _, n := range r.nodes {
		_ = n.Close()
	}
}

// natsRow is NATS request-reply through the same broker, on subjects of
// meshbench's own, with service connections (no per-subject permission
// lists to check). Unsigned, the request is the payload's JSON and the
// answer the answer's. Signed, each is a protocol envelope signed by a
// caller or responder key and verified by the other side with
// protocol.Decode, the mesh's own decoder and verifier; the responder
// checks nothing else, which makes the row the signature bound. Each
// responder answers in its subscription's callback, one request at a time,
// as a plain nats.go service does (the mesh's agent verifies requests the
// same way, one at a time in its inbox subscription).
type natsRow struct {
	conns       []*nats.Conn
	subjects    []string
	signed      bool
	body        []byte
	payload     map[string]any
	callerKeys  []*keys.Agent
	respondKeys []*keys.Agent
}

func openNATSRow(t *target, s shape, signed bool) (_ *natsRow, err error) {
	r := &natsRow{signed: signed, payload: requestPayload(s.size)}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if r.body, err = json.Marshal(r.payload); err != nil {
		return nil, err
	}
	rawAnswer, err := json.Marshal(answerPayload())
	if err != nil {
		return nil, err
	}
	kind := "raw"
	if signed {
		kind = "signed"
	}
	for i := range s.nodes {
		nc, err := t.connectService(fmt.Sprintf("meshbench-%s-%d", kind, i))
		if err != nil {
			return nil, err
		}
		r.conns = append(r.conns, nc)
		ck, err := keys.Generate[keys.AgentRole]()
		if err != nil {
			return nil, err
		}
		r.callerKeys = append(r.callerKeys, ck)
	}
	run := rand.Text() // keeps concurrent runs apart
	for j := range s.responders {
		rk, err := keys.Generate[keys.AgentRole]()
		if err != nil {
			return nil, err
		}
		r.respondKeys = append(r.respondKeys, rk)
		subject := fmt.Sprintf("meshbench.%s.%s.%d", run, kind, j)
		r.subjects = append(r.subjects, subject)
		handler := func(m *nats.Msg) { _ = m.Respond(rawAnswer) }
		if signed {
			handler = func(m *nats.Msg) { _ = m.Respond(signedAnswer(m.Data, rk)) }
		}
		nc := r.conns[j%s.nodes]
		if _, err := nc.Subscribe(subject, handler); err != nil {
			return nil, err
		}
		if err := nc.Flush(); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// signedAnswer verifies a signed request and answers it with an envelope
// signed by rk; a request that fails verification is answered with its
// error, so the caller counts it by code.
func signedAnswer(data []byte, rk *keys.Agent) []byte {
	payload := answerPayload()
	var rep *protocol.Envelope
	req, err := protocol.Decode(data)
	if err == nil {
		rep, err = protocol.NewReply(req, rk.Public(), payload)
	}
	if err != nil {
		rep, err = protocol.New(protocol.TypeRespond, rk.Public(), errs.As(err).BusPayload())
		if err != nil {
			return nil
		}
	}
	if err := rep.Sign(rk); err != nil {
		return nil
	}
	out, _ := rep.Marshal()
	return out
}

// signedRequest builds and signs the request envelope from ck to to.
func signedRequest(payload map[string]any, ck *keys.Agent, to string) (*protocol.Envelope, []byte, error) {
	req, err := protocol.New(protocol.TypeRequest, ck.Public(), payload)
	if err != nil {
		return nil, nil, err
	}
	req.To = to
	if err := req.Sign(ck); err != nil {
		return nil, nil, err
	}
	data, err := req.Marshal()
	return req, data, err
}

// checkSignedAnswer verifies an answer and checks that it is the
// responder's completed answer to req.
func checkSignedAnswer(data []byte, req *protocol.Envelope, responder string) error {
	rep, err := protocol.Decode(data)
	if err != nil {
		return err
	}
	if rep.From != responder {
		return &rowError{kind: "bad_answer", msg: "the answer is not signed by the responder"}
	}
	st := protocol.ResponseStatus(rep)
	if st == protocol.StateCompleted {
		if rep.InReplyTo != req.ID {
			return &rowError{kind: "bad_answer", msg: "the answer is not in reply to this request"}
		}
		return nil
	}
	// A refusal of a request that did not verify names no request (its id
	// was not trusted); the reply subject or the connection ties it to this one.
	if v := protocol.ErrorObject(rep); v != nil {
		return errs.FromWire(v)
	}
	return &rowError{kind: "unexpected_status", msg: fmt.Sprintf("answered %q, not completed", st)}
}

func (r *natsRow) call(ctx context.Context, g, seq int) error {
	nc, j := r.conns[g%len(r.conns)], (g+seq)%len(r.subjects)
	if !r.signed {
		msg, err := nc.RequestWithContext(ctx, r.subjects[j], r.body)
		if err != nil {
			return err
		}
		if len(msg.Data) == 0 {
			return &rowError{kind: "bad_answer", msg: "empty answer"}
		}
		return nil
	}
	responder := r.respondKeys[j].Public()
	req, data, err := signedRequest(r.payload, r.callerKeys[g%len(r.callerKeys)], responder)
	if err != nil {
		return err
	}
	msg, err := nc.RequestWithContext(ctx, r.subjects[j], data)
	if err != nil {
		return err
	}
	return checkSignedAnswer(msg.Data, req, responder)
}

func (r *natsRow) close() {
	for _, nc := range r.conns {
		nc.Close()
	}
}

// httpRow is the A2A-style alternative: each responder an HTTP server on
// a loopback port of its own, each caller connection an http.Client with
// keep-alive connections enough for every caller. The bodies are the
// signed row's envelopes, verified the same way; net/http serves each
// request on its own goroutine.
type httpRow struct {
	servers     []*http.Server
	urls        []string
	clients     []*http.Client
	payload     map[string]any
	callerKeys  []*keys.Agent
	respondKeys []*keys.Agent
}

// maxHTTPBody bounds what the HTTP row reads of a request or an answer.
const maxHTTPBody = maxSize + 64<<10

func openHTTPRow(s shape) (_ *httpRow, err error) {
	r := &httpRow{payload: requestPayload(s.size)}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	for j := range s.responders {
		rk, err := keys.Generate[keys.AgentRole]()
		if err != nil {
			return nil, err
		}
		r.respondKeys = append(r.respondKeys, rk)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			data, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxHTTPBody))
			if err != nil {
				errs.WriteHTTP(w, nil, errs.Wrap(errs.PayloadTooLarge, "the request body could not be read", err))
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(signedAnswer(data, rk))
		})}
		r.servers = append(r.servers, srv)
		r.urls = append(r.urls, fmt.Sprintf("http://%s/echo/%d", ln.Addr(), j))
		go func() { _ = srv.Serve(ln) }()
	}
	for range s.nodes {
		ck, err := keys.Generate[keys.AgentRole]()
		if err != nil {
			return nil, err
		}
		r.callerKeys = append(r.callerKeys, ck)
		// Every caller may hold a connection to every responder at once.
		r.clients = append(r.clients, &http.Client{Transport: &http.Transport{
			MaxIdleConns: s.callers * s.responders, MaxIdleConnsPerHost: s.callers, IdleConnTimeout: time.Minute}})
	}
	return r, nil
}

func (r *httpRow) call(ctx context.Context, g, seq int) error {
	j := (g + seq) % len(r.urls)
	responder := r.respondKeys[j].Public()
	env, data, err := signedRequest(r.payload, r.callerKeys[g%len(r.callerKeys)], responder)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.urls[j], bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.clients[g%len(r.clients)].Do(req)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxHTTPBody))
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var b errs.HTTPBody
		if json.Unmarshal(body, &b) == nil && b.Code != "" {
			return errs.New(b.Code, b.Error)
		}
		return &rowError{kind: fmt.Sprintf("http_%d", resp.StatusCode), msg: fmt.Sprintf("HTTP %s", resp.Status)}
	}
	return checkSignedAnswer(body, env, responder)
}

func (r *httpRow) close() {
	for _, c := range r.clients {
		c.CloseIdleConnections()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range r.servers {
		_ = srv.Shutdown(ctx)
	}
}
