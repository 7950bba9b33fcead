package jobkey

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
	q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	owner, err := rdb.MasterForKey(context.Background(), q.ks.index(0, idxReady))
	require.NoError(t, err)
	addr, err := net.ResolveTCPAddr("tcp", owner.Options().Addr)
	require.NoError(t, err)
	other, err := net.ResolveTCPAddr("tcp", "127.0.0.1:1")
	require.NoError(t, err)
	refused := func(a net.Addr) error {
		return &net.OpError{Op: "dial", Net: "tcp", Addr: a, Err: errors.New("connect: connection refused")}
	}

	before := q.down.slots.last.Load()
	q.down.add(0, refused(other))
	require.False(t, q.down.has(0), "the failure was on a node the slot map no longer names")
	require.Greater(t, q.down.slots.last.Load(), before, "the slot map was asked for")

	q.down.add(0, refused(addr))
	require.True(t, q.down.has(0), "the slot still names the node that could not be reached")
	require.Contains(t, q.down.where(0), owner.Options().Addr)

	// The slot map names another node now (as after a promotion): the
	// shard is up again at once.
	q.down.mu.Lock()
	q.down.addr[0] = "127.0.0.1:1"
	q.down.mu.Unlock()
	require.False(t, q.down.has(0))

	// Reloads are bounded: asking again at once does not ask go-redis.
	at := q.down.slots.last.Load()
	q.down.slots.reload()
	require.Equal(t, at, q.down.slots.last.Load())
	time.Sleep(reloadEvery)
	q.down.slots.reload()
	require.Greater(t, q.down.slots.last.Load(), at)
}
