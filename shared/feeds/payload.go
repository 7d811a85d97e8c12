package feeds

import (
	"encoding/json"
	"fmt"

	"agentmesh.dev/mesh/shared/protocol"
)

// PayloadOf reads the feed payload of a verified emit published on topic:
// the payload's topic must be the subject's, its kind state or stream, and
// data present (null is a value; absent is not).
func PayloadOf(env *protocol.Envelope, topic string) (protocol.FeedPayload, error) {
	var p struct {
		Topic *string         `json:"topic"`
		Kind  *string         `json:"kind"`
		Data  json.RawMessage `json:"data"`
	}
	if err := env.DecodePayload(&p); err != nil {
		return protocol.FeedPayload{}, fmt.Errorf("feed payload: %w", err)
	}
	switch {
	case p.Topic == nil || *p.Topic != topic:
		return protocol.FeedPayload{}, fmt.Errorf("feed payload: topic does not match the subject's %q", topic)
	case p.Kind == nil || !protocol.ValidFeedKind(*p.Kind):
		return protocol.FeedPayload{}, fmt.Errorf("feed payload: kind must be %s or %s", KindState, KindStream)
	case p.Data == nil:
		return protocol.FeedPayload{}, fmt.Errorf("feed payload: data is required")
	}
	return protocol.FeedPayload{Topic: *p.Topic, Kind: *p.Kind, Data: p.Data}, nil
}

// LookupRequest is the payload of mesh.feed.get for a feed's current
// value: the feed's owner and topic, nothing else.
func LookupRequest(agent, topic string) map[string]any {
	return map[string]any{"agent": agent, "topic": topic}
}

// LookupAnswer is the answer to a current-value lookup: {found: true,
// envelope: <the stored emit, as stored>} or {found: false, envelope: null}.
func LookupAnswer(found bool, stored []byte) map[string]any {
	if !found {
		return map[string]any{"found": false, "envelope": nil}
	}
	return map[string]any{"found": true, "envelope": json.RawMessage(stored)}
}
