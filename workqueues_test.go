package jobkey

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// weightedQueues returns queues named names on f's Redis, under f's prefix,
// on Redis's real clock.
func weightedQueues(t *testing.T, f *fixture, names ...string) []*Queue {
	t.Helper()
	f.q.clock.Fake = nil
	qs := []*Queue{}
	for _, n := range names {
		q, err := NewQueue(f.rdb, n, &Config{Prefix: f.q.cfg.Prefix, Lease: 10 * time.Second, Logger: quietLog()})
		require.NoError(t, err)
		qs = append(qs, q)
	}
	return qs
}

// fill enqueues n jobs of type typ on q.
func fill(t *testing.T, q *Queue, typ string, n int) {
	t.Helper()
	specs := make([]JobSpec, n)
	for i := range specs {
		specs[i] = JobSpec{Type: typ}
	}
	_, err := q.EnqueueMany(context.Background(), specs)
	require.NoError(t, err)
}

// With jobs in every queue, the runners are shared by weight: the heavier
// queue runs more of the first jobs, and the lightest still runs some.
func TestWorkQueuesSharesRunnersByWeight(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	qs := weightedQueues(t, f, "critical", "default", "low")
	for i, q := range qs {
		fill(t, q, q.Name(), 150+i)
	}
	var mu sync.Mutex
	var order []string
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		mu.Lock()
		order = append(order, j.Type)
		n := len(order)
		mu.Unlock()
		if n >= 200 {
			cancel()
		}
		time.Sleep(time.Millisecond)
		return nil, nil
	})
	err := WorkQueues(ctx, h, []WeightedQueue{{qs[0], 6}, {qs[1], 3}, {qs[2], 1}}, &WorkQueuesOpts{WorkOpts: WorkOpts{Concurrency: 6, PollInterval: 50 * time.Millisecond}})
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	count := map[string]int{}
	for _, typ := range order[:200] {
		count[typ]++
	}
	t.Logf("of the first 200 runs: %v", count)
	require.Greater(t, count["critical"], count["default"], "weight 6 runs more than weight 3")
	require.Greater(t, count["default"], count["low"], "weight 3 runs more than weight 1")
	require.Positive(t, count["low"], "weight 1 is not starved")
}

// A queue alone with jobs uses every runner: the idle queues lend theirs.
func TestWorkQueuesLendsIdleQueuesRunners(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	qs := weightedQueues(t, f, "critical", "default", "low")
	const jobs, runners = 120, 8
	fill(t, qs[1], "d", jobs)
	var running, peak, done atomic.Int64
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(20 * time.Millisecond)
		running.Add(-1)
		if done.Add(1) == jobs {
			cancel()
		}
		return nil, nil
	})
	err := WorkQueues(ctx, h, []WeightedQueue{{qs[0], 6}, {qs[1], 3}, {qs[2], 1}}, &WorkQueuesOpts{WorkOpts: WorkOpts{Concurrency: runners, PollInterval: 50 * time.Millisecond}})
	require.NoError(t, err)
	require.EqualValues(t, jobs, done.Load())
	require.EqualValues(t, runners, peak.Load(), "the busy queue used every runner, and no more")
}

// Concurrency bounds the handlers of all the queues together.
func TestWorkQueuesConcurrencyBoundsAllQueues(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	qs := weightedQueues(t, f, "a", "b", "c")
	const per, runners = 40, 5
	for _, q := range qs {
		fill(t, q, q.Name(), per)
	}
	var running, peak, done atomic.Int64
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(3 * time.Millisecond)
		running.Add(-1)
		if done.Add(1) == 3*per {
			cancel()
		}
		return nil, nil
	})
	require.NoError(t, WorkQueues(ctx, h, []WeightedQueue{{qs[0], 1}, {qs[1], 1}, {qs[2], 1}},
		&WorkQueuesOpts{WorkOpts: WorkOpts{Concurrency: runners, PollInterval: 50 * time.Millisecond}}))
	require.EqualValues(t, 3*per, done.Load())
	require.LessOrEqual(t, peak.Load(), int64(runners), "never more handlers at once than Concurrency, over all the queues")
	for _, q := range qs {
		st, err := q.Stats(f.ctx)
		require.NoError(t, err)
		require.EqualValues(t, per, st.Succeeded, "queue %s", q.Name())
	}
}

// With StrictPriority, a lighter queue runs only what the heavier ones
// leave: once the runners have started, no low job starts while a
// critical one is due.
func TestWorkQueuesStrictPriority(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	qs := weightedQueues(t, f, "critical", "low")
	const jobs, runners = 60, 4
	fill(t, qs[0], "critical", jobs)
	fill(t, qs[1], "low", jobs)
	var mu sync.Mutex
	var order []string
	var done atomic.Int64
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		mu.Lock()
		order = append(order, j.Type)
		mu.Unlock()
		time.Sleep(time.Millisecond)
		if done.Add(1) == 2*jobs {
			cancel()
		}
		return nil, nil
	})
	require.NoError(t, WorkQueues(ctx, h, []WeightedQueue{{qs[0], 2}, {qs[1], 1}},
		&WorkQueuesOpts{WorkOpts: WorkOpts{Concurrency: runners, PollInterval: 50 * time.Millisecond}, StrictPriority: true}))
	mu.Lock()
	defer mu.Unlock()
	last := 0
	for i, typ := range order {
		if typ == "critical" {
			last = i
		}
	}
	low := 0
	for _, typ := range order[:last] {
		if typ == "low" {
			low++
		}
	}
	t.Logf("low jobs run before the last critical one: %d", low)
	require.LessOrEqual(t, low, runners, "only the runners that started on the low queue, before the critical one competed")
}

