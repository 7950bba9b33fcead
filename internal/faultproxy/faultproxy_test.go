package faultproxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobkey/jobkey/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// setup starts a redis-server for t and a proxy in front of it, and returns
// the proxy and a client straight to the server, which no fault touches.
func setup(t *testing.T) (*Proxy, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t, redistest.Options{})
	p, err := Start(srv.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p, redistest.ClientFor(t, srv.URL(), nil)
}

// client connects through p with a short read timeout and no retries, so a
// partition shows as one timed-out command.
func client(t *testing.T, p *Proxy) *redis.Client {
	t.Helper()
	return redistest.ClientFor(t, "redis://"+p.Addr, func(o *redis.Options) {
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = time.Second, 300*time.Millisecond, 300*time.Millisecond
		o.MaxRetries = -1
	})
}

// rawSet is SET key v in RESP.
func rawSet(key string) string {
	return "*3\r\n$3\r\nSET\r\n$" + strconv.Itoa(len(key)) + "\r\n" + key + "\r\n$1\r\nv\r\n"
}

func requireTimeout(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	var ne net.Error
	require.True(t, errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()),
		"want a timeout, got %T %v", err, err)
	require.NotErrorIs(t, err, io.EOF)
	require.NotContains(t, err.Error(), "reset")
}

func TestPassesTraffic(t *testing.T) {
	t.Parallel()
	p, direct := setup(t)
	ctx := context.Background()
	c := client(t, p)
	require.NoError(t, c.Ping(ctx).Err())
	require.NoError(t, c.Set(ctx, "k", "v", 0).Err())
	require.Equal(t, "v", c.Get(ctx, "k").Val())
	require.Equal(t, "v", direct.Get(ctx, "k").Val())
	require.Positive(t, p.Counts().Conns)
	require.Zero(t, p.Counts().Partitions)
}

// A partition holds traffic on an open connection and on new ones: the
// client times out, it is never reset. After the partition heals, clients
// work again.
func TestPartitionTimesOutThenHeals(t *testing.T) {
	t.Parallel()
	p, direct := setup(t)
	ctx := context.Background()
	require.NoError(t, direct.Set(ctx, "k", "v", 0).Err())

	open := client(t, p)
	require.NoError(t, open.Ping(ctx).Err()) // a pooled connection, open before the partition

	p.Partition(true)
	p.Partition(true) // already on: not a second partition
	require.EqualValues(t, 1, p.Counts().Partitions)

	start := time.Now()
	requireTimeout(t, open.Get(ctx, "k").Err()) // on the open connection
	require.Less(t, time.Since(start), 2*time.Second)

	fresh := client(t, p)
	requireTimeout(t, fresh.Get(ctx, "k").Err()) // on a connection accepted during the partition

	// Set leaves the partition alone.
	p.Set(Faults{})
	requireTimeout(t, client(t, p).Ping(ctx).Err())

	p.Partition(false)
	p.Partition(false) // already off: nothing
	after := client(t, p)
	require.Equal(t, "v", after.Get(ctx, "k").Val())
	require.NoError(t, after.Set(ctx, "k2", "v2", 0).Err())
	require.Equal(t, "v2", direct.Get(ctx, "k2").Val())
	// The clients that timed out dropped their connections and dial anew.
	require.Equal(t, "v", open.Get(ctx, "k").Val())
	require.Equal(t, "v", fresh.Get(ctx, "k").Val())

	p.Partition(true)
	p.Partition(false)
	require.EqualValues(t, 2, p.Counts().Partitions)
}

