package protocol_test

import (
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/protocol"
)

const feedOwner = "UD3IZ2TLL7SK4WO7QRHMZS3IEUBPSN5XDCQOFB2XR2HG2PCMQBW2PDVF"

func TestFeedSubjectGrammar(t *testing.T) {
	for _, c := range []struct {
		agent, topic string
		ok           bool
	}{
		{feedOwner, "status", true}, {feedOwner, "open-calls_v1", true}, {feedOwner, strings.Repeat("a", 128), true},
		{feedOwner, strings.Repeat("a", 129), false}, {feedOwner, "a.b", false}, {feedOwner, "*", false}, {feedOwner, ">", false},
		{feedOwner, "", false}, {feedOwner, "bad topic", false}, {"notakey", "status", false}, {"*", "status", false},
	} {
		s, err := protocol.BuildFeedSubject(c.agent, c.topic)
		if (err == nil) != c.ok {
			t.Errorf("Build(%q, %q) = %q, %v", c.agent, c.topic, s, err)
			continue
		}
		if err != nil {
			continue
		}
		a, tp, err := protocol.ParseFeedSubject(s)
		if err != nil || a != c.agent || tp != c.topic {
			t.Errorf("Parse(%q) = %q, %q, %v", s, a, tp, err)
		}
	}
	for _, s := range []string{protocol.SubjFeedGet, "mesh.feed." + feedOwner + ".a.b", "mesh.feed." + feedOwner, "mesh.event." + feedOwner + ".x", "mesh.feed.notakey.x", ""} {
		if _, _, err := protocol.ParseFeedSubject(s); err == nil {
			t.Errorf("%q parsed as a feed subject", s)
		}
	}
}

func TestFeedPayload(t *testing.T) {
	p, err := protocol.NewFeedPayload("status", protocol.FeedKindState, map[string]any{"level": "ok"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := protocol.Canonical(p)
	if string(b) != `{"data":{"level":"ok"},"kind":"state","topic":"status"}` {
		t.Fatalf("payload %s", b)
	}
	for _, c := range [][2]string{{"a.b", "state"}, {"status", "latest"}, {"status", ""}} {
		if _, err := protocol.NewFeedPayload(c[0], c[1], 1); err == nil {
			t.Errorf("topic %q kind %q accepted", c[0], c[1])
		}
	}
}
