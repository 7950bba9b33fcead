package jobkey

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
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

// A master that stays dead, with 8 producers enqueueing onto every shard
// for 5 s, costs a bounded number of CLUSTER SLOTS, not one per call; and
// its shards stay down all along, while the others take jobs.
func TestDeadNodeReloadsTheSlotMapBoundedAndKeepsItsShardsDown(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	rdb := cl.Client(t, nil)
	q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	ctx := context.Background()
	owner, err := rdb.MasterForKey(ctx, q.ks.index(0, idxReady))
	require.NoError(t, err)
	dead := owner.Options().Addr
	var deadShards []int
	for s := range q.cfg.Shards {
		m, err := rdb.MasterForKey(ctx, q.ks.index(s, idxReady))
		require.NoError(t, err)
		if m.Options().Addr == dead {
			deadShards = append(deadShards, s)
		}
	}
	var live []*redis.Client
	for _, m := range cl.Masters() {
		if m.Addr == dead {
			m.Crash()
			continue
		}
		c := redis.NewClient(&redis.Options{Addr: m.Addr})
		t.Cleanup(func() { c.Close() })
		require.NoError(t, c.ConfigResetStat(ctx).Err())
		live = append(live, c)
	}

	const run = 5 * time.Second
	stop := time.Now().Add(run)
	var ok, failed, upWhileDead atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				cctx, cancel := context.WithTimeout(ctx, time.Second)
				_, err := q.Enqueue(cctx, "t", nil, nil)
				cancel()
				if err != nil {
					failed.Add(1)
				} else {
					ok.Add(1)
				}
				for _, s := range deadShards {
					if q.down.moved(s) {
						upWhileDead.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()

	slots := 0
	for _, c := range live {
		info, err := c.Info(ctx, "commandstats").Result()
		require.NoError(t, err)
		for _, line := range strings.Split(info, "\n") {
			if rest, found := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_cluster|slots:calls="); found {
				n, _ := strconv.Atoi(rest[:strings.Index(rest, ",")])
				slots += n
			}
		}
	}
	t.Logf("dead %s shards %v: enqueued %d, failed %d, CLUSTER SLOTS %d in %s", dead, deadShards, ok.Load(), failed.Load(), slots, run)
	require.Positive(t, ok.Load(), "the live shards take jobs")
	require.Positive(t, failed.Load())
	require.LessOrEqual(t, slots, 2*int(run/reloadEvery)+4, "reloads are bounded")
	require.Zero(t, upWhileDead.Load(), "a shard of the dead node is never up")
}

// On a cluster whose nodes announce host names, a call that failed on the
// dead owner's address (which the dialer names by IP) marks its shard down.
func TestShardDownWhenTheSlotMapNamesTheNodeByHostName(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3, "--cluster-announce-hostname", "localhost", "--cluster-preferred-endpoint-type", "hostname")
	rdb := cl.Client(t, nil)
	q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	ctx := context.Background()
	key := q.ks.index(0, idxReady)
	owner, err := rdb.MasterForKey(ctx, key)
	require.NoError(t, err)
	require.Contains(t, owner.Options().Addr, "localhost:")
	_, port, err := net.SplitHostPort(owner.Options().Addr)
	require.NoError(t, err)
	for _, m := range cl.Masters() {
		if strings.HasSuffix(m.Addr, ":"+port) {
			m.Crash()
		}
	}
	err = rdb.Get(ctx, key).Err()
	require.True(t, q.unreachable(ctx, err), "%v", err)
	q.down.add(0, err)
	require.True(t, q.down.has(0), "the slot still names the node that could not be reached: %v", err)
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
