package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/protocol"
)

// Mailbox limits (docs/bus.md "Mailboxes", upstream-notes §6.1).
const (
	MailboxMaxAge = 7 * 24 * time.Hour
	// MailboxMaxMsgsPerSubject bounds one agent's mailbox. JetStream limits
	// a subject by message count, not bytes, so the pinned "25 MiB per
	// subject" is approximated: at most 1,000 envelopes per inbox subject
	// (each at most the transport's 1 MiB), the oldest dropped first.
	MailboxMaxMsgsPerSubject = 1000
	MailboxAckWait           = 30 * time.Second
	MailboxMaxDeliver        = 5
)

// MailboxStreamConfig is the one configuration of the shared mailbox
// stream. Whoever creates the stream uses exactly this, so copies that
// create-or-update it concurrently never flip it back and forth.
func MailboxStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              protocol.MailboxStream,
		Description:       "offline mailboxes: every agent inbox, one durable consumer per agent",
		Subjects:          []string{protocol.InboxSubject("*"), protocol.GuardedInboxSubject("*")},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		MaxAge:            MailboxMaxAge,
		MaxMsgsPerSubject: MailboxMaxMsgsPerSubject,
		MaxMsgSize:        protocol.TransportMaxPayload,
		Storage:           jetstream.FileStorage,
		Replicas:          1,
		// No publish acks: a JetStream ack on the inbox subject would race
		// the agent's live reply to the requester (upstream §6.1).
		NoAck: true,
	}
}

// EnsureMailboxStream creates or updates the mailbox stream. Every copy
// does it at start; concurrent calls with the same config are harmless.
func EnsureMailboxStream(ctx context.Context, js jetstream.JetStream) error {
	var err error
	for range 3 {
		if _, err = js.CreateOrUpdateStream(ctx, MailboxStreamConfig()); err == nil {
			return nil
		}
		// A concurrent creator may win between our lookup and create.
		if ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("mailbox stream %s: %w", protocol.MailboxStream, err)
}

// MailboxConsumerConfig is the durable pull consumer holding agent's mail,
// filtered to its public inbox or, for an agent the admission service
// guards, to its guarded inbox.
func MailboxConsumerConfig(agent string, guarded bool) jetstream.ConsumerConfig {
	filter := protocol.InboxSubject(agent)
	if guarded {
		filter = protocol.GuardedInboxSubject(agent)
	}
	return jetstream.ConsumerConfig{
		Durable:       protocol.MailboxConsumer(agent),
		Description:   "offline mailbox of " + agent,
		FilterSubject: filter,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       MailboxAckWait,
		MaxDeliver:    MailboxMaxDeliver,
	}
}

// admissionRecord is the part of a mesh_admission entry the registry reads.
type admissionRecord struct {
	Guarded bool `json:"guarded"`
}

// guarded reports whether the admission service guards agent; no
// admission bucket or no entry means not guarded.
func (w *Worker) guarded(ctx context.Context, agent string) (bool, error) {
	kv, err := w.admission.get(ctx, w.js)
	if err != nil || kv == nil {
		return false, err
	}
	rec, found, err := bus.GetJSON[admissionRecord](ctx, kv, agent)
	if err != nil {
		return false, fmt.Errorf("kv %s: get %s: %w", AdmissionBucket, agent, err)
	}
	return found && rec.Guarded, nil
}

// ensureMailbox creates or updates agent's mailbox consumer; an existing
// consumer keeps its undelivered mail. The guard state is read again after
// the write: a guard or unguard that landed in between (the admission
// service only updates a consumer that exists) must win, so the filter is
// set until it agrees with what admission last recorded.
func (w *Worker) ensureMailbox(ctx context.Context, agent string) error {
	g, err := w.guarded(ctx, agent)
	if err != nil {
		return err
	}
	for range 4 {
		if _, err := w.js.CreateOrUpdateConsumer(ctx, protocol.MailboxStream, MailboxConsumerConfig(agent, g)); err != nil {
			return fmt.Errorf("mailbox consumer %s: %w", protocol.MailboxConsumer(agent), err)
		}
		now, err := w.guarded(ctx, agent)
		if err != nil || now == g {
			return err
		}
		g = now
	}
	return nil
}

// dropMailbox deletes agent's mailbox consumer after its record was
// removed. Should the agent have registered again in between (a new record,
// not sandbox), the consumer is put back so the fresh registration keeps
// its mailbox.
func (w *Worker) dropMailbox(ctx context.Context, agent string) error {
	err := w.js.DeleteConsumer(ctx, protocol.MailboxStream, protocol.MailboxConsumer(agent))
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("delete mailbox consumer %s: %w", protocol.MailboxConsumer(agent), err)
	}
	rec, found, gerr := bus.GetJSON[record](ctx, w.kv, agent)
	if gerr == nil && found && !rec.sandbox() {
		return w.ensureMailbox(ctx, agent)
	}
	return nil
}
