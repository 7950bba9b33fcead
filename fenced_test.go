package jobkey

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Every claim fences with a token of its own: after Claim, Cancel, Retry
// and a new Claim by the same worker name (replicas sharing a fixed
// WorkOpts.Name), the first copy's Attempt and LeaseOwner match the stored
// job again, and its writes are still refused.
func TestFencingSurvivesRepeatedAttemptAndOwner(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	first := enqueueAndClaim(t, f, "replica", nil, nil)
	_, err := f.q.Cancel(f.ctx, first.ID)
	require.NoError(t, err)
	r, err := f.q.Retry(f.ctx, first.ID)
	require.NoError(t, err)
	require.Equal(t, first.LeaseUntil, r.RunAt, "due when the canceled run's lease would have ended")
	f.clock.Advance(31 * time.Second)
	second, err := f.q.Claim(f.ctx, "replica")
	require.NoError(t, err)
	require.Equal(t, first.Attempt, second.Attempt)
	require.Equal(t, first.LeaseOwner, second.LeaseOwner)
	require.NotEqual(t, first.LeaseToken, second.LeaseToken)

	for name, write := range map[string]func(*Job) (*Job, error){
		"Complete": func(j *Job) (*Job, error) { return f.q.Complete(f.ctx, j, []byte("stale")) },
		"Extend":   func(j *Job) (*Job, error) { return f.q.Extend(f.ctx, j) },
		"Fail":     func(j *Job) (*Job, error) { return f.q.Fail(f.ctx, j, nil) },
		"Release":  func(j *Job) (*Job, error) { return f.q.Release(f.ctx, j) },
	} {
		_, err := write(first)
		require.ErrorIs(t, err, ErrLeaseLost, name)
	}
	done, err := f.q.Complete(f.ctx, second, []byte("fresh"))
	require.NoError(t, err)
	require.Equal(t, []byte("fresh"), done.Result)
	again, err := f.q.Complete(f.ctx, second, []byte("fresh"))
	require.NoError(t, err, "a Complete retried after a lost reply sees its own completion")
	require.Equal(t, done.Rev, again.Rev)
	_, err = f.q.Complete(f.ctx, first, []byte("stale"))
	require.ErrorIs(t, err, ErrLeaseLost, "and not the other claim's")
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	c := enqueueAndClaim(t, f, "w1", []byte("p"), nil)
	require.Equal(t, StateActive, c.State)
	require.Equal(t, 1, c.Attempt)
	require.Equal(t, "w1", c.LeaseOwner)
	require.Equal(t, f.clock.Now().Add(30*time.Second), c.LeaseUntil)
	f.requireIndexed(t, c)

	_, err := f.q.Claim(f.ctx, "w2")
	require.ErrorIs(t, err, ErrNoJob, "a held lease is not claimable")

	f.clock.Advance(20 * time.Second)
	e, err := f.q.Extend(f.ctx, c)
	require.NoError(t, err)
	require.Equal(t, f.clock.Now().Add(30*time.Second), e.LeaseUntil)
	f.requireIndexed(t, e)

	done, err := f.q.Complete(f.ctx, c, []byte("result"))
	require.NoError(t, err)
	require.Equal(t, StateSucceeded, done.State)
	require.Equal(t, []byte("result"), done.Result)
	f.requireIndexed(t, done)
	ttl, err := f.rdb.PTTL(f.ctx, f.q.ks.jobKey(0, c.ID)).Result()
	require.NoError(t, err)
	require.InDelta(t, (24 * time.Hour).Seconds(), ttl.Seconds(), 60, "retention is the key's own expiry")

	// A Complete retried after its reply was lost is a no-op success.
	again, err := f.q.Complete(f.ctx, c, []byte("result"))
	require.NoError(t, err)
	require.Equal(t, done.Rev, again.Rev)

	_, err = f.q.Extend(f.ctx, c)
	require.ErrorIs(t, err, ErrLeaseLost)
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{Succeeded: 1}, st)
}

func TestFailRetriesThenFails(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	c := enqueueAndClaim(t, f, "w", nil, &EnqueueOpts{MaxAttempts: 2})
	p, err := f.q.Fail(f.ctx, c, errors.New("boom"))
	require.NoError(t, err)
	require.Equal(t, StatePending, p.State)
	require.Equal(t, "boom", p.LastError)
	require.Equal(t, f.clock.Now().Add(time.Minute), p.RunAt, "backoff of attempt 1")
	f.requireIndexed(t, p)

	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob, "not due during backoff")
	f.clock.Advance(time.Minute)
	c2, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, 2, c2.Attempt)
	_, err = f.q.Fail(f.ctx, c, errors.New("stale"))
	require.ErrorIs(t, err, ErrLeaseLost, "attempt 1's copy is fenced off")

	final, err := f.q.Fail(f.ctx, c2, errors.New(strings.Repeat("é", MaxErrorLen)))
	require.NoError(t, err)
	require.Equal(t, StateFailed, final.State)
	require.LessOrEqual(t, len(final.LastError), MaxErrorLen)
	require.True(t, strings.HasPrefix(final.LastError, "éé"))
	f.requireIndexed(t, final)

	r, err := f.q.Retry(f.ctx, c.ID)
	require.NoError(t, err)
	require.Equal(t, StatePending, r.State)
	require.Zero(t, r.Attempt)
	ttl, err := f.rdb.PTTL(f.ctx, f.q.ks.jobKey(0, c.ID)).Result()
	require.NoError(t, err)
	require.Equal(t, time.Duration(-1), ttl, "a retried job no longer expires")
	f.requireIndexed(t, r)
}

func TestSkipRetryFailsAtOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	c := enqueueAndClaim(t, f, "w", nil, nil)
	failed, err := f.q.Fail(f.ctx, c, fmt.Errorf("bad input: %w", ErrSkipRetry))
	require.NoError(t, err)
	require.Equal(t, StateFailed, failed.State)
}

func TestRelease(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	c := enqueueAndClaim(t, f, "w", nil, nil)
	r, err := f.q.Release(f.ctx, c)
	require.NoError(t, err)
	require.Equal(t, StatePending, r.State)
	require.Zero(t, r.Attempt, "the attempt is not spent")
	f.requireIndexed(t, r)
	again, err := f.q.Release(f.ctx, c)
	require.NoError(t, err, "a Release retried after a lost reply finds its own write")
	require.Equal(t, r.Rev, again.Rev, "and writes nothing")
	c2, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, 1, c2.Attempt)
	_, err = f.q.Release(f.ctx, c)
	require.ErrorIs(t, err, ErrLeaseLost, "once claimed again, the old claim is fenced off")
}

// A claims; A's lease expires; B claims; A's Complete is fenced off; B
// completes and the result is B's.
func TestZombieFencing(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	a := enqueueAndClaim(t, f, "A", nil, nil)
	f.clock.Advance(31 * time.Second)
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.ExpiredLeases)
	b, err := f.q.Claim(f.ctx, "B")
	require.NoError(t, err)
	require.Equal(t, a.ID, b.ID)
	require.Equal(t, 2, b.Attempt)

	for name, op := range map[string]func() error{
		"complete": func() error { _, err := f.q.Complete(f.ctx, a, []byte("A")); return err },
		"extend":   func() error { _, err := f.q.Extend(f.ctx, a); return err },
		"fail":     func() error { _, err := f.q.Fail(f.ctx, a, errors.New("A")); return err },
		"release":  func() error { _, err := f.q.Release(f.ctx, a); return err },
	} {
		err := op()
		require.ErrorIs(t, err, ErrLeaseLost, name)
		var ll *LeaseLostError
		require.ErrorAs(t, err, &ll)
		require.Equal(t, "B", ll.Now.LeaseOwner)
	}
	done, err := f.q.Complete(f.ctx, b, []byte("B"))
	require.NoError(t, err)
	got, err := f.q.Get(f.ctx, a.ID)
	require.NoError(t, err)
	require.Equal(t, StateSucceeded, got.State)
	require.Equal(t, []byte("B"), got.Result)
	require.Equal(t, done, got)
}

// Fail writes no value larger than Config.MaxValueBytes, which refuses such
// values with ErrTooLarge before anything is written, as Enqueue, Update and
// Complete do. Fail stores up to MaxErrorLen bytes of LastError, enough to
// carry a job near the limit past it.
func TestFailStaysWithinMaxValueBytes(t *testing.T) {
	t.Parallel()
	const limit = 2048
	f := setup(t, &Config{MaxValueBytes: limit})
	payload := make([]byte, limit-200)
	c := enqueueAndClaim(t, f, "w", payload, nil)
	_, err := f.q.Fail(f.ctx, c, errors.New(strings.Repeat("x", MaxErrorLen)))
	key, _ := f.q.ks.jobKeyOf(c.ID)
	n, serr := f.rdb.StrLen(f.ctx, key).Result()
	require.NoError(t, serr)
	t.Logf("Fail returned %v; stored value is %d bytes, limit %d", err, n, limit)
	require.LessOrEqual(t, n, int64(limit), "a value larger than Config.MaxValueBytes was written")
}

// Every write of a run (Extend, Complete, Fail, Release) accepts the
// concurrency key of the run's own copy, even one Enqueue would refuse. A
// stored value decodes with any key of at most MaxConcurrencyKeyLen bytes
// (one a newer or other writer stored, or one forged), and a claim takes the
// job and a slot of that key; a write that refused the key, here one with a
// brace, would leave a job that runs and holds its slot but can never be
// finished, only run again once its lease runs out, up to MaxAttempts times.
func TestRunWritesAcceptStoredConcurrencyKey(t *testing.T) {
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
	verifyClean(t, f, "")
}

// enqueueAndClaim enqueues one job of type "t" with payload and opts, claims
// it as worker, and requires the claim to return that job.
func enqueueAndClaim(t *testing.T, f *fixture, worker string, payload []byte, opts *EnqueueOpts) *Job {
	t.Helper()
	j, err := f.q.Enqueue(f.ctx, "t", payload, opts)
	require.NoError(t, err)
	c, err := f.q.Claim(f.ctx, worker)
	require.NoError(t, err)
	require.Equal(t, j.ID, c.ID)
	return c
}
