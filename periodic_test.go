package jobkey

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/require"
)

func TestScheduleTicks(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 12, 34, 56, 789e6, time.UTC)
	require.Equal(t, time.Date(2026, 11, 30, 13, 0, 0, 0, time.UTC), Every(time.Hour).Next(at))
	require.Equal(t, time.Date(2026, 11, 30, 12, 35, 0, 0, time.UTC), Every(5*time.Second).Next(at))
	require.Equal(t, time.Date(2026, 11, 30, 12, 34, 56, 800e6, time.UTC), Every(100*time.Millisecond).Next(at))
	require.True(t, Every(0).Next(at).IsZero())

	require.Equal(t, time.Date(2026, 11, 30, 12, 34, 55, 0, time.UTC), lastTick(Every(5*time.Second), at))
	require.Equal(t, time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC), lastTick(Every(24*time.Hour), at))
	// A cron schedule serves as it is.
	var s Schedule
	s, err := cron.ParseStandard("15 3 * * *")
	require.NoError(t, err)
	require.Equal(t, time.Date(2026, 11, 30, 3, 15, 0, 0, time.UTC), lastTick(s, at))
	s, err = cron.ParseStandard("0 0 1 1 *") // once a year: the look back doubles that far
	require.NoError(t, err)
	require.Equal(t, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), lastTick(s, at))
	require.True(t, lastTick(never{}, at).IsZero())

	require.Equal(t, "periodic:report:1764506096", periodicID("report", time.Unix(1764506096, 0)))
	require.Equal(t, "periodic:report:1764506096.250", periodicID("report", time.UnixMilli(1764506096250)))
}

type never struct{}

func (never) Next(time.Time) time.Time { return time.Time{} }

func TestPeriodicRefusesBadJobs(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	h := HandlerFunc(func(context.Context, *Job) ([]byte, error) { return nil, nil })
	ok := PeriodicJob{Name: "p", Schedule: Every(time.Second), Type: "t"}
	for _, p := range [][]PeriodicJob{
		{{Schedule: Every(time.Second), Type: "t"}},
		{{Name: "a{b}", Schedule: Every(time.Second), Type: "t"}},
		{{Name: "p", Type: "t"}},
		{{Name: "p", Schedule: Every(time.Second)}},
		{ok, ok},
		{{Name: "p", Schedule: Every(time.Second), Type: "t", Opts: &EnqueueOpts{ID: "x"}}},
		{{Name: "p", Schedule: Every(time.Second), Type: "t", Opts: &EnqueueOpts{Delay: time.Second}}},
	} {
		err := f.q.Work(f.ctx, h, &WorkOpts{Periodic: p})
		require.ErrorIs(t, err, ErrInvalid, "%+v", p)
	}
}

// periodicProcess is one worker process running a shared schedule.
type periodicProcess struct {
	stop context.CancelFunc
	done chan error
}

func startPeriodic(t *testing.T, prefix, name string, sched Schedule, ran func(id string)) *periodicProcess {
	t.Helper()
	q, err := NewQueue(redistest.Client(t, nil), "q", &Config{Prefix: prefix, Logger: quiet})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	p := &periodicProcess{stop: stop, done: make(chan error, 1)}
	go func() {
		p.done <- q.Work(ctx, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
			ran(j.ID)
			return nil, nil
		}), &WorkOpts{Name: name, Concurrency: 2, Logger: quiet,
			Periodic: []PeriodicJob{{Name: "tick", Schedule: sched, Type: "t"}}})
	}()
	return p
}

func (p *periodicProcess) halt(t *testing.T) {
	t.Helper()
	p.stop()
	require.NoError(t, <-p.done)
}

