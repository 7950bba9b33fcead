package jobkey

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/faultproxy"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Under a maxmemory-policy that may evict any key, writes are refused
// before anything is written, and said so in the log; reads still work.
// A volatile- policy only warns: pending and active jobs have no TTL.
func TestEvictionPolicyIsChecked(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		policy  string
		refused bool
	}{{"allkeys-lru", true}, {"allkeys-random", true}, {"volatile-lru", false}, {"noeviction", false}} {
		t.Run(c.policy, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory", "100mb", "--maxmemory-policy", c.policy}})
			rdb := redistest.ClientFor(t, srv.URL(), nil)
			var log bytes.Buffer
			q, err := NewQueue(rdb, "q", &Config{Logger: slog.New(slog.NewTextHandler(&log, nil))})
			require.NoError(t, err)
			ctx := context.Background()
			_, err = q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "x"})
			if !c.refused {
				require.NoError(t, err)
				if c.policy != "noeviction" {
					require.Contains(t, log.String(), "may evict finished jobs")
				}
				return
			}
			require.ErrorIs(t, err, ErrEvictionPolicy)
			require.ErrorContains(t, err, c.policy)
			require.Contains(t, log.String(), "maxmemory-policy "+c.policy)
			_, err = q.Get(ctx, "x")
			require.ErrorIs(t, err, ErrNotFound, "nothing was written, and reads still work")
			_, err = q.Claim(ctx, "w")
			require.ErrorIs(t, err, ErrEvictionPolicy)
			st, err := q.Stats(ctx)
			require.NoError(t, err)
			require.Zero(t, st.Pending)

			skip, err := NewQueue(rdb, "q", &Config{SkipEvictionCheck: true})
			require.NoError(t, err)
			_, err = skip.Enqueue(ctx, "t", nil, nil)
			require.NoError(t, err, "the check can be skipped where INFO is not allowed")
		})
	}
}

// A job whose key vanished (evicted, or deleted outside jobkey) is noticed
// by the claim that meets its entry: logged and counted.
func TestVanishedJobsAreCounted(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer
	f := setup(t, &Config{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	j, err := f.q.Enqueue(f.ctx, "t", nil, nil)
	require.NoError(t, err)
	require.NoError(t, f.rdb.Del(f.ctx, f.q.Keys(j.ID).Job).Err()) // as an eviction would
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob)
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Vanished)
	require.Zero(t, st.Pending, "the dangling entry is gone")
	require.Contains(t, log.String(), j.ID)
	require.Contains(t, log.String(), "pointed at no value")
}

// The shard count is stored with the queue: a process configured with
// another count is refused, and tools read the count from Redis.
func TestShardCountIsStored(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	_, err := LookupShards(ctx, rdb, prefix, "q")
	require.ErrorIs(t, err, ErrNotFound)
	four := queueOn(t, rdb, prefix, Config{Shards: 4})
	_, err = four.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "a"})
	require.NoError(t, err)
	n, err := LookupShards(ctx, rdb, prefix, "q")
	require.NoError(t, err)
	require.Equal(t, 4, n)

	two := queueOn(t, rdb, prefix, Config{Shards: 2})
	_, err = two.Get(ctx, "a")
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "created with 4 shards")
	_, err = two.Enqueue(ctx, "t", nil, nil)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = two.Stats(ctx)
	require.ErrorIs(t, err, ErrInvalid)

	again := queueOn(t, rdb, prefix, Config{Shards: 4})
	j, err := again.Get(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, "a", j.ID)
}

// A shard-count mismatch the server checks found stands even when the INFO
// read that follows fails with anything but NOPERM (here the command is
// renamed away, as hardened deployments do; also a timeout). Treated as
// "Redis cannot be reached", that failure would let calls through, again
// every 10s, forever: a process with the wrong shard count would write jobs
// where no other process looks.
func TestShardMismatchStandsWhenInfoFails(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--rename-command", "INFO", ""}})
	rdb := redistest.ClientFor(t, srv.URL(), nil)
	ctx := context.Background()
	four, err := NewQueue(rdb, "q", &Config{Shards: 4, Logger: quietLog(), SkipEvictionCheck: true})
	require.NoError(t, err)
	_, err = four.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)

	two, err := NewQueue(rdb, "q", &Config{Shards: 2, Logger: quietLog()})
	require.NoError(t, err)
	_, err = two.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "misplaced"})
	require.ErrorIs(t, err, ErrInvalid, "the stored count is 4; a Queue of 2 shards must be refused")
	require.NotErrorIs(t, err, ErrEvictionPolicy, "the mismatch is what is reported, whatever INFO did")
	// Without the mismatch, a server without INFO is said loudly, and writes
	// go on.
	var log bytes.Buffer
	fourAgain, err := NewQueue(rdb, "q", &Config{Shards: 4, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	require.NoError(t, err)
	_, err = fourAgain.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	require.Contains(t, log.String(), "cannot read maxmemory-policy")
}

// The server checks run again on the next call after a first call whose
// context ended (or that met Redis down), and refuse writes of a wrong shard
// count then. Skipped for checkRetry (10s), they would let a process
// configured with the wrong shard count write jobs meanwhile into shards
// nobody else reads, lost to the correctly configured processes.
func TestShardCheckRunsAgainAfterFirstCallGaveUp(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	four := queueOn(t, rdb, prefix, Config{Shards: 4, Logger: quietLog()})
	_, err := four.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)

	two := queueOn(t, rdb, prefix, Config{Shards: 2, Logger: quietLog()})
	gone, cancel := context.WithCancel(ctx)
	cancel()
	_, err = two.Get(gone, "whatever") // a first call whose caller already gave up
	require.Error(t, err)

	_, err = two.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "misplaced"})
	if err == nil {
		_, gerr := four.Get(ctx, "misplaced")
		t.Fatalf("a Queue with 2 shards enqueued into a 4-shard queue (the 4-shard queue's Get says: %v)", gerr)
	}
	require.ErrorIs(t, err, ErrInvalid)
}

