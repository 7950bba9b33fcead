package jobkey

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A snooze gives the attempt back and sets RunAt later, in the outcome's
// one write: the job never counts it against MaxAttempts, keeps its last
// failure, and keeps the run in its history. The same Fail sent again
// after a lost reply finds its own write and snoozes nothing more.
func TestSnoozeGivesTheAttemptBack(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	c := enqueueAndClaim(t, f, "w", nil, &EnqueueOpts{MaxAttempts: 1})
	now := f.clock.Now()
	s, err := f.q.Fail(f.ctx, c, Snooze(30*time.Second))
	require.NoError(t, err)
	require.Equal(t, StatePending, s.State)
	require.Zero(t, s.Attempt, "the attempt is given back")
	require.Equal(t, 1, s.Snoozes)
	require.Empty(t, s.LastError, "a snooze is no failure")
	require.Equal(t, now.Add(30*time.Second), s.RunAt)
	require.False(t, s.RunAt.Before(s.LeaseUntil), "not due before the run's lease ended (the last-run rule)")
	require.Len(t, s.History, 1)
	require.Equal(t, OutcomeSnoozed, s.History[0].Outcome)
	require.Equal(t, "jobkey: snoozed for 30s", s.History[0].Error)
	f.requireIndexed(t, s)

	again, err := f.q.Fail(f.ctx, c, Snooze(30*time.Second))
	require.NoError(t, err, "a retry after a lost reply finds its own write")
	require.Equal(t, s.Rev, again.Rev, "and writes nothing")

	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob, "not due while snoozed")
	f.clock.Advance(30 * time.Second)
	c2, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, 1, c2.Attempt, "MaxAttempts 1 still has its one attempt")
}

// A job cannot snooze for ever: the snooze after Config.MaxSnoozes fails it
// for good with ErrSnoozeLimit's text, and Retry counts snoozes afresh.
func TestSnoozeLimitFailsTheJobForGood(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{MaxSnoozes: 2})
	c := enqueueAndClaim(t, f, "w", nil, nil)
	for i := range 2 {
		s, err := f.q.Fail(f.ctx, c, Snooze(time.Second))
		require.NoError(t, err)
		require.Equal(t, StatePending, s.State, "snooze %d", i+1)
		f.clock.Advance(time.Second)
		c, err = f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
	}
	failed, err := f.q.Fail(f.ctx, c, Snooze(time.Second))
	require.NoError(t, err)
	require.Equal(t, StateFailed, failed.State)
	require.True(t, strings.HasPrefix(failed.LastError, ErrSnoozeLimit.Error()), failed.LastError)
	require.Contains(t, failed.LastError, "2 snoozes, limit 2")
	require.Equal(t, OutcomeFailed, failed.History[len(failed.History)-1].Outcome)
	f.requireIndexed(t, failed)

	r, err := f.q.Retry(f.ctx, c.ID)
	require.NoError(t, err)
	require.Zero(t, r.Snoozes)
}

// RetryAfter spends the attempt, as any failure, and sets the delay in
// place of the backoff; with no attempt left the job fails as usual.
func TestRetryAfterSpendsTheAttemptWithItsOwnDelay(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	c := enqueueAndClaim(t, f, "w", nil, &EnqueueOpts{MaxAttempts: 2})
	now := f.clock.Now()
	p, err := f.q.Fail(f.ctx, c, RetryAfter(7*time.Second, errors.New("429")))
	require.NoError(t, err)
	require.Equal(t, StatePending, p.State)
	require.Equal(t, 1, p.Attempt)
	require.Equal(t, now.Add(7*time.Second), p.RunAt, "not the backoff's minute")
	require.Equal(t, "429 (retry after 7s)", p.LastError)
	f.clock.Advance(7 * time.Second)
	c, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	last, err := f.q.Fail(f.ctx, c, RetryAfter(time.Second, errors.New("429")))
	require.NoError(t, err)
	require.Equal(t, StateFailed, last.State, "its last attempt")
	f.requireIndexed(t, last)

	c = enqueueAndClaim(t, f, "w", nil, nil)
	p, err = f.q.Fail(f.ctx, c, RetryAfter(-time.Hour, errors.New("x")))
	require.NoError(t, err)
	require.Equal(t, f.clock.Now(), p.RunAt, "a negative delay is none")
}

