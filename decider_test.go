package jobkey

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The decisions are tested here without Redis: each takes the read, the
// time and the queue's config, and builds its writes into a plan.

func testDecider(t *testing.T) *decider {
	t.Helper()
	cfg := (&Config{}).withDefaults(false)
	return &decider{name: "q", cfg: cfg, ks: newKeyspace(cfg.Prefix, "q", cfg.Shards)}
}

func TestDecideClaimTakesADueJobOrAnExpiredLeaseAndFailsOneWithNoAttemptLeft(t *testing.T) {
	t.Parallel()
	d := testDecider(t)
	now := time.UnixMilli(1_700_000_000_000)
	pending := &Job{ID: "a", Queue: "q", State: StatePending, RunAt: now, Attempt: 0, MaxAttempts: 3}

	next, took := d.decideClaim(pending, "w/1", now)
	require.True(t, took)
	require.Equal(t, StateActive, next.State)
	require.Equal(t, 1, next.Attempt)
	require.Equal(t, "w/1", next.LeaseOwner)
	require.Equal(t, now.Add(d.cfg.Lease), next.LeaseUntil, "the lease is measured on Redis's clock")
	require.NotZero(t, next.LeaseToken)
	require.Equal(t, StatePending, pending.State, "the value read is not changed")

	later := *pending
	later.RunAt = now.Add(time.Millisecond)
	next, took = d.decideClaim(&later, "w/1", now)
	require.Nil(t, next, "not due yet")
	require.False(t, took)

	running := &Job{ID: "a", Queue: "q", State: StateActive, LeaseUntil: now.Add(time.Second), Attempt: 1, MaxAttempts: 3, LeaseToken: 7}
	next, _ = d.decideClaim(running, "w/2", now)
	require.Nil(t, next, "a lease in force is never taken")
	expired := *running
	expired.LeaseUntil = now
	next, took = d.decideClaim(&expired, "w/2", now)
	require.True(t, took)
	require.Equal(t, 2, next.Attempt)
	require.NotEqual(t, uint64(7), next.LeaseToken, "a new claim fences the old one")

	last := expired
	last.Attempt = 3
	next, took = d.decideClaim(&last, "w/2", now)
	require.False(t, took)
	require.Equal(t, StateFailed, next.State)
	require.Contains(t, next.LastError, "lease of attempt 3/3")
}

func TestDecideFencedRefusesALeaseItDoesNotHoldAndRecognisesItsOwnWrite(t *testing.T) {
	t.Parallel()
	d := testDecider(t)
	now := time.UnixMilli(1_700_000_000_000)
	cur := &Job{ID: "a", Queue: "q", State: StateActive, Attempt: 1, MaxAttempts: 3, LeaseToken: 7, LeaseUntil: now.Add(time.Minute)}
	mine := *cur
	f := fencedWrite{key: d.ks.jobKey(0, "a"), shard: 0, j: &mine, done: completed, fn: succeed([]byte("r"))}

	plan, ip := &casPlan{}, &indexPlan{}
	out, err := d.decideFenced(plan, ip, d.newSlotBook(&casRead{now: now}), f, cur, nil, now)
	require.NoError(t, err)
	require.Equal(t, StateSucceeded, out.State)
	require.Equal(t, []byte("r"), out.Result)
	require.Len(t, plan.writes, 1)
	require.Positive(t, plan.writes[0].ttl, "a finished job's key expires with its retention")

	// Another claim's lease: nothing is written.
	other := *cur
	other.LeaseToken = 8
	plan = &casPlan{}
	_, err = d.decideFenced(plan, &indexPlan{}, d.newSlotBook(&casRead{now: now}), f, &other, nil, now)
	require.ErrorIs(t, err, ErrLeaseLost)
	require.True(t, plan.empty())

	// Its own completion, read back after a lost reply: answered from it,
	// and confirmed as a write of its own.
	plan = &casPlan{}
	again, err := d.decideFenced(plan, &indexPlan{}, d.newSlotBook(&casRead{now: now}), f, out, nil, now)
	require.NoError(t, err)
	require.Equal(t, out, again)
	require.True(t, plan.confirm)
	require.True(t, plan.empty())

	_, err = d.decideFenced(&casPlan{}, &indexPlan{}, d.newSlotBook(&casRead{now: now}), f, nil, nil, now)
	require.ErrorIs(t, err, ErrNotFound)
	bad := errors.New("unreadable")
	_, err = d.decideFenced(&casPlan{}, &indexPlan{}, d.newSlotBook(&casRead{now: now}), f, nil, bad, now)
	require.ErrorIs(t, err, bad)
}

func TestDecideCandidateSetsAsideWhatItCannotReadAndLooksPastNewerFormats(t *testing.T) {
	t.Parallel()
	d := testDecider(t)
	now := time.UnixMilli(1_700_000_000_000)
	c := candidate{Shard: 0, ID: "a", Index: idxReady}
	key := d.ks.jobKey(0, "a")
	book := d.newSlotBook(&casRead{now: now})

	plan, ip := &casPlan{}, &indexPlan{}
	got, lost := d.decideCandidate(plan, ip, book, c, key, nil, ErrUnsupportedFormat, "w", now)
	require.Nil(t, got)
	require.False(t, lost)
	require.Equal(t, []string{"a"}, plan.newerFormat, "claimers look past it for a while")
	require.Equal(t, [][]any{{"zadd", d.ks.index(0, seenNewerFormat), toMillis(now), "a"}}, ip.steps(), "the sighting is logged; the hint stays")

	plan, ip = &casPlan{}, &indexPlan{}
	got, _ = d.decideCandidate(plan, ip, book, c, key, nil, &CorruptError{Key: key}, "w", now)
	require.Nil(t, got)
	require.Empty(t, plan.writes, "unreadable bytes are kept, never rewritten")
	require.Equal(t, [][]any{{"zrem", d.ks.index(0, idxReady), "a"}, {"zadd", d.ks.index(0, idxCorrupt), toMillis(now), "a"}}, ip.steps())

	plan, ip = &casPlan{}, &indexPlan{}
	got, lost = d.decideCandidate(plan, ip, book, c, key, nil, nil, "w", now)
	require.Nil(t, got)
	require.True(t, lost, "a hint with no value behind it")

	plan, ip = &casPlan{}, &indexPlan{}
	cur := &Job{ID: "a", Queue: "q", State: StatePending, RunAt: now, MaxAttempts: 1}
	got, lost = d.decideCandidate(plan, ip, book, c, key, cur, nil, "w", now)
	require.False(t, lost)
	require.Equal(t, StateActive, got.State)
	require.Len(t, plan.writes, 1)
	require.Equal(t, key, plan.writes[0].key)
}
