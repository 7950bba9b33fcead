package jobkey

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ckVerifyClean runs Verify and requires no finding.
func ckVerifyClean(t *testing.T, f *fixture, msg string) {
	t.Helper()
	rep, err := f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings, msg)
}

// A waiting job's listing keeps the RunAt it had when it was listed. A job
// whose RunAt moved later since (Update) has its entry pulled back below
// its RunAt by the next freed slot: an entry that says due for a job that
// is not, which Verify reports.
func TestBreakCKPullOfStaleListingUpdate(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: time.Minute, ClaimWindow: 1})
	a, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k"})
	require.NoError(t, err)
	b, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k", RunAt: a.RunAt.Add(time.Millisecond)})
	require.NoError(t, err)
	f.clock.Advance(time.Second)
	ca, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, a.ID, ca.ID)
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob, "b waits for a's slot")
	later := f.clock.Now().Add(time.Hour)
	_, err = f.q.Update(f.ctx, b.ID, func(j *Job) error { j.RunAt = later; return nil })
	require.NoError(t, err)
	ckVerifyClean(t, f, "b is pending, due in an hour")
	_, err = f.q.Complete(f.ctx, ca, nil)
	require.NoError(t, err)
	ckVerifyClean(t, f, "b is still due in an hour: its entry must not say due now")
}

// The same with Cancel and Retry: a waiting job canceled stays listed; once
// retried later, the next freed slot pulls its entry back to the RunAt it
// had before.
func TestBreakCKPullOfStaleListingRetry(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: time.Minute, ClaimWindow: 1})
	a, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k"})
	require.NoError(t, err)
	b, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k", RunAt: a.RunAt.Add(time.Millisecond)})
	require.NoError(t, err)
	f.clock.Advance(time.Second)
	ca, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, a.ID, ca.ID)
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob)
	_, err = f.q.Cancel(f.ctx, b.ID)
	require.NoError(t, err)
	f.clock.Advance(10 * time.Second)
	_, err = f.q.Retry(f.ctx, b.ID)
	require.NoError(t, err)
	_, err = f.q.Extend(f.ctx, ca) // a keeps the slot
	require.NoError(t, err)
	_, err = f.q.Complete(f.ctx, ca, nil)
	require.NoError(t, err)
	ckVerifyClean(t, f, "b's entry is at its RunAt, not before")
}

// A waiting job pulled forward into a freed slot holds it in mind for a
// while, so that one freed slot does not pull every waiting job forward.
// When that job is canceled (or deleted) before it is claimed, the next
// waiting job must be pulled forward: the key has room, and nothing else
// brings its entry due before the lease it waited for would have ended.
func TestBreakCKCanceledPullHoldsSlot(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"cancel", "delete"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			f := setup(t, &Config{Lease: time.Hour, ClaimWindow: 1})
			var ids []string
			for i := range 3 {
				j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k", RunAt: f.clock.Now().Add(time.Duration(i) * time.Millisecond)})
				require.NoError(t, err)
				ids = append(ids, j.ID)
			}
			f.clock.Advance(time.Second)
			a, err := f.q.Claim(f.ctx, "w")
			require.NoError(t, err)
			require.Equal(t, ids[0], a.ID)
			for range 2 {
				_, err = f.q.Claim(f.ctx, "w")
				require.ErrorIs(t, err, ErrNoJob, "b and c wait for a's slot")
			}
			_, err = f.q.Complete(f.ctx, a, nil) // pulls b forward
			require.NoError(t, err)
			if how == "cancel" {
				_, err = f.q.Cancel(f.ctx, ids[1])
			} else {
				err = f.q.Delete(f.ctx, ids[1])
			}
			require.NoError(t, err)
			c, err := f.q.Claim(f.ctx, "w")
			require.NoError(t, err, "the key has room and c waits for it, not for the hour a's lease would have lasted")
			require.Equal(t, ids[2], c.ID)
			ckVerifyClean(t, f, "")
		})
	}
}

