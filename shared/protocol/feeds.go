package protocol

import (
	"encoding/json"
	"fmt"
	"strings"

	"agentmesh.dev/mesh/shared/keys"
)

// Feed subjects (upstream-notes §6.4): mesh.feed.<owner agent key>.<topic>,
// exactly four tokens, the topic one token of [A-Za-z0-9_-]{1,128}. The
// lookup subject mesh.feed.get has three tokens and so is never a feed.

// BuildFeedSubject is the subject agent publishes topic on. It refuses an
// agent that is not a user public key and a topic that is not one token:
// a dotted topic would smuggle a fifth token, a wildcard would publish to
// nothing the grant mesh.feed.<own key>.* allows, and neither is split or
// escaped.
func BuildFeedSubject(agent, topic string) (string, error) {
	if !keys.IsUserPublicKey(agent) {
		return "", fmt.Errorf("feed subject: the owner %q is not an agent public key", agent)
	}
	if !ValidToken(topic) {
		return "", fmt.Errorf("feed subject: topic %q is not one token of [A-Za-z0-9_-]{1,128}", topic)
	}
	return FeedSubject(agent, topic), nil
}

// ParseFeedSubject splits a feed subject into its owner and topic, refusing
// anything else: another family, a token count other than four, an owner
// position that is not a user public key, or a topic that is not a token.
func ParseFeedSubject(subject string) (agent, topic string, err error) {
	rest, ok := strings.CutPrefix(subject, "mesh.feed.")
	if !ok {
		return "", "", fmt.Errorf("%q is not a feed subject", subject)
	}
	agent, topic, ok = strings.Cut(rest, ".")
	if !ok || !keys.IsUserPublicKey(agent) || !ValidToken(topic) {
		return "", "", fmt.Errorf("%q is not mesh.feed.<agent key>.<topic>", subject)
	}
	return agent, topic, nil
}

// Feed kinds, carried in band in every feed publish so the platform and
// subscribers learn them from traffic: a state feed's latest value replaces
// the last, a stream feed is an ordered history.
const (
	FeedKindState  = "state"
	FeedKindStream = "stream"
)

// ValidFeedKind reports whether kind is state or stream.
func ValidFeedKind(kind string) bool { return kind == FeedKindState || kind == FeedKindStream }

// FeedPayload is the payload of a feed publish, an ordinary emit: {topic,
// kind, data}, never the {domain, event_type, data} of a domain event,
// because a feed topic is one token and is never split on dots.
type FeedPayload struct {
	Topic string          `json:"topic"`
	Kind  string          `json:"kind"`
	Data  json.RawMessage `json:"data"`
}

// NewFeedPayload builds the payload of a publish of data (any JSON value)
// on topic, refusing a topic that is not one token and a kind that is not
// state or stream.
func NewFeedPayload(topic, kind string, data any) (FeedPayload, error) {
	if !ValidToken(topic) {
		return FeedPayload{}, fmt.Errorf("feed payload: topic %q is not one token of [A-Za-z0-9_-]{1,128}", topic)
	}
	if !ValidFeedKind(kind) {
		return FeedPayload{}, fmt.Errorf("feed payload: kind %q is not %s or %s", kind, FeedKindState, FeedKindStream)
	}
	raw, err := Canonical(data)
	if err != nil {
		return FeedPayload{}, fmt.Errorf("feed payload: data: %w", err)
	}
	return FeedPayload{Topic: topic, Kind: kind, Data: raw}, nil
}
