package engagement

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/commerce"
)

// ErrConflict is a compare-and-set lost to another writer.
var ErrConflict = errors.New("engagement: terms changed under the write")

// Terms is where the terms of every formed engagement are mirrored for the
// seller's node to read at admission (commerce.Bucket on the bus). Every
// write is a compare-and-set against the revision read.
type Terms interface {
	// Get returns the value under key and its revision (0 and nil when
	// absent).
	Get(ctx context.Context, key string) ([]byte, uint64, error)
	// Put writes value under key if its revision is still rev (0: absent);
	// ErrConflict otherwise.
	Put(ctx context.Context, key string, value []byte, rev uint64) error
	// Delete removes key if its revision is still rev; ErrConflict
	// otherwise.
	Delete(ctx context.Context, key string, rev uint64) error
}

// BusTerms is Terms on the bus: commerce.Bucket, made with
// commerce.BucketConfig when no worker has made it yet (as
// activity.AppAgentsMirror does for its bucket).
type BusTerms struct {
	JS       jetstream.JetStream
	Replicas int

	mu sync.Mutex
	kv jetstream.KeyValue
}

func (b *BusTerms) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.kv != nil {
		return b.kv, nil
	}
	kv, err := b.JS.KeyValue(ctx, commerce.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = b.JS.CreateKeyValue(ctx, commerce.BucketConfig(b.Replicas))
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = b.JS.KeyValue(ctx, commerce.Bucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kv bucket %s: %w", commerce.Bucket, err)
	}
	b.kv = kv
	return kv, nil
}

// Get reads key.
func (b *BusTerms) Get(ctx context.Context, key string) ([]byte, uint64, error) {
	kv, err := b.bucket(ctx)
	if err != nil {
		return nil, 0, err
	}
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("kv %s: get %s: %w", commerce.Bucket, key, err)
	}
	return e.Value(), e.Revision(), nil
}

// Put writes key by compare-and-set.
func (b *BusTerms) Put(ctx context.Context, key string, value []byte, rev uint64) error {
	kv, err := b.bucket(ctx)
	if err != nil {
		return err
	}
	if rev == 0 {
		// Create also takes a key whose last message is a deletion.
		_, err = kv.Create(ctx, key, value)
	} else {
		_, err = kv.Update(ctx, key, value, rev)
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return ErrConflict
	case err != nil:
		return fmt.Errorf("kv %s: put %s: %w", commerce.Bucket, key, err)
	}
	return nil
}

// Delete removes key by compare-and-set.
func (b *BusTerms) Delete(ctx context.Context, key string, rev uint64) error {
	kv, err := b.bucket(ctx)
	if err != nil {
		return err
	}
	err = kv.Delete(ctx, key, jetstream.LastRevision(rev))
	switch {
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return ErrConflict
	case err != nil:
		return fmt.Errorf("kv %s: delete %s: %w", commerce.Bucket, key, err)
	}
	return nil
}