// A run canceled while it ran keeps its slot until its lease would have
// ended (its handler may still be stopping). A job enqueued again under the
// same ID must not take that slot: a claim counted every live lease but
// the claimed job's own ID's, and dropped the old run's lease from the
// key's value. jobkey keeps the ID taken meanwhile (Delete waits, and the
// key outlives its retention: lastrun.go), so here the value goes outside
// jobkey, as a DEL by hand or an eviction would take it.
func TestBreakCKReenqueuedIDIgnoresCanceledRun(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{1, 2} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			t.Parallel()
			f := setup(t, &Config{Lease: time.Minute, ClaimWindow: 1})
			require.NoError(t, f.q.SetConcurrencyLimit(f.ctx, "k", limit))
			_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "x", ConcurrencyKey: "k"})
			require.NoError(t, err)
			for i := 1; i < limit; i++ { // the other slots are busy
				_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k", RunAt: f.clock.Now().Add(time.Duration(i) * time.Millisecond)})
				require.NoError(t, err)
			}
			f.clock.Advance(time.Second)
			for i := range limit {
				j, err := f.q.Claim(f.ctx, "w")
				require.NoError(t, err)
				if i == 0 {
					require.Equal(t, "x", j.ID)
				}
			}
			_, err = f.q.Cancel(f.ctx, "x") // its handler may run until its lease ends
			require.NoError(t, err)
			_, err = f.q.Retry(f.ctx, "x") // due when that run's lease ends
			require.NoError(t, err)
			require.ErrorIs(t, f.q.Delete(f.ctx, "x"), ErrState, "the canceled run's lease holds")
			require.NoError(t, f.rdb.Del(f.ctx, f.q.Keys("x").Job).Err())
			require.NoError(t, f.rdb.ZRem(f.ctx, f.q.Keys("x").Ready, "x").Err())
			_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "x", ConcurrencyKey: "k"})
			require.NoError(t, err)
			_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k"})
			require.NoError(t, err)
			_, err = f.q.Claim(f.ctx, "w")
			require.ErrorIs(t, err, ErrNoJob, "the key's %d slots are held, one by the canceled run of x", limit)
			info, err := f.q.Concurrency(f.ctx, "k")
			require.NoError(t, err)
			require.Equal(t, limit, info.Active)
		})
	}
}

// A stored job's concurrency key is read from its value, and the value
// decodes with any key of at most MaxConcurrencyKeyLen bytes (one a newer
// or other writer stored, or one forged): a claim takes the job and a slot
// of that key. The worker's copy carries the key, so every write of the
// run (Extend, Complete, Fail, Release) must accept it: they refused a copy
// whose key Enqueue would not take, so a job with a brace in its key ran,
// held its slot and could never be finished, only run again once its
// lease ran out, up to MaxAttempts times.
func TestBreakCKStoredKeyEnqueueRefuses(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: time.Minute})
	j, err := f.q.Enqueue(f.ctx, "t", nil, nil)
	require.NoError(t, err)
	j.ConcurrencyKey = "a{b}" // the value as stored by another writer
	raw, err := Marshal(j)
	require.NoError(t, err)
	require.NoError(t, f.rdb.Set(f.ctx, f.q.Keys(j.ID).Job, raw, 0).Err())
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, "a{b}", c.ConcurrencyKey)
	c, err = f.q.Extend(f.ctx, c)
	require.NoError(t, err, "the run's own copy renews its lease")
	done, err := f.q.Complete(f.ctx, c, nil)
	require.NoError(t, err, "the run's own copy finishes it")
	require.Equal(t, StateSucceeded, done.State)
	s, err := f.rdb.Get(f.ctx, f.q.ks.slotKey(0, "a{b}")).Result()
	if err == nil {
		v, err := decodeSlots(s)
		require.NoError(t, err)
		require.Empty(t, v.leases, "the slot is given back")
	}
	ckVerifyClean(t, f, "")
}