// ReleaseAfter gives the attempt back and makes the job due after the
// delay; Release stays due at once.
func TestReleaseAfterDelaysTheJob(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	c := enqueueAndClaim(t, f, "w", nil, nil)
	_, err := f.q.ReleaseAfter(f.ctx, c, -time.Second)
	require.ErrorIs(t, err, ErrInvalid)
	r, err := f.q.ReleaseAfter(f.ctx, c, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, StatePending, r.State)
	require.Zero(t, r.Attempt)
	require.Equal(t, f.clock.Now().Add(5*time.Second), r.RunAt)
	require.Equal(t, OutcomeReleased, r.History[0].Outcome)
	f.requireIndexed(t, r)
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob)
	f.clock.Advance(5 * time.Second)
	_, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
}

// A Work's retry policy sees the job and the handler's error, and decides
// the delay or gives up; a type's own policy (WithRetryPolicy in a Mux)
// decides before it; a policy that snoozes spares the attempt; one that
// panics is replaced by Config.Backoff.
func TestRetryPolicyDecidesByJobAndError(t *testing.T) {
	t.Parallel()
	q := realQueue(t, &Config{Backoff: func(int) time.Duration { return 3 * time.Hour }})
	errRate := errors.New("rate limited")
	errFatal := errors.New("fatal")
	var mu sync.Mutex
	seen := map[string]string{} // job ID -> type and error the policy saw
	workPolicy := func(j *Job, err error) RetryDecision {
		mu.Lock()
		seen[j.ID] = j.Type + ":" + err.Error()
		mu.Unlock()
		switch {
		case errors.Is(err, errFatal):
			return RetryDecision{GiveUp: true}
		case errors.Is(err, errRate):
			return RetryDecision{Delay: time.Hour, Snooze: true}
		case j.Type == "panics":
			panic("policy bug")
		}
		return RetryDecision{Delay: time.Duration(j.Attempt) * 2 * time.Hour}
	}
	typePolicy := func(j *Job, err error) RetryDecision { return RetryDecision{Delay: 5 * time.Hour} }
	fail := func(err error) Handler {
		return HandlerFunc(func(context.Context, *Job) ([]byte, error) { return nil, err })
	}
	mux := Mux{
		"plain":  fail(errors.New("x")),
		"fatal":  fail(errFatal),
		"rate":   fail(errRate),
		"panics": fail(errors.New("y")),
		"typed":  WithRetryPolicy(fail(errors.New("z")), typePolicy),
	}
	ids := map[string]string{}
	for typ := range mux {
		j, err := q.Enqueue(context.Background(), typ, nil, nil)
		require.NoError(t, err)
		ids[typ] = j.ID
	}
	stop := startWork(t, q, mux, &WorkOpts{RetryPolicy: workPolicy})
	got := map[string]*Job{}
	waitFor(t, "every job's first run recorded", func() bool {
		for typ, id := range ids {
			j, err := q.Get(context.Background(), id)
			require.NoError(t, err)
			if j.State == StateActive || len(j.History) == 0 {
				return false
			}
			got[typ] = j
		}
		return true
	})
	stop()
	delay := func(j *Job) time.Duration { return j.RunAt.Sub(j.LeaseUntil) }
	require.Equal(t, StatePending, got["plain"].State)
	require.Equal(t, 2*time.Hour, delay(got["plain"]), "the Work's policy, from the attempt")
	require.Equal(t, StateFailed, got["fatal"].State, "given up with attempts left")
	require.Equal(t, 1, got["rate"].Snoozes)
	require.Zero(t, got["rate"].Attempt, "a policy's snooze spares the attempt")
	require.Equal(t, time.Hour, delay(got["rate"]))
	require.Equal(t, 3*time.Hour, delay(got["panics"]), "a policy that panics gives way to Config.Backoff")
	require.Equal(t, 5*time.Hour, delay(got["typed"]), "the type's own policy first")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, "plain:x", seen[ids["plain"]])
	require.Equal(t, "rate:rate limited", seen[ids["rate"]])
	require.NotContains(t, seen, ids["typed"], "the Work's policy is not asked for a typed job")
}
