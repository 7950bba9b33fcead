package jobkey

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Each bucket counts exactly the jobs whose values say they finished in
// it, by state, and the jobs scheduled in it ahead of now: counted from the
// values read one by one, not from what Throughput read.
func TestThroughputCountsEachBucketsFinishesAndSchedulesFromTheIndexes(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	start := f.clock.Now()
	var ids []string
	enqueue := func(o *EnqueueOpts) {
		j, err := f.q.Enqueue(f.ctx, "t", nil, o)
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	// Minute by minute: k jobs succeed, one fails for good, one is canceled.
	for minute := range 5 {
		for range minute + 1 {
			enqueue(&EnqueueOpts{MaxAttempts: 1})
			j, err := f.q.Claim(f.ctx, "w")
			require.NoError(t, err)
			if minute%2 == 0 {
				_, err = f.q.Complete(f.ctx, j, nil)
			} else {
				_, err = f.q.Fail(f.ctx, j, errors.New("boom"))
			}
			require.NoError(t, err)
		}
		enqueue(&EnqueueOpts{Delay: time.Hour})
		_, err := f.q.Cancel(f.ctx, ids[len(ids)-1])
		require.NoError(t, err)
		f.clock.Advance(time.Minute)
	}
	// Scheduled ahead: 2 in 3 minutes, 3 in 7.
	for range 2 {
		enqueue(&EnqueueOpts{Delay: 3*time.Minute + time.Second})
	}
	for range 3 {
		enqueue(&EnqueueOpts{Delay: 7*time.Minute + time.Second})
	}

	th, err := f.q.Throughput(f.ctx, start.Add(-2*time.Minute), f.clock.Now().Add(10*time.Minute), time.Minute)
	require.NoError(t, err)
	require.Equal(t, start.Add(-2*time.Minute), th.From)
	require.Len(t, th.Buckets, 17)

	want := make([]ThroughputBucket, len(th.Buckets))
	for i := range want {
		want[i].Start = th.From.Add(time.Duration(i) * time.Minute)
	}
	bucket := func(at time.Time) *ThroughputBucket {
		i := int(at.Sub(th.From) / time.Minute)
		require.True(t, i >= 0 && i < len(want), "%v outside %v..%v", at, th.From, th.To)
		return &want[i]
	}
	for _, id := range ids {
		j, err := f.q.Get(f.ctx, id)
		require.NoError(t, err)
		switch j.State {
		case StateSucceeded:
			bucket(j.UpdatedAt).Succeeded++
		case StateFailed:
			bucket(j.UpdatedAt).Failed++
		case StateCanceled:
			bucket(j.UpdatedAt).Canceled++
		case StatePending:
			bucket(j.RunAt).Scheduled++
		default:
			t.Fatalf("job %s is %s", id, j.State)
		}
	}
	require.Equal(t, want, th.Buckets)
	var total ThroughputBucket
	for _, b := range th.Buckets {
		total.Succeeded += b.Succeeded
		total.Failed += b.Failed
		total.Canceled += b.Canceled
		total.Scheduled += b.Scheduled
	}
	require.Equal(t, ThroughputBucket{Succeeded: 1 + 3 + 5, Failed: 2 + 4, Canceled: 5, Scheduled: 5}, total)
	require.Equal(t, th.Now.Add(-f.q.cfg.FailedRetention), th.FailedExactSince)
}

// A shard that cannot be read leaves the others' counts, and a
// *ShardsError names it: the page of history does not fail whole.
func TestThroughputOfTheReadableShardsWhenOneIsNot(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2})
	var on [2]int
	for i := range 8 {
		j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("j%d", i)})
		require.NoError(t, err)
		_, s := f.q.ks.jobKeyOf(j.ID)
		on[s]++
		c, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		_, err = f.q.Complete(f.ctx, c, nil)
		require.NoError(t, err)
	}
	require.NoError(t, f.rdb.Del(f.ctx, f.q.ks.index(1, idxFailed)).Err())
	require.NoError(t, f.rdb.Set(f.ctx, f.q.ks.index(1, idxFailed), "x", 0).Err())

	now := f.clock.Now()
	th, err := f.q.Throughput(f.ctx, now.Add(-time.Minute), now.Add(time.Minute), time.Minute)
	var se *ShardsError
	require.ErrorAs(t, err, &se)
	require.Equal(t, []int{1}, se.Shards)
	var wt *WrongTypeError
	require.ErrorAs(t, se.Errs[0], &wt)
	var ok int64
	for _, b := range th.Buckets {
		ok += b.Succeeded
	}
	require.EqualValues(t, on[0], ok, "shard 0's finishes, and none of shard 1's")
}