// A write sent during a partition is held, not lost: it reaches the server
// after the partition heals, and its reply reaches the client if the client
// is still there. A client that closed its side during the partition still
// has its write applied (its FIN comes after its data).
func TestPartitionDeliversHeldWritesLate(t *testing.T) {
	t.Parallel()
	p, direct := setup(t)
	ctx := context.Background()

	stays, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer stays.Close()
	p.Partition(true)
	leaves, err := net.Dial("tcp", p.Addr) // accepted during the partition
	require.NoError(t, err)

	_, err = stays.Write([]byte("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"))
	require.NoError(t, err)
	_, err = leaves.Write([]byte(rawSet("g")))
	require.NoError(t, err)

	// Nothing reaches the server, nothing comes back.
	require.NoError(t, stays.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	_, err = stays.Read(make([]byte, 16))
	requireTimeout(t, err)
	require.NoError(t, leaves.Close())
	time.Sleep(100 * time.Millisecond)
	n, err := direct.Exists(ctx, "k", "g").Result()
	require.NoError(t, err)
	require.Zero(t, n, "a write went through the partition")

	p.Partition(false)
	require.Eventually(t, func() bool {
		n, err := direct.Exists(ctx, "k", "g").Result()
		return err == nil && n == 2
	}, 5*time.Second, 10*time.Millisecond, "held writes not applied after the partition healed")
	require.Equal(t, "v", direct.Get(ctx, "k").Val())

	// The reply held on the way back arrives too.
	require.NoError(t, stays.SetReadDeadline(time.Now().Add(2*time.Second)))
	line, err := bufio.NewReader(stays).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "+OK\r\n", line)
}

// KillAll during a partition resets the links and drops what they hold.
func TestPartitionKillAllDropsHeld(t *testing.T) {
	t.Parallel()
	p, direct := setup(t)
	ctx := context.Background()

	conn, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer conn.Close()
	require.Eventually(t, func() bool { return p.Counts().Conns == 1 }, 2*time.Second, 5*time.Millisecond)
	p.Partition(true)
	_, err = conn.Write([]byte(rawSet("k")))
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond)
	p.KillAll()
	require.Eventually(t, func() bool { return p.open() == 0 }, 2*time.Second, 5*time.Millisecond)
	p.Partition(false)

	require.NoError(t, conn.SetReadDeadline(time.Now().Add(2*time.Second)))
	_, err = conn.Read(make([]byte, 16))
	require.Error(t, err) // reset or EOF, not a timeout
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "got %v", err)
	time.Sleep(100 * time.Millisecond)
	require.Zero(t, direct.Exists(ctx, "k").Val())
}

func (p *Proxy) open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// proxyGoroutines counts the goroutines running the proxy's code.
func proxyGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "faultproxy.(*Proxy).pipe") || strings.Contains(g, "faultproxy.(*Proxy).accept") {
			count++
		}
	}
	return count
}

// settle polls count until it is at most want or a second has passed, and
// returns its last value. A goroutine is still on its way out for a moment
// after its deferred wg.Done, and require.Eventually cannot be used to
// count goroutines: it starts its own.
func settle(count func() int, want int) int {
	n := count()
	for deadline := time.Now().Add(time.Second); n > want && time.Now().Before(deadline); n = count() {
		time.Sleep(5 * time.Millisecond)
	}
	return n
}

// Close with a partition on returns promptly and leaves no goroutine
// behind: not for a link holding bytes both ways, not for one accepted
// during the partition, not for one whose client closed its side during
// the partition. It runs alone (no t.Parallel) because it counts every
// proxy goroutine in the process; parallel tests start after it ends.
func TestCloseDuringPartition(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	require.Zero(t, settle(proxyGoroutines, 0), "proxy goroutines of earlier tests still running")
	before := runtime.NumGoroutine()
	p, err := Start(srv.Addr)
	require.NoError(t, err)

	c := redistest.ClientFor(t, "redis://"+p.Addr, func(o *redis.Options) {
		o.ReadTimeout, o.MaxRetries, o.PoolSize = 300*time.Millisecond, -1, 4
	})
	ctx := context.Background()
	require.NoError(t, c.Ping(ctx).Err())

	held, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer held.Close()
	p.Partition(true)
	requireTimeout(t, c.Ping(ctx).Err()) // the pooled link holds a PING
	_, err = held.Write([]byte(rawSet("k")))
	require.NoError(t, err)
	gone, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	_, err = gone.Write([]byte(rawSet("g")))
	require.NoError(t, err)
	require.NoError(t, gone.Close())
	require.Eventually(t, func() bool { return p.Counts().Conns >= 3 }, 2*time.Second, 5*time.Millisecond)
	require.Positive(t, proxyGoroutines())

	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(2 * time.Second):
		t.Fatal("Close hangs during a partition")
	}
	require.Zero(t, settle(proxyGoroutines, 0), "proxy goroutines left after Close")
	require.Zero(t, p.open())
	require.NoError(t, c.Close())
	after := settle(runtime.NumGoroutine, before)
	require.LessOrEqual(t, after, before, "goroutines: %d before the proxy started, %d after Close", before, after)
}
