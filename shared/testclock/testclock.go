// Package testclock is the clock tests move forward: real time plus an
// offset, so what expires in the code under test (codes, sessions, leases,
// passkey checks) can be made to expire without waiting, while everything
// that keeps real time (the broker) is unaffected.
package testclock

import (
	"sync"
	"time"
)

// Clock is real time plus an offset. The zero Clock is real time.
type Clock struct {
	mu  sync.Mutex
	off time.Duration
}

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
}
