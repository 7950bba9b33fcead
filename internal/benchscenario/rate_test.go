package benchscenario

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// chanQueue is an in-process worker design whose Enqueue takes delay, so
// a test can make producers that cannot keep a rate.
type chanQueue struct {
	jobs  chan []byte
	delay time.Duration
}

func chanDesign(delay time.Duration) WorkerFactory {
	return func(string, redis.UniversalClient, string, int) (WorkerDesign, error) {
		return &chanQueue{jobs: make(chan []byte, 10_000), delay: delay}, nil
	}
}

func (q *chanQueue) Enqueue(ctx context.Context, payload []byte) error {
	time.Sleep(q.delay)
	select {
	case q.jobs <- payload:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (q *chanQueue) Work(ctx context.Context, slots int, handle func([]byte)) error {
	var wg sync.WaitGroup
	for range slots {
		wg.Go(func() {
			for {
				select {
				case b := <-q.jobs:
					handle(b)
				case <-ctx.Done():
					return
				}
			}
		})
	}
	wg.Wait()
	return nil
}

func (q *chanQueue) Close() {}

// Producers that keep the rate send no faster than it, measure a latency
// for every percentile, and are said to have kept it.
func TestBoundedRateProducersKeepTheirSchedule(t *testing.T) {
	t.Parallel()
	url := redistest.RequireReal(t).URL
	const rate, ops = 1000.0, 300
	// A stall of the whole process on a loaded machine puts a run behind:
	// one of three runs must keep the rate.
	var r WorkResult
	for range 3 {
		var err error
		r, err = RunWorkWith(context.Background(), url, "chan",
			WorkParams{Scenario: BoundedRate, Rate: rate, Ops: ops, Producers: 4, Slots: 2}, chanDesign(0))
		require.NoError(t, err)
		require.NotNil(t, r.Pacing)
		if r.Pacing.Kept {
			break
		}
		t.Logf("ended %v behind, lag up to %v", r.Pacing.EndLag, r.Pacing.LagMax)
	}
	require.True(t, r.Pacing.Kept)
	require.EqualValues(t, ops, r.Jobs)
	require.InDelta(t, DefaultRateSlack, r.Pacing.Slack, 0)
	require.InDelta(t, rate, r.Pacing.Rate, 0)
	require.LessOrEqual(t, r.Pacing.Sent, rate*1.0001, "no job goes out before its time")
	require.Positive(t, r.Pacing.Sent)
	require.GreaterOrEqual(t, r.Elapsed, time.Duration(float64(ops-1)/rate*float64(time.Second)), "the schedule sets the pace")
	require.Positive(t, r.P50)
	require.GreaterOrEqual(t, r.P99, r.P50)
	require.GreaterOrEqual(t, r.P999, r.P99)
}

// A producer that cannot keep the rate is flagged, and every late job's
// latency counts from when it should have gone out, not from when its
// enqueue began: the lag is in the latency (no coordinated omission).
func TestBoundedRateCountsLatencyFromTheIntendedSendTime(t *testing.T) {
	t.Parallel()
	url := redistest.RequireReal(t).URL
	// One producer whose enqueue takes 5 ms cannot send 1000 jobs/s: the
	// 60th job is due at 59 ms and begins at about 295 ms.
	r, err := RunWorkWith(context.Background(), url, "chan",
		WorkParams{Scenario: BoundedRate, Rate: 1000, Ops: 60, Producers: 1, Slots: 2},
		chanDesign(5*time.Millisecond))
	require.NoError(t, err)
	require.False(t, r.Pacing.Kept)
	require.Greater(t, r.Pacing.EndLag, 150*time.Millisecond)
	require.Greater(t, r.Pacing.LagMax, 150*time.Millisecond)
	require.Less(t, r.Pacing.Sent, 500.0)
	require.GreaterOrEqual(t, r.P99, r.Pacing.LagMax, "the last job's latency holds its lag and its 5 ms enqueue")
}

// The bounded-rate scenario needs a rate: without one there is no schedule.
func TestBoundedRateNeedsARate(t *testing.T) {
	t.Parallel()
	url := redistest.RequireReal(t).URL
	_, err := RunWorkWith(context.Background(), url, "chan", WorkParams{Scenario: BoundedRate, Ops: 10}, chanDesign(0))
	require.ErrorContains(t, err, "needs a rate")
}

// A stall the producers recover from shows in the lag but keeps the rate;
// producers that fall further behind with every job do not keep it, and
// no run is judged on an end lag under 100 ms.
func TestPacingTellsAStallFromARateNotKept(t *testing.T) {
	t.Parallel()
	const jobs = 5000 // at 1000 jobs/s: a 5 s schedule, 2% of it 100 ms
	sched := func(lag func(i int) time.Duration) *schedule {
		s := &schedule{start: time.Unix(1000, 0), rate: 1000, lag: make([]time.Duration, jobs)}
		for i := range s.lag {
			s.lag[i] = lag(i)
		}
		return s
	}
	stall := sched(func(i int) time.Duration {
		if i >= 2000 && i < 2300 { // 300 ms stopped, then caught up
			return time.Duration(2300-i) * time.Millisecond
		}
		return 0
	}).pacing(DefaultRateSlack)
	require.True(t, stall.Kept)
	require.Equal(t, 300*time.Millisecond, stall.LagMax)
	require.Zero(t, stall.EndLag)
	require.InDelta(t, 1000, stall.Sent, 0.01)

	behind := sched(func(i int) time.Duration { return time.Duration(i) * 50 * time.Microsecond }).pacing(DefaultRateSlack)
	require.False(t, behind.Kept, "%v behind at the end", behind.EndLag)
	require.InDelta(t, 250*time.Millisecond, behind.EndLag, float64(time.Millisecond))
	require.Less(t, behind.Sent, 960.0)

	wider := sched(func(i int) time.Duration { return time.Duration(i) * 50 * time.Microsecond }).pacing(0.1)
	require.True(t, wider.Kept, "within 10%% of a 5 s schedule")

	short := &schedule{start: time.Unix(1000, 0), rate: 1000, lag: make([]time.Duration, 100)}
	short.lag[99] = 90 * time.Millisecond
	require.True(t, short.pacing(DefaultRateSlack).Kept, "90 ms behind a 0.1 s schedule is under the floor")
	short.lag[99] = 110 * time.Millisecond
	require.False(t, short.pacing(DefaultRateSlack).Kept)
}
