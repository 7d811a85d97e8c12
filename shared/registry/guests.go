package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/protocol"
)

// GuestsBucket is the guest roster: one key per live guest lease, the
// guest's public key, written by the control plane's guest service before
// it hands the credential out and removed once the lease has ended and its
// credential is revoked. The registry files as sandbox every registration
// whose agent or vouching node is a key in it, so what makes a guest
// sandbox is what the control plane issued, never what the sender says or
// which register subject it chose. Clients cannot read or write it: every
// client credential denies $KV.> and $JS.> both ways, and the workers' reads
// come back under the services' reply prefix, which no client subscribes
// or publishes to.
const GuestsBucket = "mesh_guests"

// GuestRecordSlack is how much longer than its credential a guest's record
// lives when nobody removes it: it covers a control-plane clock ahead of the
// broker's, which judges the credential's expiry.
const GuestRecordSlack = time.Hour

// guestMarkerTTL is how long the bucket keeps the marker of a removed or
// expired record. Markers only keep a watcher informed; nobody watches.
const guestMarkerTTL = time.Minute

// guestsConfig is the one configuration of GuestsBucket, with replicas
// (bus.Replicas): every registry copy binds the bucket with it, creating it
// or raising its replicas; the control plane creates it with it when it is
// missing and otherwise binds it as it is, so it never lowers what the
// registry set. Per-key TTLs (LimitMarkerTTL enables them) let each record
// expire with its own credential. It has the registry's replicas, so a
// cluster that loses one server still judges registrations; reads go to
// the stream's leader (isGuest), so they see every acknowledged write.
func guestsConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: GuestsBucket, LimitMarkerTTL: guestMarkerTTL, Replicas: bus.Replicas(replicas),
		Description: "live guest keys, written by the control plane, read by the registry"}
}

// guestRecord is the value stored under a guest key. The registry reads
// only whether the key exists; the expiry is for whoever looks.
type guestRecord struct {
	CredentialExpiresAt string `json:"credential_expires_at"`
}

// isGuest reports whether any of keys is a live guest key. It reads the
// bucket every time (no cache) and from the stream's leader
// (bus.LeaderGet), so every copy decides on what the control plane wrote
// last even on a replicated bucket, whose followers may answer a direct
// get before they have the newest record. A failed read is an error,
// never a "no".
func isGuest(ctx context.Context, nc *nats.Conn, keys ...string) (bool, error) {
	for i, k := range keys {
		if k == "" || (i > 0 && k == keys[i-1]) {
			continue
		}
		_, found, err := bus.LeaderGet(ctx, nc, GuestsBucket, k)
		if err != nil {
			return false, err
		}
		if found {
			return true, nil
		}
	}
	return false, nil
}

// GuestRoster is the control plane's side of GuestsBucket (the guest
// service's guest.Roster): it records a leased key and removes it again.
// It binds the bucket at its first use.
type GuestRoster struct {
	JS jetstream.JetStream
	// Replicas of the bucket when this roster is the first to make it
	// (bus.Replicas; the registry raises them to its own).
	Replicas int
	// Timeout bounds each call (10 s when zero).
	Timeout time.Duration

	mu sync.Mutex
	kv jetstream.KeyValue
}

func (r *GuestRoster) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.kv != nil {
		return r.kv, nil
	}
	// Bound as it is when it exists: the registry's copies set its
	// replicas, and a control plane configured with fewer must not lower
	// them.
	kv, err := r.JS.KeyValue(ctx, GuestsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = r.JS.CreateKeyValue(ctx, guestsConfig(r.Replicas))
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = r.JS.KeyValue(ctx, GuestsBucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kv bucket %s: %w", GuestsBucket, err)
	}
	r.kv = kv
	return kv, nil
}

func (r *GuestRoster) timeout(ctx context.Context) (context.Context, context.CancelFunc) {
	d := r.Timeout
	if d <= 0 {
		d = 10 * time.Second
	}
	return context.WithTimeout(ctx, d)
}

// Record stores key as a live guest whose credential expires at expires:
// the record lives until then plus GuestRecordSlack, measured from now on
// this host's clock, as the broker measures the credential's expiry. It
// returns once the broker has stored it. Recording a key again (a retry
// after an answer that was lost) is not an error.
func (r *GuestRoster) Record(ctx context.Context, key string, expires time.Time) error {
	ctx, cancel := r.timeout(ctx)
	defer cancel()
	kv, err := r.bucket(ctx)
	if err != nil {
		return err
	}
	ttl := max(time.Until(expires), 0) + GuestRecordSlack
	v, err := json.Marshal(guestRecord{CredentialExpiresAt: protocol.FormatTime(expires)})
	if err != nil {
		return err
	}
	_, err = kv.Create(ctx, key, v, jetstream.KeyTTL(ttl))
	if err != nil && !bus.IsConflict(err) { // already recorded
		return fmt.Errorf("kv %s: record guest: %w", GuestsBucket, err)
	}
	return nil
}

// Forget removes keys from the roster: their leases are over and their
// credentials revoked. Removing a key that is not there is not an error.
func (r *GuestRoster) Forget(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	ctx, cancel := r.timeout(ctx)
	defer cancel()
	kv, err := r.bucket(ctx)
	if err != nil {
		return err
	}
	var errList []error
	for _, k := range keys {
		if err := kv.Purge(ctx, k, jetstream.PurgeTTL(guestMarkerTTL)); err != nil {
			errList = append(errList, fmt.Errorf("kv %s: forget guest: %w", GuestsBucket, err))
		}
	}
	return errors.Join(errList...)
}