// Each queue keeps its own config: a paused queue runs nothing while the
// others run, and its jobs run once it resumes.
func TestWorkQueuesEachQueueKeepsItsPause(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	qs := weightedQueues(t, f, "on", "off")
	require.NoError(t, qs[1].Pause(f.ctx))
	fill(t, qs[0], "on", 20)
	fill(t, qs[1], "off", 20)
	var on, off, offBeforeResume atomic.Int64
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		if j.Type == "on" {
			if on.Add(1) == 20 {
				offBeforeResume.Store(off.Load())
				if err := qs[1].Resume(context.WithoutCancel(ctx)); err != nil {
					return nil, err
				}
			}
		} else if off.Add(1) == 20 {
			cancel()
		}
		return nil, nil
	})
	require.NoError(t, WorkQueues(ctx, h, []WeightedQueue{{qs[0], 1}, {qs[1], 1}},
		&WorkQueuesOpts{WorkOpts: WorkOpts{Concurrency: 3, PollInterval: 50 * time.Millisecond}}))
	require.EqualValues(t, 20, on.Load())
	require.Zero(t, offBeforeResume.Load(), "the paused queue ran nothing")
	require.EqualValues(t, 20, off.Load(), "and all of its jobs once resumed")
}

// An idle queue beside a busy one costs about one claim per PollInterval,
// not one per runner, and takes no runner from the busy queue for it.
func TestWorkQueuesIdleQueueCostsFewRoundTrips(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	busy := weightedQueues(t, f, "busy")[0]
	rdb, hook := hooked(t, 0)
	idle, err := NewQueue(rdb, "idle", &Config{Prefix: f.q.cfg.Prefix, Lease: 10 * time.Second, Logger: quietLog()})
	require.NoError(t, err)
	const jobs, runners, poll = 400, 6, 100 * time.Millisecond
	fill(t, busy, "b", jobs)
	var done atomic.Int64
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		time.Sleep(2 * time.Millisecond)
		if done.Add(1) == jobs {
			cancel()
		}
		return nil, nil
	})
	start := time.Now()
	require.NoError(t, WorkQueues(ctx, h, []WeightedQueue{{busy, 1}, {idle, 1}},
		&WorkQueuesOpts{WorkOpts: WorkOpts{Concurrency: runners, PollInterval: poll, TrimInterval: -1}}))
	took := time.Since(start)
	polls := int64(took/poll) + 1
	rtt := hook.RTT.Load()
	t.Logf("%d jobs in %v; the idle queue made %d round trips (%d PollIntervals)", jobs, took.Round(time.Millisecond), rtt, polls)
	// Each of its claims costs at most 3 round trips and the wait that
	// follows one more (untilDue); its runners' first claims come before
	// it is known idle.
	require.LessOrEqual(t, rtt, 4*(runners+2*polls), "about one claim per PollInterval")
}

func TestWorkQueuesRefusesWhatItCannotRun(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	qs := weightedQueues(t, f, "a", "b")
	twin, err := NewQueue(f.rdb, "a", &Config{Prefix: f.q.cfg.Prefix})
	require.NoError(t, err)
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) { return nil, nil })
	ctx, cancel := context.WithCancel(f.ctx)
	cancel()
	for name, c := range map[string]struct {
		h    Handler
		qs   []WeightedQueue
		opts *WorkQueuesOpts
	}{
		"nil handler":  {nil, []WeightedQueue{{qs[0], 1}}, nil},
		"no queue":     {h, nil, nil},
		"nil queue":    {h, []WeightedQueue{{nil, 1}}, nil},
		"weight 0":     {h, []WeightedQueue{{qs[0], 0}}, nil},
		"weight high":  {h, []WeightedQueue{{qs[0], MaxQueueWeight + 1}}, nil},
		"twice":        {h, []WeightedQueue{{qs[0], 1}, {twin, 2}}, nil},
		"periodic":     {h, []WeightedQueue{{qs[0], 1}}, &WorkQueuesOpts{WorkOpts: WorkOpts{Periodic: []PeriodicJob{{Name: "p", Type: "p", Schedule: Every(time.Minute)}}}}},
		"bad work opt": {h, []WeightedQueue{{qs[0], 1}, {qs[1], 1}}, &WorkQueuesOpts{WorkOpts: WorkOpts{Concurrency: -1}}},
	} {
		require.ErrorIs(t, WorkQueues(ctx, c.h, c.qs, c.opts), ErrInvalid, name)
	}
	require.NoError(t, WorkQueues(ctx, h, []WeightedQueue{{qs[0], 1}, {qs[1], 1}}, nil), "an ended ctx: returns at once")
}