// Three processes run one schedule with no leader; one is stopped and
// started again midway. Every tick of the window has exactly one job, run
// once.
func TestPeriodicLeaderless(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	const every = 200 * time.Millisecond
	sched := Every(every)
	var mu sync.Mutex
	runs := map[string]int{}
	ran := func(id string) { mu.Lock(); runs[id]++; mu.Unlock() }

	procs := []*periodicProcess{
		startPeriodic(t, prefix, "a", sched, ran),
		startPeriodic(t, prefix, "b", sched, ran),
		startPeriodic(t, prefix, "c", sched, ran),
	}
	q, err := NewQueue(redistest.Client(t, nil), "q", &Config{Prefix: prefix})
	require.NoError(t, err)
	// The window opens at the first tick the running processes enqueued:
	// starting up (slower under -race) may outlast a 200 ms tick, and a
	// tick before any process ran is not theirs to enqueue.
	var start time.Time
	require.Eventually(t, func() bool {
		page, err := q.List(context.Background(), ListOpts{State: StateSucceeded, Limit: MaxListLimit})
		require.NoError(t, err)
		for _, j := range page.Jobs {
			if start.IsZero() || j.RunAt.Before(start) {
				start = j.RunAt
			}
		}
		return !start.IsZero()
	}, 5*time.Second, 10*time.Millisecond)
	time.Sleep(time.Second)
	procs[1].halt(t)
	time.Sleep(700 * time.Millisecond)
	procs[1] = startPeriodic(t, prefix, "b2", sched, ran)
	time.Sleep(time.Second)
	end := time.Now()
	// The last tick's job runs before the processes stop.
	last := lastTick(sched, end.Add(-50*time.Millisecond))
	require.Eventually(t, func() bool {
		j, err := q.Get(context.Background(), periodicID("tick", last))
		return err == nil && j.State == StateSucceeded
	}, 5*time.Second, 10*time.Millisecond)
	for _, p := range procs {
		p.halt(t)
	}

	mu.Lock()
	defer mu.Unlock()
	n := 0
	for tick := start; !tick.After(last); tick = sched.Next(tick) {
		id := periodicID("tick", tick)
		j, err := q.Get(context.Background(), id)
		require.NoError(t, err, "tick %s has no job", id)
		require.Equal(t, StateSucceeded, j.State, id)
		require.Equal(t, 1, runs[id], "tick %s ran %d times", id, runs[id])
		n++
	}
	require.GreaterOrEqual(t, n, 12, "ticks in the window")
	st, err := q.Stats(context.Background())
	require.NoError(t, err)
	require.LessOrEqual(t, st.Succeeded, int64(n+1), "no job outside the ticks (the one after the window may have run)")
	t.Logf("%d ticks, each one job run once", n)
}

// A process that comes back after missing ticks enqueues the latest one
// only, not a backlog.
func TestPeriodicMissedTicksDoNotFlood(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	const every = 250 * time.Millisecond
	sched := Every(every)
	ran := func(string) {}
	p := startPeriodic(t, prefix, "a", sched, ran)
	time.Sleep(3 * every)
	p.halt(t)
	down := time.Now()
	time.Sleep(10 * every) // about ten ticks go by
	// Start again just after a tick, so that the latest tick missed at up
	// is still the latest when the new process first looks: its start
	// (a queue, a goroutine, Work's first read) has a whole tick, less
	// 10 ms, however loaded the machine (a -race run once took over the
	// 100 ms ticks this test had).
	time.Sleep(time.Until(sched.Next(time.Now()).Add(10 * time.Millisecond)))
	up := time.Now()
	p = startPeriodic(t, prefix, "a", sched, ran)
	q, err := NewQueue(redistest.Client(t, nil), "q", &Config{Prefix: prefix})
	require.NoError(t, err)
	missed := lastTick(sched, up)
	require.Eventually(t, func() bool {
		_, err := q.Get(context.Background(), periodicID("tick", missed))
		return err == nil
	}, 5*time.Second, 10*time.Millisecond, "the latest missed tick is enqueued")
	p.halt(t)
	gap := 0
	for tick := sched.Next(down.Add(every)); tick.Before(missed); tick = sched.Next(tick) {
		_, err := q.Get(context.Background(), periodicID("tick", tick))
		if !errors.Is(err, ErrNotFound) {
			gap++
			t.Errorf("tick %s, missed while down, was enqueued (%v)", periodicID("tick", tick), err)
		}
	}
	require.Zero(t, gap)
}