// Same root cause, eviction: a first call that gave up lets writes through
// under allkeys-lru for 10s.
func TestEvictionCheckRunsAgainAfterFirstCallGaveUp(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"}})
	rdb := redistest.ClientFor(t, srv.URL(), nil)
	q, err := NewQueue(rdb, "q", &Config{Logger: quietLog()})
	require.NoError(t, err)
	ctx := context.Background()
	gone, cancel := context.WithCancel(ctx)
	cancel()
	_, _ = q.Get(gone, "x")
	_, err = q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "x"})
	require.ErrorIs(t, err, ErrEvictionPolicy, "writes under allkeys-lru must be refused")
}

// A meta key of another type (a hash here) is refused with a *WrongTypeError
// naming it, as every other key of the wrong type is. Its SET NX GET fails
// with WRONGTYPE; reported as "could not check the server; trying again
// later", it would let every call through and turn the shard-count guard off
// for good.
func TestMetaKeyOfWrongTypeIsRefused(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	q := queueOn(t, rdb, prefix, Config{Shards: 2, Logger: quietLog()})
	require.NoError(t, rdb.HSet(ctx, q.ks.metaKey(), "shards", "4").Err())
	_, err := q.Enqueue(ctx, "t", nil, nil)
	require.ErrorIs(t, err, ErrWrongType, "the meta key holds a hash")
}

// deadAddr returns a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// A Redis that cannot be reached is said to be so, with its address, as
// an *UnreachableError: not as the write of a key the caller never named.
func TestUnreachableRedisIsNamed(t *testing.T) {
	t.Parallel()
	addr := deadAddr(t)
	rdb := redis.NewClient(&redis.Options{Addr: addr, Password: "S3cret", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	q, err := NewQueue(rdb, "x", &Config{Logger: quietLog()})
	require.NoError(t, err)
	_, qerr := q.Enqueue(ctx, "t", nil, nil)
	_, lerr := LookupShards(ctx, rdb, "jobkey", "x")
	_, serr := Queues(ctx, rdb, "jobkey")
	for _, err := range []error{qerr, lerr, serr} {
		require.ErrorIs(t, err, ErrUnreachable)
		var ue *UnreachableError
		require.ErrorAs(t, err, &ue)
		require.Equal(t, addr, ue.Addr)
		require.ErrorContains(t, err, "Redis at "+addr+" could not be reached")
		require.NotContains(t, err.Error(), "meta")
		require.NotContains(t, err.Error(), "S3cret")
	}
	// The caller's own deadline is not the network's.
	gone, cancel := context.WithCancel(ctx)
	cancel()
	_, err = q.Get(gone, "a")
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ErrUnreachable)
}

// A connection that breaks in a compare-and-set's round trip 1 wrote
// nothing, and says so with a typed error: ErrUnreachable, never a bare
// EOF. One that breaks once the EXEC is sent is ErrOutcomeUnknown.
func TestBrokenConnectionsBeforeExecAreUnreachableNotBareEOF(t *testing.T) {
	t.Parallel()
	rdb, p := proxied(t)
	q := queueOn(t, rdb, redistest.Prefix(t), Config{})
	ctx := context.Background()
	_, err := q.Enqueue(ctx, "t", nil, nil) // the one-time checks, before the faults
	require.NoError(t, err)
	p.Set(faultproxy.Faults{ResetProb: 0.05})
	var unreachableN, unknownN int
	for i := range 100 {
		_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("e%d", i)})
		switch {
		case err == nil, errors.Is(err, ErrConflict):
		case errors.Is(err, ErrUnreachable):
			unreachableN++
		case errors.Is(err, ErrOutcomeUnknown):
			unknownN++
		default:
			t.Fatalf("enqueue %d: an untyped error: %v", i, err)
		}
	}
	t.Logf("unreachable %d, outcome unknown %d, resets %d", unreachableN, unknownN, p.Counts().Resets)
	require.Positive(t, p.Counts().Resets, "the proxy reset connections")
}
