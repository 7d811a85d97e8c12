package rooms

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
)

// Holders of capability and sealed rooms. Membership of those grades is
// holding the signed descriptor, which the record's ingest cannot see: a
// room message carries no descriptor, and every node credential reads
// mesh.event.>, so anyone learns a room's id. The record therefore takes a
// capability or sealed room's messages only from its creator, the services
// key (the board's events) and the agents that have presented the
// descriptor to a rooms or board verb: the first such call of an agent
// writes holder.<room_id>.<agent>, which the ingest reads. (acl rooms keep
// their admit list instead.)

// HolderKey is the key that records agent as a holder of roomID's
// descriptor.
func HolderKey(roomID, agent string) string { return "holder." + roomID + "." + agent }

// Holder is the value of a holder key.
type Holder struct {
	// RoomCreatedAt is the room's CreatedAt when the descriptor was
	// presented: a key left behind by a removed room of the same id (an
	// Access racing its reclaim) names another room and counts for
	// nothing.
	RoomCreatedAt time.Time `json:"room_created_at"`
	At            time.Time `json:"at"`
}

// Gate is Access with a memory: it records each agent that presents a
// capability or sealed room's descriptor as a holder (once: a small cache
// of the holders it has written or read skips the write), and answers the
// ingest's question whether an agent did. Each copy of a worker has one;
// the keys are shared.
type Gate struct {
	kv jetstream.KeyValue
	// nc reads a holder key through the stream's leader on a cache miss, so
	// a holder recorded by another copy just before its message is seen;
	// nil reads it plainly.
	nc  *nats.Conn
	now func() time.Time

	mu    sync.Mutex
	known map[string]struct{}
}

// gateCacheSize bounds a Gate's cache; past it the cache starts over.
const gateCacheSize = 4096

// NewGate is a Gate on the rooms' bucket kv; nc (may be nil) reads through
// the leader, now (nil: time.Now) stamps the holder keys.
func NewGate(kv jetstream.KeyValue, nc *nats.Conn, now func() time.Time) *Gate {
	if now == nil {
		now = time.Now
	}
	return &Gate{kv: kv, nc: nc, now: now, known: map[string]struct{}{}}
}

// Access is the package's Access, which records the caller as a holder of
// a capability or sealed room.
func (g *Gate) Access(ctx context.Context, rawDescriptor json.RawMessage, from string) (*Descriptor, *Room, error) {
	d, room, err := access(ctx, g.kv, rawDescriptor, from, false)
	if err != nil {
		return nil, nil, err
	}
	if err := g.present(ctx, room, from); err != nil {
		return nil, nil, err
	}
	return d, room, nil
}

// needsHolder reports whether agent's messages in room need a holder key:
// not the creator's, and not in an acl room.
func needsHolder(room *Room, agent string) bool {
	return room.Privacy != GradeACL && agent != room.Creator
}

// present records agent as a holder of room, unless it needs none or is
// known. The key is created once; one there already from a removed room
// of the same id is replaced.
func (g *Gate) present(ctx context.Context, room *Room, agent string) error {
	if !needsHolder(room, agent) {
		return nil
	}
	ck := cacheKey(room, agent)
	if g.knows(ck) {
		return nil
	}
	key := HolderKey(room.ID, agent)
	b, err := json.Marshal(Holder{RoomCreatedAt: room.CreatedAt, At: g.now().UTC()})
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		_, err = g.kv.Create(ctx, key, b)
		if errors.Is(err, jetstream.ErrKeyExists) {
			var e jetstream.KeyValueEntry
			if e, err = g.kv.Get(ctx, key); err == nil {
				var h Holder
				if json.Unmarshal(e.Value(), &h) == nil && h.RoomCreatedAt.Equal(room.CreatedAt) {
					break
				}
				_, err = g.kv.Update(ctx, key, b, e.Revision())
			}
		}
		if err == nil || !bus.IsConflict(err) && !errors.Is(err, jetstream.ErrKeyNotFound) || attempt == 3 {
			break
		}
		// Written or deleted between the read and the update: read again.
	}
	if err != nil {
		return fmt.Errorf("rooms: record %s as a holder of room %s: %w", agent, room.ID, err)
	}
	g.remember(ck)
	return nil
}

// Holds reports whether agent may have its messages recorded in room as
// far as holding goes: the creator and acl rooms need no holder key;
// anyone else must have presented the room's descriptor (present).
func (g *Gate) Holds(ctx context.Context, room *Room, agent string) (bool, error) {
	if !needsHolder(room, agent) {
		return true, nil
	}
	ck := cacheKey(room, agent)
	if g.knows(ck) {
		return true, nil
	}
	key := HolderKey(room.ID, agent)
	var b []byte
	var found bool
	var err error
	if g.nc != nil {
		b, found, err = bus.LeaderGet(ctx, g.nc, Bucket, key)
	} else {
		var e jetstream.KeyValueEntry
		e, err = g.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			err = nil
		} else if err == nil {
			b, found = e.Value(), true
		}
	}
	if err != nil {
		return false, fmt.Errorf("rooms: read holder %s of room %s: %w", agent, room.ID, err)
	}
	var h Holder
	if !found || json.Unmarshal(b, &h) != nil || !h.RoomCreatedAt.Equal(room.CreatedAt) {
		return false, nil
	}
	g.remember(ck)
	return true, nil
}

// cacheKey names agent as a holder of this room: its id and creation, so a
// room removed and provisioned again under the same id is another room.
func cacheKey(room *Room, agent string) string {
	return room.ID + "/" + strconv.FormatInt(room.CreatedAt.UnixNano(), 36) + "/" + agent
}

func (g *Gate) knows(k string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.known[k]
	return ok
}

func (g *Gate) remember(k string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.known) >= gateCacheSize {
		clear(g.known)
	}
	g.known[k] = struct{}{}
}
