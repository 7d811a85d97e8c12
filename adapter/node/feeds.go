package node

import (
	"strings"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// Feed kinds (bus.md "Feeds").
const (
	FeedState  = protocol.FeedKindState  // replaces the last value; the feeds worker keeps the latest
	FeedStream = protocol.FeedKindStream // ordered history
)

// PublishFeed emits on the agent's own feed mesh.feed.<agent>.<topic> a
// signed emit {topic, kind, data}. topic is one subject token.
func (a *Agent) PublishFeed(topic, kind string, data any) error {
	subject, err := protocol.BuildFeedSubject(a.id, topic)
	if err != nil {
		return errs.Newf(errs.InvalidRequest, "feed topic %q must be one token of letters, digits, _ or -", topic)
	}
	if !protocol.ValidFeedKind(kind) {
		return errs.Newf(errs.InvalidRequest, "feed kind %q is not state or stream", kind)
	}
	return a.emit(subject, map[string]any{"topic": topic, "kind": kind, "data": data})
}

// Emit publishes a domain event on mesh.event.<topic>, where topic is
// "<domain>.<event_type>": a signed emit {domain, event_type, data}.
func (a *Agent) Emit(topic string, data any) error {
	domain, event, ok := strings.Cut(topic, ".")
	if !ok || !protocol.ValidToken(domain) {
		return errs.Newf(errs.InvalidRequest, "event topic %q must be <domain>.<event_type>", topic)
	}
	for _, t := range strings.Split(event, ".") {
		if !protocol.ValidToken(t) {
			return errs.Newf(errs.InvalidRequest, "event topic %q must be <domain>.<event_type>", topic)
		}
	}
	return a.emit(protocol.EventSubject(topic), map[string]any{"domain": domain, "event_type": event, "data": data})
}

func (a *Agent) emit(subject string, payload map[string]any) error {
	e, err := protocol.New(protocol.TypeEmit, a.id, payload)
	if err != nil {
		return errs.Wrap(errs.InvalidRequest, "the event cannot be encoded", err)
	}
	if err := e.Sign(a.key); err != nil {
		return err
	}
	b, err := e.Marshal()
	if err != nil {
		return err
	}
	if err := protocol.CheckEnvelopeSize(len(b), a.n.maxPayload()); err != nil {
		return err
	}
	return a.n.publish(subject, b)
}
