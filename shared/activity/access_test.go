package activity_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/activity"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// An app reads the activity and usage of its own account's agents, as the
// control plane's record of the app says, and only on a private reply;
// another signer is refused, and so is the app once its record is gone
// (revoked); the services key (the account views) reads any agent.
func TestAppsReadTheirAccountsAgentsOnly(t *testing.T) {
	app, mine, theirs, stranger := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	m := bustest.Start(t)
	h := &harness{t: t, m: m, nc: bustest.Client(t, m), caller: m.ServicesKey()}
	h.js, _ = jetstream.New(h.nc)
	// The control plane's side, on its own connection.
	mirror := &activity.AppAgentsMirror{JS: h.js}
	if n, err := mirror.Sync(t.Context(), []string{app.Public()}, fixed(map[string][]string{app.Public(): {app.Public(), mine.Public()}})); err != nil || n != 1 {
		t.Fatalf("the app's record: %d %v", n, err)
	}
	for i := range 2 {
		w, err := activity.Start(t.Context(), bustest.Env(t, m, fmt.Sprintf("activity-%d", i), nil), h.cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Stop() })
		h.workers = append(h.workers, w)
	}
	// Traffic of both accounts: stranger asks mine, and asks theirs.
	for _, to := range []*keys.Agent{mine, theirs} {
		req, _ := protocol.New(protocol.TypeRequest, stranger.Public(), map[string]any{"offering": "chat"})
		req.To = to.Public()
		_ = req.Sign(stranger)
		rep, _ := protocol.NewReply(req, to.Public(), map[string]any{"status": "completed"})
		_ = rep.Sign(to)
		b, _ := rep.Marshal()
		h.publish(protocol.OutboxSubject(to.Public()), b, 2)
	}
	// The counters are flushed every 250 ms: wait for both agents'.
	deadline := time.Now().Add(5 * time.Second)
	for len(h.usage(map[string]any{})) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("counters never written: %+v", h.usage(map[string]any{}))
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The app's own connection: replies under its private prefix.
	appNC, err := m.ConnectService("app", nats.CustomInboxPrefix(protocol.PrivateInboxPrefix(app.Public())))
	if err != nil {
		t.Fatal(err)
	}
	defer appNC.Close()
	callOn := func(nc *nats.Conn, signer *keys.Agent, subject string, q map[string]any, out any) error {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		rep, err := bus.Call(ctx, nc, signer, subject, protocol.TypeRequest, "", q)
		if err != nil {
			return err
		}
		return rep.DecodePayload(out)
	}
	asApp := func(subject string, q map[string]any, out any) error {
		return callOn(appNC, app, subject, q, out)
	}
	var l listing
	if err := asApp(protocol.SubjActivityList, map[string]any{"to": mine.Public()}, &l); err != nil || l.Total != 1 {
		t.Fatalf("the app's own agent's activity: %+v %v", l, err)
	}
	if err := asApp(protocol.SubjActivityList, map[string]any{"from": mine.Public(), "to": stranger.Public()}, &l); err != nil || l.Total != 1 || l.Items[0].Kind != activity.KindResponse {
		t.Fatalf("a peer of its own agent: %+v %v", l, err)
	}
	for _, c := range []struct {
		q    map[string]any
		code errs.Code
	}{
		{map[string]any{}, errs.InvalidQuery},
		{map[string]any{"to": theirs.Public()}, errs.Forbidden},
		{map[string]any{"from": stranger.Public()}, errs.Forbidden},
	} {
		if err := asApp(protocol.SubjActivityList, c.q, &l); errs.CodeOf(err) != c.code {
			t.Errorf("activity %v as the app: %v, want %s", c.q, err, c.code)
		}
	}

	var u struct {
		Agents []activity.Usage `json:"agents"`
	}
	if err := asApp(protocol.SubjUsageList, map[string]any{}, &u); err != nil || len(u.Agents) != 1 || u.Agents[0].Agent != mine.Public() || u.Agents[0].MessagesIn != 1 {
		t.Fatalf("the app's account's usage: %+v %v", u, err)
	}
	for _, q := range []map[string]any{{"agent": theirs.Public()}, {"agents": []any{mine.Public(), theirs.Public()}}} {
		if err := asApp(protocol.SubjUsageList, q, &u); errs.CodeOf(err) != errs.Forbidden {
			t.Errorf("usage %v as the app: %v, want FORBIDDEN", q, err)
		}
	}
	if err := asApp(protocol.SubjUsageList, map[string]any{"agents": []any{mine.Public()}}, &u); err != nil || len(u.Agents) != 1 {
		t.Errorf("usage of a named own agent: %+v %v", u, err)
	}

	// Any other signer: refused, whatever it asks.
	for _, s := range []string{protocol.SubjActivityList, protocol.SubjUsageList} {
		if err := h.callAs(stranger, s, map[string]any{"to": mine.Public()}, &l); errs.CodeOf(err) != errs.Forbidden {
			t.Errorf("%s signed by no app: %v, want FORBIDDEN", s, err)
		}
	}
	// The app's signed request replayed by another credential with its own
	// private reply prefix, or on the services' prefix: refused, since
	// the answer would go to whoever holds that prefix.
	otherNC, err := m.ConnectService("other-private", nats.CustomInboxPrefix(protocol.PrivateInboxPrefix(stranger.Public())))
	if err != nil {
		t.Fatal(err)
	}
	defer otherNC.Close()
	for name, nc := range map[string]*nats.Conn{"another key's private prefix": otherNC, "the services' prefix": h.nc} {
		for _, s := range []string{protocol.SubjActivityList, protocol.SubjUsageList} {
			if err := callOn(nc, app, s, map[string]any{"to": mine.Public(), "agent": mine.Public()}, &l); errs.CodeOf(err) != errs.InvalidRequest {
				t.Errorf("%s as the app on %s: %v, want INVALID_REQUEST", s, name, err)
			}
		}
	}
	// The services key's request on a client's private prefix: refused.
	if err := callOn(otherNC, h.caller, protocol.SubjUsageList, map[string]any{}, &l); errs.CodeOf(err) != errs.InvalidRequest {
		t.Errorf("usage signed by the services key on a private client prefix: %v, want INVALID_REQUEST", err)
	}
	// On the shared _INBOX. the app's answer would be everyone's.
	shared, err := m.ConnectService("shared-inbox", nats.CustomInboxPrefix("_INBOX"))
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := bus.Call(ctx, shared, app, protocol.SubjUsageList, protocol.TypeRequest, "", map[string]any{}); errs.CodeOf(err) != errs.InvalidRequest {
		t.Errorf("usage on the shared _INBOX.: %v, want INVALID_REQUEST", err)
	}
	// The services key reads any agent (the account views choose).
	if got := h.usage(map[string]any{"agents": []any{theirs.Public(), mine.Public()}}); len(got) != 2 ||
		!slices.IsSortedFunc(got, func(a, b activity.Usage) int { return strings.Compare(a.Agent, b.Agent) }) {
		t.Errorf("usage of two agents for the views: %+v", got)
	}
	if l := h.activity(map[string]any{"to": theirs.Public()}); l.Total != 1 {
		t.Errorf("activity for the views: %+v", l)
	}

	// Revoked: the control plane deletes the app's record, and the app is
	// any other signer.
	if n, err := mirror.Sync(t.Context(), []string{app.Public()}, fixed(nil)); err != nil || n != 1 {
		t.Fatalf("deleting the app's record: %d %v", n, err)
	}
	for _, s := range []string{protocol.SubjActivityList, protocol.SubjUsageList} {
		if err := asApp(s, map[string]any{"to": mine.Public(), "agent": mine.Public()}, &l); errs.CodeOf(err) != errs.Forbidden {
			t.Errorf("%s as the revoked app: %v, want FORBIDDEN", s, err)
		}
	}
}
