package broker

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// StreamReplication is where one stream's copies stand: its configured
// replicas, its leader and each follower as the leader sees it.
type StreamReplication struct {
	Stream   string
	Replicas int
	Leader   string
	// Followers are the replicas other than the leader.
	Followers []jetstream.PeerInfo
	// Messages and LastSeq are the leader's.
	Messages, LastSeq uint64
}

// Full reports whether the stream has a leader and every one of its
// configured replicas is online and current with it.
func (s StreamReplication) Full() bool {
	if s.Leader == "" || len(s.Followers) != s.Replicas-1 {
		return false
	}
	for _, f := range s.Followers {
		if f.Offline || !f.Current || f.Lag > 0 {
			return false
		}
	}
	return true
}

func (s StreamReplication) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s R%d leader=%q", s.Stream, s.Replicas, s.Leader)
	for _, f := range s.Followers {
		fmt.Fprintf(&b, " %s(current=%t offline=%t lag=%d)", f.Name, f.Current, f.Offline, f.Lag)
	}
	return b.String()
}

// Replication lists every stream of js's account (KV buckets are streams
// named KV_<bucket>) with where its replicas stand, by stream name.
func Replication(ctx context.Context, js jetstream.JetStream) ([]StreamReplication, error) {
	var out []StreamReplication
	lister := js.ListStreams(ctx)
	for info := range lister.Info() {
		r := StreamReplication{Stream: info.Config.Name, Replicas: max(info.Config.Replicas, 1),
			Messages: info.State.Msgs, LastSeq: info.State.LastSeq}
		if ci := info.Cluster; ci != nil {
			r.Leader = ci.Leader
			for _, p := range ci.Replicas {
				if p != nil {
					r.Followers = append(r.Followers, *p)
				}
			}
		} else {
			r.Leader = "(single server)"
		}
		out = append(out, r)
	}
	if err := lister.Err(); err != nil {
		return out, fmt.Errorf("list streams: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Stream < out[j].Stream })
	return out, nil
}

// WaitReplicated polls Replication until every stream is fully replicated
// (StreamReplication.Full) and returns the last listing. When ctx ends
// first, the error names the streams still short.
func WaitReplicated(ctx context.Context, js jetstream.JetStream) ([]StreamReplication, error) {
	var last []StreamReplication
	var lastErr error
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		rs, err := Replication(rctx, js)
		cancel()
		if err == nil {
			last, lastErr = rs, nil
			short := ""
			for _, r := range rs {
				if !r.Full() {
					short += "; " + r.String()
				}
			}
			if short == "" {
				return rs, nil
			}
			lastErr = errors.New("not fully replicated: " + strings.TrimPrefix(short, "; "))
		} else {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("%w (%v)", lastErr, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// MostLeading is the member of c that leads the most of js's streams: the
// one whose loss moves the most leaders.
func MostLeading(ctx context.Context, js jetstream.JetStream, c *Cluster) (int, error) {
	rs, err := Replication(ctx, js)
	if err != nil {
		return 0, err
	}
	count := map[string]int{}
	for _, r := range rs {
		count[r.Leader]++
	}
	best, bestN := 0, -1
	for i := range c.Size() {
		if n := count[c.ServerName(i)]; n > bestN {
			best, bestN = i, n
		}
	}
	return best, nil
}
