package jobkey

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A job whose ID sits in two indexes (a stray entry) is handed out once by
// one claim batch, and the stray entry is put right (issue 9, item 6).
func TestClaimManyHandsOutEachJobOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "twice"})
	require.NoError(t, err)
	keys := f.q.Keys(j.ID)
	require.NoError(t, f.rdb.ZAdd(f.ctx, keys.Leased, redis.Z{Score: 1, Member: j.ID}).Err())

	got, err := f.q.ClaimMany(f.ctx, "w", 8)
	require.NoError(t, err)
	require.Len(t, got, 1, "one job, one claim")
	f.requireIndexed(t, got[0])
	_, err = f.q.ClaimMany(f.ctx, "w", 8)
	require.ErrorIs(t, err, ErrNoJob)
}

// The engine refuses a transaction that names one key twice: two decisions
// about one value in one EXEC would undo each other.
func TestCASRefusesRepeatedKey(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	key, _ := f.q.ks.jobKeyOf("k")
	f.hook.Reset()
	_, _, err := f.q.cas.run(f.ctx, &casTxn{keys: []string{key, key}, decide: func(*casRead) (*casPlan, error) {
		t.Fatal("decided")
		return nil, nil
	}})
	require.ErrorContains(t, err, "twice")
	require.Zero(t, f.hook.RTT.Load(), "refused before any round trip")
}

// A pending job with no attempt left (MaxAttempts lowered below what it
// used) is failed by the claim that meets it, not run (issue 9, item 16);
// Update refuses to lower MaxAttempts below the attempts made.
func TestClaimFailsPendingJobWithNoAttemptLeft(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{MaxAttempts: 5})
	require.NoError(t, err)
	for range 3 {
		c, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		_, err = f.q.Fail(f.ctx, c, fmt.Errorf("attempt %d", c.Attempt))
		require.NoError(t, err)
		f.clock.Advance(time.Hour)
	}
	_, err = f.q.Update(f.ctx, j.ID, func(j *Job) error { j.MaxAttempts = 2; return nil })
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "at least the 3 attempts made")
	_, err = f.q.Update(f.ctx, j.ID, func(j *Job) error { j.MaxAttempts = 3; return nil })
	require.NoError(t, err, "no attempt left is allowed")

	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob)
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, StateFailed, got.State)
	require.Equal(t, 3, got.Attempt)
	require.Contains(t, got.LastError, "no attempt left")
	f.requireIndexed(t, got)
}

// Dead jobs (expired leases on their last attempt) ahead of a runnable one
// are failed on the way, and the claim goes on to the runnable job instead
// of answering that nothing is due (issue 10, item 10).
func TestClaimGoesPastDeadJobs(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	const dead = 200
	batch := make([]NewJob, dead)
	for i := range batch {
		batch[i] = NewJob{Type: "dead", Opts: &EnqueueOpts{MaxAttempts: 1}}
	}
	_, err := f.q.EnqueueMany(f.ctx, batch)
	require.NoError(t, err)
	for range dead / 50 {
		_, err := f.q.ClaimMany(f.ctx, "gone", 50) // and never heard from again
		require.NoError(t, err)
	}
	f.clock.Advance(time.Second)
	live, err := f.q.Enqueue(f.ctx, "live", nil, &EnqueueOpts{MaxAttempts: 2})
	require.NoError(t, err)
	_, err = f.q.Claim(f.ctx, "gone") // its lease ends after all the dead ones'
	require.NoError(t, err)
	f.clock.Advance(time.Minute) // every lease has run out

	got, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err, "a runnable job is due behind the dead ones")
	require.Equal(t, live.ID, got.ID)
	require.Equal(t, 2, got.Attempt)
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, dead, st.Failed, "the dead ones were failed on the way")
}
