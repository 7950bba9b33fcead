package cluster

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// A shard is down after a failure on the address its slot map names, and
// not after one on an address the map no longer names (a call sent before
// the reload that found a promoted replica); either way the slot map is
// asked for, at most once per reloadEvery.
func TestShardDownOnlyWhileItsSlotNamesTheUnreachableNode(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t, nil)
	key := redistest.Prefix(t) + ":{q/0}:ready" // a key of shard 0
	d := NewDown(&HashSlots{RDB: rdb}, func(int) string { return key }, 2*time.Second, 16)
	owner, err := rdb.MasterForKey(context.Background(), key)
	require.NoError(t, err)
	addr, err := net.ResolveTCPAddr("tcp", owner.Options().Addr)
	require.NoError(t, err)
	other, err := net.ResolveTCPAddr("tcp", "127.0.0.1:1")
	require.NoError(t, err)
	refused := func(a net.Addr) error {
		return &net.OpError{Op: "dial", Net: "tcp", Addr: a, Err: errors.New("connect: connection refused")}
	}

	before := d.HashSlots.last.Load()
	d.Add(0, refused(other))
	require.False(t, d.Has(0), "the failure was on a node the slot map no longer names")
	require.Greater(t, d.HashSlots.last.Load(), before, "the slot map was asked for")

	d.Add(0, refused(addr))
	require.True(t, d.Has(0), "the slot still names the node that could not be reached")
	require.Contains(t, d.Where(0), owner.Options().Addr)

	// The slot map names another node now (as after a promotion): the
	// shard is up again at once.
	d.mu.Lock()
	d.addr[0] = "127.0.0.1:1"
	d.mu.Unlock()
	require.False(t, d.Has(0))

	// Reloads are bounded: asking again at once does not ask go-redis.
	at := d.HashSlots.last.Load()
	d.HashSlots.Reload()
	require.Equal(t, at, d.HashSlots.last.Load())
	time.Sleep(ReloadEvery)
	d.HashSlots.Reload()
	require.Greater(t, d.HashSlots.last.Load(), at)
}

func TestSameNodeComparesTheDialedIPWithTheSlotMapsAddress(t *testing.T) {
	t.Parallel()
	ip := func(s string) net.Addr { a, err := net.ResolveTCPAddr("tcp", s); require.NoError(t, err); return a }
	require.True(t, sameNode(ip("127.0.0.1:7000"), "127.0.0.1:7000"))
	require.True(t, sameNode(ip("127.0.0.1:7000"), "localhost:7000"))
	require.True(t, sameNode(ip("[::1]:7000"), "[::1]:7000"))
	require.False(t, sameNode(ip("127.0.0.1:7000"), "127.0.0.1:7001"))
	require.False(t, sameNode(ip("127.0.0.1:7000"), "localhost:7001"))
	require.False(t, sameNode(ip("127.0.0.2:7000"), "127.0.0.1:7000"))
	require.True(t, sameNode(ip("127.0.0.1:7000"), "not an address"), "in doubt, the same")
}