func TestThroughputRefusesABadRange(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	now := f.clock.Now()
	for _, c := range []struct {
		from, to time.Time
		step     time.Duration
	}{
		{now, now.Add(time.Hour), 0},
		{now, now.Add(time.Hour), time.Microsecond},
		{now, now, time.Minute},
		{now.Add(time.Hour), now, time.Minute},
		{now, now.Add(MaxThroughputBuckets*time.Minute + time.Minute), time.Minute},
	} {
		_, err := f.q.Throughput(f.ctx, c.from, c.to, c.step)
		require.ErrorIs(t, err, ErrInvalid, "%v..%v by %v", c.from, c.to, c.step)
	}
}

// A range across 1970-01-01 has buckets a step apart through it: the
// bucket that starts at the epoch starts there, not at the zero Time.
func TestThroughputAcrossTheEpochKeepsItsBucketsAStepApart(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	epoch := time.Unix(0, 0).UTC()
	th, err := f.q.Throughput(f.ctx, epoch.Add(-2*time.Minute), epoch.Add(2*time.Minute), time.Minute)
	require.NoError(t, err)
	require.Equal(t, epoch.Add(-2*time.Minute), th.From)
	require.Equal(t, epoch.Add(2*time.Minute), th.To)
	require.Len(t, th.Buckets, 4)
	for i, b := range th.Buckets {
		require.Equal(t, epoch.Add(time.Duration(i-2)*time.Minute), b.Start, "bucket %d", i)
	}
	th, err = f.q.Throughput(f.ctx, epoch, epoch.Add(time.Minute), time.Minute)
	require.NoError(t, err)
	require.Equal(t, epoch, th.From)
}

// Times beyond what milliseconds since 1970 can span are refused, never a
// panic or a wrapped range.
func TestThroughputRefusesTimesBeyondMilliseconds(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	now := f.clock.Now()
	far := time.Date(300_000_000, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		from, to time.Time
		step     time.Duration
	}{
		{time.UnixMilli(math.MinInt64 + 1), time.UnixMilli(math.MaxInt64 - 1), time.Millisecond},
		{time.UnixMilli(math.MinInt64 + 1), now, time.Duration(math.MaxInt64)},
		{now, time.UnixMilli(math.MaxInt64 - 1), time.Duration(math.MaxInt64)},
		{now, far, time.Duration(math.MaxInt64)},
		{far.AddDate(-600_000_000, 0, 0), now, time.Duration(math.MaxInt64)},
	} {
		require.NotPanics(t, func() {
			_, err := f.q.Throughput(f.ctx, c.from, c.to, c.step)
			require.ErrorIs(t, err, ErrInvalid, "%v..%v by %v", c.from, c.to, c.step)
		})
	}
}

// A job with a Retention of its own counts that Retention less the
// queue's after its finish: later for a longer one, earlier for a shorter
// one, as Throughput's doc says.
func TestThroughputCountsAJobWithItsOwnRetentionShiftedEitherWay(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Retention: time.Hour})
	finished := f.clock.Now()
	for _, r := range []time.Duration{3 * time.Hour, 20 * time.Minute} {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{Retention: r})
		require.NoError(t, err)
		j, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		_, err = f.q.Complete(f.ctx, j, nil)
		require.NoError(t, err)
	}
	th, err := f.q.Throughput(f.ctx, finished.Add(-3*time.Hour), finished.Add(3*time.Hour), time.Minute)
	require.NoError(t, err)
	at := map[time.Duration]int64{}
	for _, b := range th.Buckets {
		if b.Succeeded > 0 {
			at[b.Start.Sub(finished.Truncate(time.Minute))] += b.Succeeded
		}
	}
	require.Equal(t, map[time.Duration]int64{2 * time.Hour: 1, -40 * time.Minute: 1}, at)
}
