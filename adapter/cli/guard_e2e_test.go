package cli_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/admission"
)

// guardRecord reads the admission service's record of agent.
func (w *world) guardRecord(js jetstream.JetStream, agent string) admission.Record {
	w.t.Helper()
	kv, err := js.KeyValue(w.t.Context(), admission.Bucket)
	if err != nil {
		w.t.Fatal(err)
	}
	e, err := kv.Get(w.t.Context(), agent)
	if err != nil {
		w.t.Fatalf("admission record of %s: %v", agent, err)
	}
	var r admission.Record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		w.t.Fatal(err)
	}
	return r
}

func (w *world) status(state string) map[string]any {
	w.t.Helper()
	var st map[string]any
	if err := json.Unmarshal([]byte(w.must(state, "status", "--json")), &st); err != nil {
		w.t.Fatal(err)
	}
	return st
}

// From the command line: guard submits the signed contacts roster to the
// admission service, which then guards the inbox (a contact's message
// still arrives, relayed); status shows it, also after a restart; unguard
// withdraws it. Neither works without the running adapter.
func TestGuardAndUnguardFromTheCLI(t *testing.T) {
	w := newWorld(t)
	a, b := w.state("a"), w.state("b")
	pa, idA := w.start(a, "up", w.agentKey("keeper"))
	_, idB := w.start(b, "up", w.agentKey("friend"))

	// B becomes A's contact: A answers B's message.
	wait := w.background(b, "send", idA, "hello keeper", "--wait", "30")
	m := w.waitInbox(a, "hello keeper")
	w.must(a, "reply", fmt.Sprint(m["seq"]), "hello friend")
	if r := <-wait; r[2] != "0" {
		t.Fatalf("send: %v", r)
	}
	if st := w.status(a); st["running"] != true || st["guarded"] != false || st["agent_id"] != idA {
		t.Fatalf("status before guard: %v", st)
	}

	var res map[string]any
	if err := json.Unmarshal([]byte(w.must(a, "guard", "--json")), &res); err != nil {
		t.Fatal(err)
	}
	if res["guarded"] != true || res["contacts"] != 1.0 || res["agent_id"] != idA {
		t.Fatalf("guard: %v", res)
	}
	nc, err := w.m.ConnectService("test-guard")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	rec := w.guardRecord(js, idA)
	if !rec.Guarded || rec.OwnerKey != res["owner_key"] || !strings.Contains(string(rec.Roster), idB) {
		t.Fatalf("the admission service's record: %+v", rec)
	}
	if st := w.status(a); st["guarded"] != true {
		t.Fatalf("status after guard: %v", st)
	}
	// The contact's message is relayed to the guarded inbox.
	wait = w.background(b, "send", idA, "still there?", "--wait", "2")
	w.waitInbox(a, "still there?")
	<-wait

	// A restarted adapter comes back guarded.
	pa.stop()
	if st := w.status(a); st["running"] != false || st["guarded"] != true {
		t.Fatalf("status of a stopped, guarded adapter: %v", st)
	}
	if _, errOut, code := w.run(a, "unguard"); code == 0 || !strings.Contains(errOut, "no inbox-mode adapter running") {
		t.Fatalf("unguard without the adapter: %d %s", code, errOut)
	}
	pa, _ = w.start(a, "start", "--inbox", "--name", "keeper")
	if st := w.status(a); st["running"] != true || st["guarded"] != true {
		t.Fatalf("status after a restart: %v", st)
	}
	wait = w.background(b, "send", idA, "after the restart", "--wait", "2")
	w.waitInbox(a, "after the restart")
	<-wait

	out := w.must(a, "unguard")
	if !strings.Contains(out, "no longer guarded") {
		t.Fatalf("unguard: %q", out)
	}
	if rec := w.guardRecord(js, idA); rec.Guarded {
		t.Fatalf("the admission service still guards: %+v", rec)
	}
	if st := w.status(a); st["guarded"] != false {
		t.Fatalf("status after unguard: %v", st)
	}
	wait = w.background(b, "send", idA, "unguarded now", "--wait", "2")
	w.waitInbox(a, "unguarded now")
	<-wait
	text := w.must(a, "status")
	if !strings.Contains(text, "guarded:  no") || !strings.Contains(text, "running:  yes") {
		t.Errorf("status text: %q", text)
	}
	pa.stop()
	// Guard needs the running adapter too.
	if _, errOut, code := w.run(a, "guard"); code == 0 || !strings.Contains(errOut, "no inbox-mode adapter running") {
		t.Fatalf("guard without the adapter: %d %s", code, errOut)
	}
}
