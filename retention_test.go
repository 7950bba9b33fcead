package jobkey

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A job's own Retention takes the place of the queue's: a job kept for 1s
// is gone (key, count and listing) a second after it succeeded, while the
// queue keeps its other jobs for an hour, and a job kept for 3h outlives
// them, listed and counted all along.
func TestRetentionPerJobDecidesWhenAFinishedJobGoes(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Retention: time.Hour})
	short, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "short", Retention: time.Second})
	require.NoError(t, err)
	require.Equal(t, time.Second, short.Retention)
	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "queue"})
	require.NoError(t, err)
	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "long", Retention: 3 * time.Hour})
	require.NoError(t, err)
	completing := map[string]time.Time{} // when each job's Complete was called
	for range 3 {
		c, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		require.NotNil(t, c)
		completing[c.ID] = time.Now()
		done, err := f.q.Complete(f.ctx, c, nil)
		require.NoError(t, err)
		f.requireIndexed(t, done)
	}
	// Each key's time to live is its retention, less what has passed since
	// its Complete was called (however long a loaded machine took).
	requireTTL := func(id string, retention time.Duration) {
		t.Helper()
		ttl := f.rdb.PTTL(f.ctx, f.q.Keys(id).Job).Val()
		require.LessOrEqual(t, ttl, retention, id)
		require.GreaterOrEqual(t, ttl, retention-time.Since(completing[id])-2*time.Millisecond, id)
	}
	requireTTL("short", time.Second)
	requireTTL("queue", time.Hour)
	requireTTL("long", 3*time.Hour)
	listed := func() []string {
		t.Helper()
		page, err := f.q.List(f.ctx, ListOpts{State: StateSucceeded})
		require.NoError(t, err)
		var ids []string
		for _, j := range page.Jobs {
			ids = append(ids, j.ID)
		}
		return ids
	}
	require.ElementsMatch(t, []string{"short", "queue", "long"}, listed())

	// Redis expires the short job's key by itself, on real time.
	require.Eventually(t, func() bool { return f.rdb.Exists(f.ctx, f.q.Keys("short").Job).Val() == 0 },
		5*time.Second, 20*time.Millisecond)
	_, err = f.q.Get(f.ctx, "short")
	require.ErrorIs(t, err, ErrNotFound)
	f.clock.Advance(3 * time.Second) // Redis's clock, as the queue sees it (Trim allows a second of grace)
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Succeeded, "the expired job is no longer counted")
	n, err := f.q.Trim(f.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "its entry goes with its key, the others' stay")
	require.ElementsMatch(t, []string{"queue", "long"}, listed())

	// Past the queue's hour: its own job goes, the 3h one stays listed.
	f.clock.Advance(time.Hour)
	n, err = f.q.Trim(f.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []string{"long"}, listed())
	st, err = f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Succeeded, "counted while its key lives")
	f.clock.Advance(2 * time.Hour)
	n, err = f.q.Trim(f.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "and trimmed once it is gone")
}

// Retention is the queue's Config.Retention's stand-in only: a failed job
// keeps Config.FailedRetention whatever its Retention, as asynq keeps an
// archived task.
func TestRetentionLeavesFailedJobsToFailedRetention(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Retention: time.Hour, FailedRetention: 2 * time.Hour})
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "f", Retention: time.Second})
	require.NoError(t, err)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	failed, err := f.q.Fail(f.ctx, c, errors.Join(errors.New("no"), ErrSkipRetry))
	require.NoError(t, err)
	require.Equal(t, StateFailed, failed.State)
	require.InDelta(t, 2*time.Hour, f.rdb.PTTL(f.ctx, f.q.Keys("f").Job).Val(), float64(time.Second))
	f.requireIndexed(t, failed)
}

// A job canceled while it ran keeps its key until that run's lease ends,
// however short its own Retention (lastrun.go), and stays listed as long.
func TestRetentionPerJobKeepsACanceledRunsKeyUntilItsLeaseEnds(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Retention: time.Hour, Lease: time.Minute})
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "c", Retention: time.Second})
	require.NoError(t, err)
	_, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	canceled, err := f.q.Cancel(f.ctx, "c")
	require.NoError(t, err)
	require.InDelta(t, time.Minute, f.rdb.PTTL(f.ctx, f.q.Keys("c").Job).Val(), float64(time.Second),
		"the lease's minute, not the job's second")
	f.requireIndexed(t, canceled)
	f.clock.Advance(30 * time.Second)
	n, err := f.q.Trim(f.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "listed while its key may live")
	page, err := f.q.List(f.ctx, ListOpts{State: StateCanceled})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 1)
	f.clock.Advance(time.Minute)
	n, err = f.q.Trim(f.ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// Retention is checked at enqueue (and by Update): 0 is the queue's, else
// 1s..MaxRetention, rounded up to whole milliseconds; anything else is
// ErrInvalid and writes nothing.
func TestRetentionIsChecked(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	for _, d := range []time.Duration{-time.Second, time.Millisecond, 999 * time.Millisecond, MaxRetention + time.Millisecond, 1<<63 - 1} {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "bad", Retention: d})
		require.ErrorIs(t, err, ErrInvalid, "%v", d)
	}
	require.Zero(t, f.rdb.Exists(f.ctx, f.q.Keys("bad").Job).Val(), "nothing written")
	j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{Retention: time.Second + 1500*time.Microsecond})
	require.NoError(t, err)
	require.Equal(t, time.Second+2*time.Millisecond, j.Retention, "rounded up")
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, j.Retention, got.Retention, "read back with the job")
	j, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{Retention: MaxRetention})
	require.NoError(t, err)
	require.Equal(t, MaxRetention, j.Retention)
}

// Verify agrees with the entries of jobs kept for a Retention of their
// own: their scores are what their values and the queue say.
func TestRetentionPerJobEntriesPassVerify(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Retention: time.Hour})
	for i, d := range []time.Duration{time.Second, 0, 5 * time.Hour} {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: string(rune('a' + i)), Retention: d})
		require.NoError(t, err)
		c, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		_, err = f.q.Complete(f.ctx, c, nil)
		require.NoError(t, err)
	}
	rep, err := f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings)
	// An entry put at the finish time, as if Retention were ignored, is
	// found wrong.
	require.NoError(t, f.rdb.ZAdd(f.ctx, f.q.Keys("c").Succeeded, redis.Z{Score: float64(toMillis(f.clock.Now())), Member: "c"}).Err())
	rep, err = f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Len(t, rep.Findings, 1)
	require.Equal(t, "c", rep.Findings[0].ID)
}
