package jobkey

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// Trim removes the entries of finished jobs older than their retention,
// and leaves the others.
func TestTrimRemovesOnlyExpiredEntries(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Retention: time.Hour, FailedRetention: 2 * time.Hour})
	for i := range 5 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("j%d", i)})
		require.NoError(t, err)
	}
	for i := range 5 {
		c, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		if i < 3 {
			_, err = f.q.Complete(f.ctx, c, nil)
		} else {
			_, err = f.q.Fail(f.ctx, c, fmt.Errorf("for good: %w", ErrSkipRetry))
		}
		require.NoError(t, err)
		f.clock.Advance(time.Minute)
	}
	n, err := f.q.Trim(f.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing is past its retention yet")

	f.clock.Advance(time.Hour) // past the succeeded jobs' retention, not the failed ones'
	n, err = f.q.Trim(f.ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	keys := f.q.Keys("j0")
	require.Zero(t, f.rdb.ZCard(f.ctx, keys.Succeeded).Val())
	require.EqualValues(t, 2, f.rdb.ZCard(f.ctx, keys.Failed).Val())
}

// loadChunk is how many entries one script of the trim tests loads: few
// enough that the script ends well within the client's read timeout on a
// loaded machine (a timed-out script is retried while it still runs, and
// Redis answers BUSY).
const loadChunk = 20_000

// A backlog of two million expired entries is trimmed in steps that each
// take Redis a few milliseconds, and the transaction that finishes a job
// no longer trims at all. The slow log records every
// command over 5 ms.
func TestTrimIsBounded(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--slowlog-log-slower-than", "5000", "--slowlog-max-len", "1000"}})
	rdb := redistest.ClientFor(t, srv.URL(), nil)
	ctx := context.Background()
	q, err := NewQueue(rdb, "big", &Config{Retention: time.Hour})
	require.NoError(t, err)
	key := q.Keys("any").Succeeded
	old := time.Now().Add(-48 * time.Hour).UnixMilli()
	const n = 2_000_000
	// Load the backlog with a server-side loop, 200 entries per ZADD.
	load := `for i = 0, tonumber(ARGV[1]) - 1, 200 do
		local args = {}
		for k = 0, 199 do
			args[#args+1] = tonumber(ARGV[2]) + i + k
			args[#args+1] = 'expired-' .. (tonumber(ARGV[2]) + i + k)
		end
		redis.call('zadd', KEYS[1], unpack(args))
	end
	return 1`
	for start := 0; start < n; start += loadChunk {
		require.NoError(t, rdb.Eval(ctx, load, []string{key}, loadChunk, old+int64(start)).Err())
	}
	require.EqualValues(t, n, rdb.ZCard(ctx, key).Val())
	require.NoError(t, rdb.SlowLogReset(ctx).Err())

	// A job finishes on that shard: its EXEC no longer trims the backlog.
	j, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	c, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	_, err = q.Complete(ctx, c, nil)
	require.NoError(t, err)
	require.EqualValues(t, n+1, rdb.ZCard(ctx, key).Val())

	t0 := time.Now()
	removed := 0
	for removed < n {
		got, err := q.Trim(ctx)
		require.NoError(t, err)
		require.Positive(t, got)
		removed += got
	}
	t.Logf("trimmed %d entries in %v", removed, time.Since(t0))
	require.Equal(t, n, removed)
	require.EqualValues(t, 1, rdb.ZCard(ctx, key).Val(), "the fresh entry stays")
	_, err = q.Get(ctx, j.ID)
	require.NoError(t, err)

	slow, err := rdb.SlowLogGet(ctx, 1000).Result()
	require.NoError(t, err)
	for _, s := range slow {
		t.Logf("slow: %v %v", s.Duration, s.Args[:min(4, len(s.Args))])
		require.NotEqual(t, "zremrangebyscore", strings.ToLower(fmt.Sprint(s.Args[0])), "a trim step took %v", s.Duration)
	}
}

// A trim step is bounded even when the old entries share one score. Removing
// "all of its millisecond" with ZREMRANGEBYSCORE -inf s would remove however
// many entries that is: here 1,000,000 entries of one score, in one command
// that would block Redis far past the few milliseconds the docs promise for
// any queue size. Entries share a score whenever one EXEC finishes many
// jobs, e.g. a CompleteMany, or when a tool loads them.
func TestTrimOfOneMillisecondIsBounded(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{Args: []string{"--slowlog-log-slower-than", "5000", "--slowlog-max-len", "1000"}})
	rdb := redistest.ClientFor(t, srv.URL(), nil)
	ctx := context.Background()
	q, err := NewQueue(rdb, "big", &Config{Retention: time.Hour, Logger: quietLog()})
	require.NoError(t, err)
	key := q.Keys("any").Succeeded
	old := time.Now().Add(-48 * time.Hour).UnixMilli()
	const n = 1_000_000
	load := `for i = 0, tonumber(ARGV[1]) - 1, 200 do
		local args = {}
		for k = 0, 199 do
			args[#args+1] = tonumber(ARGV[2])
			args[#args+1] = 'expired-' .. (i + k + tonumber(ARGV[3]))
		end
		redis.call('zadd', KEYS[1], unpack(args))
	end
	return 1`
	for start := 0; start < n; start += loadChunk {
		require.NoError(t, rdb.Eval(ctx, load, []string{key}, loadChunk, old, start).Err())
	}
	require.EqualValues(t, n, rdb.ZCard(ctx, key).Val())
	require.NoError(t, rdb.SlowLogReset(ctx).Err())

	got, err := q.Trim(ctx)
	require.NoError(t, err)
	t.Logf("one Trim removed %d entries", got)

	slow, err := rdb.SlowLogGet(ctx, 1000).Result()
	require.NoError(t, err)
	for _, s := range slow {
		if strings.ToLower(fmt.Sprint(s.Args[0])) == "zremrangebyscore" {
			t.Errorf("a trim step blocked Redis for %v: %v", s.Duration, s.Args)
		}
	}
}

// A job canceled while it ran keeps its key past a Retention shorter than
// the run's lease (its ID stays taken until the lease ends): Trim leaves its
// canceled entry as long as the key lives, so the job stays listed and
// Verify finds nothing amiss.
func TestTrimKeepsEntryOfCanceledRunWhileItsKeyLives(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: time.Minute, Retention: time.Second})
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "ran"})
	require.NoError(t, err)
	_, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	_, err = f.q.Cancel(f.ctx, "ran")
	require.NoError(t, err)
	f.clock.Advance(5 * time.Second) // past the retention, well inside the lease
	_, err = f.q.Trim(f.ctx)
	require.NoError(t, err)
	_, err = f.q.Get(f.ctx, "ran")
	require.NoError(t, err, "the key lives until the lease ends")
	page, err := f.q.List(f.ctx, ListOpts{State: StateCanceled})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 1, "listed as canceled while its key lives")
	rep, err := f.q.Verify(f.ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Empty(t, rep.Findings)
}
