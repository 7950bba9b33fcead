package cluster

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobkey/jobkey/internal/expiring"
	"github.com/redis/go-redis/v9"
)

// Package cluster keeps a queue's view of a Redis Cluster's hash slots:
// the bounded reload of go-redis's hash slot map, and the shards whose node
// could not be reached.
//
// On a cluster, go-redis learns that a hash slot changed owner from a MOVED or
// ASK reply, or from its own reload every ClusterStateReloadInterval (a
// minute by default). A master that died sends no MOVED: until the hash slot map
// is reloaded, every call of its shards goes to its dead address, long after
// the cluster promoted a replica. So a shard whose node cannot be reached
// has the hash slot map reloaded at once, and again while the shard stays down,
// at most once per ReloadEvery; and the shard is down only while its hash slot
// still names the address that could not be reached.

// ReloadEvery bounds how often a Queue asks for the hash slot map while nodes
// are unreachable: an outage costs a CLUSTER SLOTS of a live node now and
// then, not one per call. go-redis runs at most one reload at a time.
const ReloadEvery = 250 * time.Millisecond

// HashSlots asks a ClusterClient to reload its hash slot map, bounded.
type HashSlots struct {
	RDB  *redis.ClusterClient // nil on a single Redis
	last atomic.Int64         // when a reload was last asked for (unix ns)
}

// Reload asks for the hash slot map unless it was asked for within ReloadEvery.
// It returns at once: go-redis reloads in the background.
func (m *HashSlots) Reload() {
	if m.RDB == nil {
		return
	}
	now := time.Now().UnixNano()
	if last := m.last.Load(); now-last < int64(ReloadEvery) || !m.last.CompareAndSwap(last, now) {
		return
	}
	m.RDB.ReloadState(context.Background())
}

// Master returns the address the client's hash slot map gives for key's hash slot
// now, or "" when it has none. It does no I/O once the map is loaded.
func (m *HashSlots) Master(key string) string {
	if m.RDB == nil {
		return ""
	}
	c, err := m.RDB.MasterForKey(context.Background(), key)
	if err != nil {
		return ""
	}
	return c.Options().Addr
}

// Down are the shards whose node could not be reached lately: claims
// leave them out, and enqueues of their jobs fail at once, for the ttl, or
// until the hash slot map names another node for them (a replica promoted).
type Down struct {
	set       expiring.Set[int]
	HashSlots *HashSlots
	key       func(s int) string // a key of shard s, for its hash slot

	mu   sync.Mutex
	addr map[int]string // the address that could not be reached, per shard
}

// NewDown returns an empty set of shards down for ttl each, at most max of
// them. key names a key of a shard, for its hash slot.
func NewDown(slots *HashSlots, key func(int) string, ttl time.Duration, max int) *Down {
	return &Down{set: expiring.Set[int]{TTL: ttl, Max: max}, HashSlots: slots, key: key, addr: map[int]string{}}
}

// Add marks shard s down after err, and asks for the hash slot map: its node
// may have been replaced already. A call that failed on an address the hash slot
// map no longer gives for s (it was sent before a reload that found a
// promoted replica) marks nothing: the shard's owner now is another node.
func (d *Down) Add(s int, err error) {
	addr := d.HashSlots.Master(d.key(s))
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Addr != nil && addr != "" && !sameNode(oe.Addr, addr) {
		d.HashSlots.Reload()
		return
	}
	d.mu.Lock()
	d.addr[s] = addr
	d.mu.Unlock()
	d.set.Add(s)
	d.HashSlots.Reload()
}

// Has reports whether shard s is down: marked within the ttl, and its hash slot
// still owned by the address that could not be reached. While it is, the
// hash slot map is asked for again (bounded by ReloadEvery).
func (d *Down) Has(s int) bool {
	if !d.set.Has(s) {
		return false
	}
	if d.Moved(s) {
		d.set.Remove(s)
		return false
	}
	d.HashSlots.Reload()
	return true
}

// Moved reports whether the hash slot map names, for shard s, another node than
// the one that could not be reached when s was last marked down.
func (d *Down) Moved(s int) bool {
	d.mu.Lock()
	was, ok := d.addr[s]
	d.mu.Unlock()
	if !ok || was == "" {
		return false
	}
	now := d.HashSlots.Master(d.key(s))
	return now != "" && now != was
}

// Where names the node shard s could not reach, for messages.
func (d *Down) Where(s int) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if a := d.addr[s]; a != "" {
		return " at " + a
	}
	return ""
}

// sameNode reports whether sent, the address a failed call was sent to as
// the dialer names it (an IP), is addr, the hash slot map's, which may name a
// host (cluster-preferred-endpoint-type hostname). When in doubt it says
// yes: the shard is then marked down, and up again once the map moves.
func sameNode(sent net.Addr, addr string) bool {
	s := sent.String()
	if s == addr {
		return true
	}
	sentHost, sentPort, err1 := net.SplitHostPort(s)
	host, port, err2 := net.SplitHostPort(addr)
	if err1 != nil || err2 != nil {
		return true
	}
	if sentPort != port {
		return false
	}
	sentIP := net.ParseIP(sentHost)
	if ip := net.ParseIP(host); ip != nil || sentIP == nil {
		return ip.Equal(sentIP) || sentIP == nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIP(ctx, "ip", host)
	if err != nil {
		return true
	}
	for _, ip := range ips {
		if ip.Equal(sentIP) {
			return true
		}
	}
	return false
}
