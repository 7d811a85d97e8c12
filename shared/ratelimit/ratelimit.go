// Package ratelimit is a sliding-window rate limit kept in the
// control-plane store, so that every replica of a Cloud Function counts
// against the same numbers. httpx.Limiter is its in-memory counterpart for
// limits that may be per process.
//
// A counter is one document per (limit, key) holding the count of the
// current fixed window and of the one before; the sliding count weighs the
// previous window by how much of it still overlaps (the approximation
// httpx.Limiter uses too). Document ids are hashes, so the store holds no
// address or email in the clear.
package ratelimit

import (
	"errors"
	"fmt"
	"time"

	"agentmesh.dev/mesh/shared/secret"
	"agentmesh.dev/mesh/shared/store"
)

// Limit is one rate limit to check.
type Limit struct {
	// Name names the limit in its refusal and in the counter's id, e.g.
	// "code-per-address".
	Name string
	// Key is what is counted (an address, an IP); "" for a service-wide
	// limit.
	Key    string
	Max    int
	Window time.Duration
}

// Exceeded is the refusal of one limit.
type Exceeded struct {
	Limit      Limit
	RetryAfter time.Duration
}

func (e *Exceeded) Error() string {
	return fmt.Sprintf("rate limit %s: %d per %s; retry in %s", e.Limit.Name, e.Limit.Max, e.Limit.Window, e.RetryAfter)
}

// counter is the stored state of one (limit, key).
type counter struct {
	// ID is the document's own id (ID(name, key)), so that a sweep that
	// lists the collection can delete it.
	ID    string `json:"id"`
	Start int64  `json:"start"` // Unix ms of the current fixed window
	Cur   int    `json:"cur"`
	Prev  int    `json:"prev"`
	// ExpiresAt is when the counter no longer matters (two windows after
	// Start), for whoever sweeps the collection (registrar.Service.Sweep).
	ExpiresAt int64 `json:"expires_at"`
}

// ID is the document id of a limit's counter for key.
func ID(name, key string) string { return secret.Hash("ratelimit\x00" + name + "\x00" + key) }

// Take counts one event against every limit, in tx, at now: it reads all
// the counters first and, when every limit still has room, writes each one
// incremented. When a limit is full it writes nothing and returns that
// limit's *Exceeded (the first full one, in the order given), so a refused
// request does not use up the others. Reads come before writes, so the
// caller may read more before calling Take but must not write before it.
func Take(tx store.Tx, coll string, now time.Time, limits ...Limit) error {
	cs, err := read(tx, coll, now, limits)
	if err != nil {
		return err
	}
	for i, l := range limits {
		cs[i].Cur++
		cs[i].ID = ID(l.Name, l.Key)
		if err := tx.Set(coll, cs[i].ID, cs[i]); err != nil {
			return err
		}
	}
	return nil
}

// Check reports, in tx, at now, whether every limit still has room for one
// more event, without counting one: the first full limit's *Exceeded, or
// nil. It only reads, so it may come before the reads a caller still has to
// do; a caller that counts only some outcomes (wrong codes, say) checks
// first and Takes once it knows the outcome.
func Check(tx store.Tx, coll string, now time.Time, limits ...Limit) error {
	_, err := read(tx, coll, now, limits)
	return err
}

// read loads the counters of limits rolled to now, or the first full
// limit's *Exceeded.
func read(tx store.Tx, coll string, now time.Time, limits []Limit) ([]counter, error) {
	cs := make([]counter, len(limits))
	for i, l := range limits {
		if l.Max <= 0 || l.Window <= 0 {
			return nil, fmt.Errorf("ratelimit: limit %s needs a positive max and window", l.Name)
		}
		var c counter
		if err := tx.Get(coll, ID(l.Name, l.Key), &c); err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
		c = roll(c, now, l.Window)
		elapsed := now.Sub(time.UnixMilli(c.Start))
		weight := float64(l.Window-elapsed) / float64(l.Window)
		if float64(c.Prev)*weight+float64(c.Cur) >= float64(l.Max) {
			return nil, &Exceeded{Limit: l, RetryAfter: l.Window - elapsed}
		}
		cs[i] = c
	}
	return cs, nil
}

// roll moves c to the fixed window that holds now.
func roll(c counter, now time.Time, window time.Duration) counter {
	start := now.Truncate(window)
	switch prev := time.UnixMilli(c.Start); {
	case c.Start == 0:
		c = counter{Start: start.UnixMilli()}
	case start.Equal(prev):
	case start.Sub(prev) == window:
		c = counter{Start: start.UnixMilli(), Prev: c.Cur}
	default:
		c = counter{Start: start.UnixMilli()}
	}
	c.ExpiresAt = start.Add(2 * window).UnixMilli()
	return c
}
