package jobkey

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Every run's outcome is kept in the job's History, oldest first: its
// attempt, when its claim took the job, how long it ran, its worker, how
// it ended and its error. A run whose lease ran out unrecorded is kept by
// the claim that takes the job over.
func TestHistoryKeepsEveryRun(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: time.Minute})
	c := enqueueAndClaim(t, f, "w1", nil, nil)
	start := f.clock.Now()
	require.Equal(t, start, c.StartedAt)
	f.clock.Advance(1500 * time.Millisecond)
	_, err := f.q.Fail(f.ctx, c, errors.New("boom"))
	require.NoError(t, err)
	f.clock.Advance(time.Minute) // the backoff of attempt 1
	lost, err := f.q.Claim(f.ctx, "w2")
	require.NoError(t, err)
	require.Equal(t, "w2", lost.LeaseOwner)
	f.clock.Advance(2 * time.Minute) // w2 dies: its lease runs out
	c, err = f.q.Claim(f.ctx, "w3")
	require.NoError(t, err)
	f.clock.Advance(time.Second)
	done, err := f.q.Complete(f.ctx, c, nil)
	require.NoError(t, err)

	h := done.History
	require.Len(t, h, 3)
	require.Equal(t, AttemptRecord{Attempt: 1, Started: start, Duration: 1500 * time.Millisecond, Worker: "w1", Outcome: OutcomeFailed, Error: "boom"}, h[0])
	require.Equal(t, 2, h[1].Attempt)
	require.Equal(t, "w2", h[1].Worker)
	require.Equal(t, OutcomeLost, h[1].Outcome)
	require.Equal(t, time.Minute, h[1].Duration, "until its lease ended")
	require.Equal(t, AttemptRecord{Attempt: 3, Started: c.StartedAt, Duration: time.Second, Worker: "w3", Outcome: OutcomeSucceeded}, h[2])
	require.Zero(t, done.HistoryDropped)
}

// History is bounded in records and in bytes: the oldest are dropped first,
// and the drop is counted.
func TestHistoryDropsTheOldestAndCountsThem(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Backoff: func(int) time.Duration { return 0 }})
	j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{MaxAttempts: 100})
	require.NoError(t, err)
	const runs = MaxHistoryEntries + 5
	var last *Job
	for i := range runs {
		c, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		last, err = f.q.Fail(f.ctx, c, fmt.Errorf("run %d", i+1))
		require.NoError(t, err)
	}
	require.Len(t, last.History, MaxHistoryEntries)
	require.Equal(t, 5, last.HistoryDropped)
	require.Equal(t, "run 6", last.History[0].Error, "the oldest went first")
	require.Equal(t, fmt.Sprintf("run %d", runs), last.History[MaxHistoryEntries-1].Error)

	// Long errors: each record keeps MaxHistoryErrorLen, and the records
	// together MaxHistoryBytes of text.
	for range 3 {
		c, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		last, err = f.q.Fail(f.ctx, c, errors.New(strings.Repeat("e", 3*MaxHistoryErrorLen)))
		require.NoError(t, err)
	}
	require.Len(t, last.History[len(last.History)-1].Error, MaxHistoryErrorLen)
	require.LessOrEqual(t, historyTextBytes(last.History), MaxHistoryBytes)
	require.Equal(t, runs+3-len(last.History), last.HistoryDropped, "every record dropped is counted")
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, last.History, got.History)
}

// A run recorded in a value near Config.MaxValueBytes gives up the oldest
// records before the write is refused or the error cut.
func TestHistoryGivesWayToMaxValueBytes(t *testing.T) {
	t.Parallel()
	const limit = 4096
	f := setup(t, &Config{MaxValueBytes: limit, Backoff: func(int) time.Duration { return 0 }})
	j, err := f.q.Enqueue(f.ctx, "t", make([]byte, limit-1200), &EnqueueOpts{MaxAttempts: 100})
	require.NoError(t, err)
	var last *Job
	for i := range 10 {
		c, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		last, err = f.q.Fail(f.ctx, c, fmt.Errorf("run %d: %s", i, strings.Repeat("x", 200)))
		require.NoError(t, err, "run %d", i)
	}
	require.LessOrEqual(t, encodedSize(last), limit)
	require.Equal(t, 10, last.History[len(last.History)-1].Attempt, "the latest run is kept")
	require.Positive(t, last.HistoryDropped)
	require.Equal(t, 10-len(last.History), last.HistoryDropped)
	require.True(t, strings.HasPrefix(last.LastError, "run 9: "), last.LastError)
	f.requireIndexed(t, j)
}

// The claim that takes over a run whose lease ran out records that run,
// and gives the record up rather than pass Config.MaxValueBytes.
func TestHistoryOfALostRunStaysWithinMaxValueBytes(t *testing.T) {
	t.Parallel()
	const limit = 1024
	f := setup(t, &Config{MaxValueBytes: limit, Lease: time.Minute})
	c := enqueueAndClaim(t, f, "w1", make([]byte, limit-300), nil)
	slack := limit - encodedSize(c) - 20 // leave 20 bytes: less than a record
	u, err := f.q.Update(f.ctx, c.ID, func(j *Job) error {
		j.Payload = make([]byte, len(j.Payload)+slack)
		return nil
	})
	require.NoError(t, err)
	require.LessOrEqual(t, encodedSize(u), limit)
	require.Greater(t, encodedSize(u), limit-40)
	f.clock.Advance(2 * time.Minute) // w1 died
	c2, err := f.q.Claim(f.ctx, "w2")
	require.NoError(t, err)
	require.Equal(t, c.ID, c2.ID)
	n, err := f.rdb.StrLen(f.ctx, f.q.Keys(c.ID).Job).Result()
	require.NoError(t, err)
	require.LessOrEqual(t, n, int64(limit))
	require.Empty(t, c2.History)
	require.Equal(t, 1, c2.HistoryDropped, "the lost run's record is counted as dropped")
}
