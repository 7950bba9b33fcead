package jobkey

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
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
	q := queueOn(t, redistest.Client(t, nil), prefix, Config{Logger: quiet})
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
// once. (A process that wakes after two ticks went by enqueues the later
// only, by design: the ticks are far enough apart that on a loaded machine
// one of the three wakes for each.)
func TestPeriodicLeaderless(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	const every = 500 * time.Millisecond
	sched := Every(every)
	runs := newRunsByID()
	ran := runs.ran

	procs := []*periodicProcess{
		startPeriodic(t, prefix, "a", sched, ran),
		startPeriodic(t, prefix, "b", sched, ran),
		startPeriodic(t, prefix, "c", sched, ran),
	}
	q := queueOn(t, redistest.Client(t, nil), prefix, Config{})
	// The window opens at the first tick the running processes enqueued:
	// starting up (slower under -race) may outlast a tick, and a
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
	time.Sleep(5 * every)
	procs[1].halt(t)
	time.Sleep(7 * every / 2)
	procs[1] = startPeriodic(t, prefix, "b2", sched, ran)
	time.Sleep(5 * every)
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

	ranByID := runs.snapshot()
	n := 0
	for tick := start; !tick.After(last); tick = sched.Next(tick) {
		id := periodicID("tick", tick)
		j, err := q.Get(context.Background(), id)
		require.NoError(t, err, "tick %s has no job", id)
		require.Equal(t, StateSucceeded, j.State, id)
		require.Equal(t, 1, ranByID[id], "tick %s ran %d times", id, ranByID[id])
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
	p := startPeriodic(t, prefix, "a", sched, func(string) {})
	time.Sleep(3 * every)
	// The new process is started just after a tick, so that its start (a
	// queue, a goroutine, Work's first read) has a whole tick before the
	// next one. On a loaded machine it may take longer: then the latest
	// tick when it first looks is a later one, which is right but shows
	// nothing of the catch-up, and the process is stopped and started
	// again. Every attempt holds that no missed tick before the one it
	// enqueued was.
	for attempt := 1; ; attempt++ {
		var caughtUp bool
		p, caughtUp = restartAfterMissedTicks(t, prefix, sched, every, p)
		if caughtUp {
			break
		}
		require.Less(t, attempt, 5, "in every attempt the new process first looked a tick late")
	}
	p.halt(t)
}

// restartAfterMissedTicks stops p, lets about ten ticks of sched (one
// each every) go by, and starts a new process just after a tick. It checks
// that the first tick enqueued since then is the latest tick at the new
// process's start or a later one, and that none of the ticks missed
// before it was enqueued; it returns the new process, and whether that
// first tick was the one missed at its start (the catch-up).
func restartAfterMissedTicks(t *testing.T, prefix string, sched Schedule, every time.Duration, p *periodicProcess) (*periodicProcess, bool) {
	t.Helper()
	p.halt(t)
	down := time.Now()
	time.Sleep(10 * every)
	time.Sleep(time.Until(sched.Next(time.Now()).Add(10 * time.Millisecond)))
	up := time.Now()
	p = startPeriodic(t, prefix, "a", sched, func(string) {})
	q := queueOn(t, redistest.Client(t, nil), prefix, Config{})
	missed := lastTick(sched, up)
	var first time.Time // the first tick enqueued since up
	require.Eventually(t, func() bool {
		for tick := missed; !tick.After(time.Now()); tick = sched.Next(tick) {
			if _, err := q.Get(context.Background(), periodicID("tick", tick)); err == nil {
				first = tick
				return true
			}
		}
		return false
	}, 5*time.Second, 10*time.Millisecond, "a tick is enqueued after the restart")
	if first.After(missed) {
		t.Logf("the new process first looked after tick %s: it enqueued %s", periodicID("tick", missed), periodicID("tick", first))
	}
	gap := 0
	for tick := sched.Next(down.Add(every)); tick.Before(first); tick = sched.Next(tick) {
		_, err := q.Get(context.Background(), periodicID("tick", tick))
		if !errors.Is(err, ErrNotFound) {
			gap++
			t.Errorf("tick %s, missed while down, was enqueued (%v)", periodicID("tick", tick), err)
		}
	}
	require.Zero(t, gap)
	return p, first.Equal(missed)
}

// runPeriodic runs q.Work with periodic jobs ps until the returned stop is
// called; stop returns Work's error.
func runPeriodic(q *Queue, h Handler, ps []PeriodicJob) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, h, &WorkOpts{Concurrency: 2, Logger: quietLog(), PollInterval: 50 * time.Millisecond, Periodic: ps})
	}()
	return func() error { cancel(); return <-done }
}

// workErr runs Work with ps for at most 300 ms and returns its error: a
// refused periodic job returns at once.
func workErr(q *Queue, ps []PeriodicJob) error {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	return q.Work(ctx, HandlerFunc(func(context.Context, *Job) ([]byte, error) { return nil, nil }),
		&WorkOpts{Concurrency: 1, Logger: quietLog(), Periodic: ps})
}

// Work refuses, before it starts, a periodic job whose options Enqueue
// would refuse: every tick of it would be refused and retried for ever.
func TestPeriodicRefusesOptionsEnqueueRefuses(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4, MaxValueBytes: 4096})
	for _, c := range []struct {
		opts    *EnqueueOpts
		payload []byte
		want    error
	}{
		{opts: &EnqueueOpts{Priority: MaxPriority + 1}, want: ErrInvalid},
		{opts: &EnqueueOpts{ConcurrencyKey: "a{b}"}, want: ErrInvalid},
		{opts: &EnqueueOpts{Timeout: -time.Second}, want: ErrInvalid},
		{opts: &EnqueueOpts{Meta: map[string]string{"": "x"}}, want: ErrInvalid},
		{opts: &EnqueueOpts{MaxAttempts: -1}, want: ErrInvalid},
		{payload: make([]byte, 4096), want: ErrTooLarge},
	} {
		p := PeriodicJob{Name: "p", Schedule: Every(time.Second), Type: "t", Payload: c.payload, Opts: c.opts}
		err := workErr(f.q, []PeriodicJob{p})
		require.ErrorIs(t, err, c.want, "%+v", c.opts)
		require.ErrorContains(t, err, `PeriodicJob "p"`)
	}
	// The same options, valid, are accepted (and a keyed tick placed by
	// IDFor fits).
	p := PeriodicJob{Name: "p", Schedule: Every(time.Hour), Type: "t", Payload: make([]byte, 3000),
		Opts: &EnqueueOpts{Priority: MaxPriority, ConcurrencyKey: "k", Timeout: time.Second, Meta: map[string]string{"a": "b"}, MaxAttempts: 2}}
	require.NoError(t, workErr(f.q, []PeriodicJob{p}))
}

// ptrSchedule is a schedule whose Next reads through its pointer.
type ptrSchedule struct{ every time.Duration }

func (s *ptrSchedule) Next(t time.Time) time.Time { return Every(s.every).Next(t) }

// Work refuses a Schedule that holds a nil pointer, instead of running it
// in a goroutine where its panic would take the process down.
func TestPeriodicRefusesNilSchedulePointer(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	var s *ptrSchedule
	err := workErr(f.q, []PeriodicJob{{Name: "p", Schedule: s, Type: "t"}})
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "nil *jobkey.ptrSchedule")
	require.NoError(t, workErr(f.q, []PeriodicJob{{Name: "p", Schedule: &ptrSchedule{every: time.Hour}, Type: "t"}}))
}

// toggled is a schedule that ticks every hour, and then, once bad is set,
// panics or ticks 100 µs apart.
type toggled struct {
	bad   *atomic.Bool
	panic bool
	calls *atomic.Int64
}

func (s toggled) Next(t time.Time) time.Time {
	s.calls.Add(1)
	switch {
	case !s.bad.Load():
		return Every(time.Hour).Next(t)
	case s.panic:
		panic("schedule broke")
	}
	return t.Add(100 * time.Microsecond)
}

// A schedule whose ticks come less than a millisecond apart is refused by
// Work (tick IDs are in milliseconds, and it would enqueue a job a
// millisecond); one that turns so while Work runs enqueues nothing until
// it ticks a millisecond apart again, and does not spin. A schedule that
// panics while Work runs does not take the process down. The hourly
// schedule asks to start with its latest tick, so that it has a job at
// once.
func TestPeriodicScheduleFasterThanAMillisecondOrPanicking(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	var bad atomic.Bool
	bad.Store(true)
	var calls atomic.Int64
	err := workErr(f.q, []PeriodicJob{{Name: "p", Schedule: toggled{bad: &bad, calls: &calls}, Type: "t"}})
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "less than a millisecond apart")
	err = workErr(f.q, []PeriodicJob{{Name: "p", Schedule: toggled{bad: &bad, panic: true, calls: &calls}, Type: "t"}})
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "panicked")

	for _, panics := range []bool{false, true} {
		prefix := redistest.Prefix(t)
		q := queueOn(t, redistest.Client(t, nil), prefix, Config{Logger: quietLog()})
		var bad atomic.Bool
		var calls atomic.Int64
		s := toggled{bad: &bad, panic: panics, calls: &calls}
		stop := runPeriodic(q, HandlerFunc(func(context.Context, *Job) ([]byte, error) { return nil, nil }),
			[]PeriodicJob{{Name: "p", Schedule: s, Type: "t", StartWithLatestTick: true}})
		require.Eventually(t, func() bool {
			st, err := q.Stats(context.Background())
			require.NoError(t, err)
			return st.Succeeded == 1
		}, 5*time.Second, 10*time.Millisecond, "the hourly tick's job")
		bad.Store(true)
		time.Sleep(100 * time.Millisecond)
		before := calls.Load()
		time.Sleep(300 * time.Millisecond)
		n := calls.Load() - before
		require.NoError(t, stop())
		require.Less(t, n, int64(100), "panics %v: Schedule.Next was called %d times in 300 ms", panics, n)
		st, err := q.Stats(context.Background())
		require.NoError(t, err)
		require.Equal(t, int64(0), st.Pending+st.Active)
		require.Equal(t, int64(1), st.Succeeded, "panics %v: no tick enqueued once the schedule went bad", panics)
	}
}

// Ticks that fall while the queue is paused are not enqueued (they would
// all run at once on Resume); on Resume the latest tick missed is, as for
// a process that was down.
func TestPeriodicTicksWhilePausedGiveOneJobOnResume(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	q := queueOn(t, redistest.Client(t, nil), prefix, Config{Logger: quietLog()})
	ctx := context.Background()
	require.NoError(t, q.Pause(ctx))
	const every = 100 * time.Millisecond
	sched := Every(every)
	stop := runPeriodic(q, HandlerFunc(func(context.Context, *Job) ([]byte, error) { return nil, nil }),
		[]PeriodicJob{{Name: "tick", Schedule: sched, Type: "t"}})
	paused := time.Now()
	time.Sleep(10 * every)
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(0), st.Pending, "no tick is enqueued while the queue is paused")
	require.NoError(t, q.Resume(ctx))
	resumed := time.Now()
	require.Eventually(t, func() bool {
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		return st.Succeeded > 0
	}, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, stop())
	// Every tick of the pause but the last two (the latest at Resume may
	// have been superseded by the next before the loop looked) has no job.
	for tick := sched.Next(paused); tick.Before(resumed.Add(-2 * every)); tick = sched.Next(tick) {
		_, err := q.Get(ctx, periodicID("tick", tick))
		require.ErrorIs(t, err, ErrNotFound, "tick %s fell while the queue was paused", periodicID("tick", tick))
	}
	st, err = q.Stats(ctx)
	require.NoError(t, err)
	require.LessOrEqual(t, st.Succeeded+st.Pending+st.Active, int64(1)+int64(time.Since(resumed)/every)+1,
		"the latest missed tick, and the ticks after Resume")
}

// once is a schedule with one tick.
type once struct{ at time.Time }

func (o once) Next(t time.Time) time.Time {
	if t.Before(o.at) {
		return o.at
	}
	return time.Time{}
}

// A tick that ran stays ran once its job is gone: deleted by
// DeleteFinished, or expired under a shorter Retention than the process
// that looks at it again. The marker written with the tick's job says so;
// with a concurrency key, the job lives in the key's shard. The schedule's
// one tick falls as the first process starts, so it asks to start with its
// latest tick.
func TestPeriodicTickStaysRanAfterItsJobIsGone(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		key       string
		retention time.Duration // of the process that runs the tick first
		gone      func(t *testing.T, q *Queue)
	}{
		{name: "deleted", gone: func(t *testing.T, q *Queue) {
			_, err := q.DeleteFinished(context.Background(), StateSucceeded, "")
			require.NoError(t, err)
		}},
		{name: "deleted keyed", key: "k", gone: func(t *testing.T, q *Queue) {
			_, err := q.DeleteFinished(context.Background(), StateSucceeded, "")
			require.NoError(t, err)
		}},
		{name: "expired", retention: time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			prefix := redistest.Prefix(t)
			ctx := context.Background()
			runs := newRunsByID()
			h := runs.handler()
			sched := once{at: time.Now().Truncate(time.Millisecond)}
			var opts *EnqueueOpts
			if c.key != "" {
				opts = &EnqueueOpts{ConcurrencyKey: c.key}
			}
			ps := []PeriodicJob{{Name: "tick", Schedule: sched, Type: "t", Opts: opts, StartWithLatestTick: true}}
			first := queueOn(t, redistest.Client(t, nil), prefix, Config{Shards: 4, Logger: quietLog(), Retention: c.retention})
			id, err := first.IDFor(c.key, periodicID("tick", sched.at))
			require.NoError(t, err)
			stop := runPeriodic(first, h, ps)
			require.Eventually(t, func() bool {
				j, err := first.Get(ctx, id)
				return err == nil && j.State == StateSucceeded
			}, 5*time.Second, 10*time.Millisecond)
			require.NoError(t, stop())
			if c.gone != nil {
				c.gone(t, first)
			}
			require.Eventually(t, func() bool {
				_, err := first.Get(ctx, id)
				return errors.Is(err, ErrNotFound)
			}, 5*time.Second, 10*time.Millisecond, "the tick's job is gone")

			// Another process, of the default Retention, looks at the tick
			// again.
			again := queueOn(t, redistest.Client(t, nil), prefix, Config{Shards: 4, Logger: quietLog()})
			stop = runPeriodic(again, h, ps)
			time.Sleep(500 * time.Millisecond)
			require.NoError(t, stop())
			_, err = again.Get(ctx, id)
			require.ErrorIs(t, err, ErrNotFound, "the tick ran: it is not enqueued again")
			require.Equal(t, map[string]int{id: 1}, runs.snapshot())
			_, shard := first.ks.jobKeyOf(id)
			if c.key != "" {
				require.Equal(t, first.ks.shardOf(c.key), shard)
			}
			mark, err := first.rdb.Get(ctx, first.ks.periodicKey(first.ks.shardOf("tick"), "tick")).Result()
			require.NoError(t, err, "the tick's marker, in its name's shard on one Redis")
			require.Equal(t, strconv.FormatInt(sched.at.UnixMilli(), 10), mark)
		})
	}
}

// A periodic marker that cannot be read is reported and kept: its tick is
// not enqueued (it cannot be told whether it ran) until the marker is
// repaired or deleted. A deleted marker makes the schedule new to Redis;
// this one asks to start with its latest tick, so that tick is enqueued
// then.
func TestPeriodicUnreadableMarkerIsKept(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	q := queueOn(t, redistest.Client(t, nil), prefix, Config{Logger: quietLog()})
	sched := once{at: time.Now().Truncate(time.Millisecond)}
	id := periodicID("tick", sched.at)
	_, shard := q.ks.jobKeyOf(id)
	marker := q.ks.periodicKey(q.markerShard("tick", shard), "tick")
	require.NoError(t, q.rdb.Set(ctx, marker, "garbage", 0).Err())
	stop := runPeriodic(q, HandlerFunc(func(context.Context, *Job) ([]byte, error) { return nil, nil }),
		[]PeriodicJob{{Name: "tick", Schedule: sched, Type: "t", StartWithLatestTick: true}})
	defer func() { require.NoError(t, stop()) }()
	time.Sleep(300 * time.Millisecond)
	_, err := q.Get(ctx, id)
	require.ErrorIs(t, err, ErrNotFound)
	v, err := q.rdb.Get(ctx, marker).Result()
	require.NoError(t, err)
	require.Equal(t, "garbage", v, "kept as it is")
	require.NoError(t, q.rdb.Del(ctx, marker).Err())
	require.Eventually(t, func() bool {
		_, err := q.Get(ctx, id)
		return err == nil
	}, 5*time.Second, 10*time.Millisecond, "enqueued once the marker is deleted")
}

// On a Redis Cluster, each tick's job and its marker share a hash slot, so
// one EXEC writes both: for an unkeyed schedule, whose ticks land in any
// shard, and a keyed one, whose ticks live in the key's shard. A tick
// whose job was deleted is not enqueued again by another process. The
// schedules' one tick falls as the first process starts, so they ask to
// start with their latest tick.
func TestClusterPeriodicTickStaysRan(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	runs := newRunsByID()
	h := runs.handler()
	at := time.Now().Truncate(time.Millisecond)
	ps := []PeriodicJob{
		{Name: "plain", Schedule: once{at: at}, Type: "t", StartWithLatestTick: true},
		{Name: "keyed", Schedule: once{at: at}, Type: "t", Opts: &EnqueueOpts{ConcurrencyKey: "tenant-a"}, StartWithLatestTick: true},
	}
	newQ := func() *Queue {
		q := queueOn(t, cl.Client(t, nil), prefix, Config{Logger: quietLog()})
		return q
	}
	q := newQ()
	var ids []string
	for _, p := range ps {
		key := ""
		if p.Opts != nil {
			key = p.Opts.ConcurrencyKey
		}
		id, err := q.IDFor(key, periodicID(p.Name, at))
		require.NoError(t, err)
		ids = append(ids, id)
	}
	stop := runPeriodic(q, h, ps)
	require.Eventually(t, func() bool {
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		return st.Succeeded == 2
	}, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, stop())
	res, err := q.DeleteFinished(ctx, StateSucceeded, "")
	require.NoError(t, err)
	require.Equal(t, 2, res.Done)

	again := newQ()
	stop = runPeriodic(again, h, ps)
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, stop())
	st, err := again.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{}, st, "no tick enqueued again")
	require.Equal(t, map[string]int{ids[0]: 1, ids[1]: 1}, runs.snapshot())
}

// A periodic job whose ConcurrencyKey changes between deploys moves its
// ticks to another shard. On a queue of several shards on one Redis, the
// tick that ran under the old options is not enqueued again under the
// new ones: neither while old and new processes run side by side, nor
// after the old ones are gone and its job was deleted. The schedule asks
// to start with its latest tick, so that its one tick is enqueued however
// slowly the first processes start.
func TestPeriodicTickRunsOnceWhenItsConcurrencyKeyChanges(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	newQ := func() *Queue {
		q := queueOn(t, redistest.Client(t, nil), prefix, Config{Shards: 8, Logger: quietLog()})
		return q
	}
	runs := newRunsByID()
	h := runs.handler()
	at := time.Now().Add(300 * time.Millisecond).Truncate(time.Millisecond)
	old := newQ()
	base := periodicID("tick", at)
	// Keys whose shards differ from each other and from the unkeyed tick's.
	var keys []string
	used := map[int]bool{old.ks.shardOf(base): true}
	for k := 0; len(keys) < 2; k++ {
		key := fmt.Sprintf("k%d", k)
		if s := old.ks.shardOf(key); !used[s] {
			used[s] = true
			keys = append(keys, key)
		}
	}
	deploy := func(key string) []PeriodicJob {
		p := PeriodicJob{Name: "tick", Schedule: once{at: at}, Type: "t", StartWithLatestTick: true}
		if key != "" {
			p.Opts = &EnqueueOpts{ConcurrencyKey: key}
		}
		return []PeriodicJob{p}
	}
	// A rolling deploy: the old options and the new run at the tick.
	stopOld := runPeriodic(old, h, deploy(""))
	stopNew := runPeriodic(newQ(), h, deploy(keys[0]))
	require.Eventually(t, func() bool { return len(runs.snapshot()) > 0 }, 5*time.Second, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, stopOld())
	require.NoError(t, stopNew())
	_, err := old.DeleteFinished(ctx, StateSucceeded, "")
	require.NoError(t, err)
	// The next deploy changes the key again.
	stop := runPeriodic(newQ(), h, deploy(keys[1]))
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, stop())
	ranByID := runs.snapshot()
	total := 0
	for _, n := range ranByID {
		total += n
	}
	require.Equal(t, 1, total, "one job per tick: %v", ranByID)
}

// blockHook fails every command and pipeline of a client while on is set:
// the process cannot reach Redis (a partition, or a process stopped).
type blockHook struct{ on *atomic.Bool }

var errBlocked = errors.New("blocked: Redis unreachable from this process")

func (h blockHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h blockHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.on.Load() {
			cmd.SetErr(errBlocked)
			return errBlocked
		}
		return next(ctx, cmd)
	}
}

func (h blockHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.on.Load() {
			for _, c := range cmds {
				c.SetErr(errBlocked)
			}
			return errBlocked
		}
		return next(ctx, cmds)
	}
}

// A process that recovers when a tick has grown older than Retention leaves
// that tick alone, as PeriodicJob's doc promises for a process that wakes
// from a pause: the tick's job may have run elsewhere and expired, and its
// ID no longer proves it ran. Here process B is cut off from Redis across
// tick T (Every 4 s, Retention 1 s) while A enqueues and runs it; the job
// expires, B recovers, and the job of tick T has run once.
func TestPeriodicSkipsTickOlderThanRetentionOnRecovery(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	prefix := redistest.Prefix(t)
	const every = 4 * time.Second
	sched := Every(every)
	runs := newRunsByID()
	h := runs.handler()
	cfg := func() *Config { return &Config{Prefix: prefix, Logger: quietLog(), Retention: time.Second} }
	start := func(name string, rdb *redis.Client) func() {
		q, err := NewQueue(rdb, "q", cfg())
		require.NoError(t, err)
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			// The schedule asks for its latest tick: T1 below is enqueued
			// even when a process first looks at the schedule just after it.
			done <- q.Work(ctx, h, &WorkOpts{Name: name, Concurrency: 1, Logger: quietLog(), PollInterval: 50 * time.Millisecond,
				Periodic: []PeriodicJob{{Name: "tick", Schedule: sched, Type: "t", StartWithLatestTick: true}}})
		}()
		return func() { stop(); require.NoError(t, <-done) }
	}
	var cut atomic.Bool
	rdbB := redistest.Client(t, nil)
	rdbB.AddHook(blockHook{on: &cut})
	stopA := start("a", redistest.Client(t, nil))
	stopB := start("b", rdbB)

	q, err := NewQueue(redistest.Client(t, nil), "q", cfg())
	require.NoError(t, err)
	ctx := context.Background()
	// Let both processes see a tick T1 (B's done becomes T1), then cut B
	// off shortly before the next tick T2.
	t1 := sched.Next(time.Now())
	require.Eventually(t, func() bool {
		_, err := q.Get(ctx, periodicID("tick", t1))
		return err == nil
	}, every+3*time.Second, 10*time.Millisecond)
	t2 := sched.Next(t1)
	time.Sleep(time.Until(t2.Add(-300 * time.Millisecond)))
	cut.Store(true)
	id2 := periodicID("tick", t2)
	// A enqueues and runs T2; its job expires with the 1s Retention.
	require.Eventually(t, func() bool { return runs.snapshot()[id2] == 1 }, 3*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		_, err := q.Get(ctx, id2)
		return errors.Is(err, ErrNotFound)
	}, 3*time.Second, 10*time.Millisecond, "the tick's job expired with Retention")
	// B comes back well before T3: T2 is now older than Retention.
	require.True(t, time.Now().Before(t2.Add(every-time.Second)), "test timing")
	cut.Store(false)
	time.Sleep(time.Until(t2.Add(every - 500*time.Millisecond)))
	stopB()
	stopA()
	ranByID := runs.snapshot()
	require.Equal(t, 1, ranByID[id2], "tick %s (older than Retention when B recovered) ran %d times", id2, ranByID[id2])
}

// stuck is a schedule whose Next does not advance: it returns the same
// time, already past, whatever it is asked.
type stuck struct {
	at    time.Time
	calls *atomic.Int64
}

func (s stuck) Next(time.Time) time.Time { s.calls.Add(1); return s.at }

// A schedule whose Next returns a time that is not after now does not make
// the periodic loop spin: a timer of a negative duration fires at once, and
// a loop that kept waiting for it would burn a core. Schedule.Next is called
// fewer than 1000 times in 300 ms.
func TestPeriodicNonAdvancingScheduleDoesNotSpin(t *testing.T) {
	redistest.RequireReal(t)
	prefix := redistest.Prefix(t)
	q := queueOn(t, redistest.Client(t, nil), prefix, Config{Logger: quietLog()})
	var calls atomic.Int64
	s := stuck{at: time.Now().Add(-10 * time.Second).Truncate(time.Second).UTC(), calls: &calls}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, HandlerFunc(func(context.Context, *Job) ([]byte, error) { return nil, nil }),
			&WorkOpts{Concurrency: 1, Logger: quietLog(), Periodic: []PeriodicJob{{Name: "stuck", Schedule: s, Type: "t"}}})
	}()
	time.Sleep(100 * time.Millisecond)
	before := calls.Load()
	time.Sleep(300 * time.Millisecond)
	n := calls.Load() - before
	stop()
	require.NoError(t, <-done)
	require.Less(t, n, int64(1000), "Schedule.Next was called %d times in 300ms: the periodic loop spins", n)
}

// Every(d) ticks every d, to the nanosecond, as its doc says for any d of at
// least a millisecond: truncated to whole milliseconds, Every(1500µs) would
// tick every millisecond, 50% more jobs than asked.
func TestEveryTicksEveryD(t *testing.T) {
	for _, d := range []time.Duration{1500 * time.Microsecond, time.Second + 500*time.Microsecond} {
		s := Every(d)
		a := s.Next(time.Unix(1_000_000, 0))
		b := s.Next(a)
		require.Equal(t, d, b.Sub(a), "Every(%v): ticks %v apart", d, b.Sub(a))
	}
}

// lastTick finds the latest tick within a year and a bit, as its doc says: a
// yearly schedule whose last tick was 364.5 days ago has that tick, so a
// process started then (with a Retention over a year) catches it up. A
// window that doubled from a minute only while at most 400 days would stop
// at 2^19 minutes, 364.09 days.
func TestLastTickLooksBackMoreThanAYear(t *testing.T) {
	s := Every(365 * 24 * time.Hour)
	tick := s.Next(time.Unix(1_700_000_000, 0))
	now := tick.Add(364*24*time.Hour + 12*time.Hour)
	require.True(t, s.Next(tick).After(now))
	require.Equal(t, tick, lastTick(s, now), "the latest tick, 364.5 days before now")
}

// runsByID counts how many times each job ID ran, across every process of
// a test.
type runsByID struct {
	mu sync.Mutex
	n  map[string]int
}

func newRunsByID() *runsByID { return &runsByID{n: map[string]int{}} }

// ran records one run of the job id.
func (r *runsByID) ran(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n[id]++
}

// handler records one run of each job it is given, and succeeds.
func (r *runsByID) handler() Handler {
	return HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
		r.ran(j.ID)
		return nil, nil
	})
}

// snapshot returns a copy of the counts so far.
func (r *runsByID) snapshot() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.n)
}

// ticksAt is a schedule with the given ticks, in order.
type ticksAt []time.Time

func (s ticksAt) Next(t time.Time) time.Time {
	for _, at := range s {
		if at.After(t) {
			return at
		}
	}
	return time.Time{}
}

// A schedule Redis has not seen before starts at its next tick: a daily
// job deployed at 04:21 does not run for yesterday's 08:00. Here two
// processes deploy the same new schedule at once, between a tick that
// fell before it existed and the next: the first has no job, the next has
// one, run once, and the schedule's record says Redis has seen it. A
// schedule that asks to start with its latest tick (StartWithLatestTick)
// enqueues that tick at once.
func TestNewPeriodicScheduleStartsAtItsNextTick(t *testing.T) {
	t.Parallel()
	for _, latest := range []bool{false, true} {
		t.Run(fmt.Sprintf("StartWithLatestTick=%v", latest), func(t *testing.T) {
			t.Parallel()
			prefix := redistest.Prefix(t)
			ctx := context.Background()
			now := time.Now().Truncate(time.Millisecond)
			before, after := now.Add(-time.Hour), now.Add(5*time.Second) // the processes look first well before it
			ps := []PeriodicJob{{Name: "daily", Schedule: ticksAt{before, after}, Type: "digest", StartWithLatestTick: latest}}
			runs := newRunsByID()
			var stops []func() error
			for range 2 {
				q := queueOn(t, redistest.Client(t, nil), prefix, Config{Logger: quietLog()})
				stops = append(stops, runPeriodic(q, runs.handler(), ps))
			}
			q := queueOn(t, redistest.Client(t, nil), prefix, Config{Logger: quietLog()})
			require.Eventually(t, func() bool {
				return runs.snapshot()[periodicID("daily", after)] == 1
			}, 15*time.Second, 10*time.Millisecond, "the first tick after the deploy runs")
			time.Sleep(200 * time.Millisecond)
			for _, stop := range stops {
				require.NoError(t, stop())
			}
			want := map[string]int{periodicID("daily", after): 1}
			if latest {
				want[periodicID("daily", before)] = 1
			}
			require.Equal(t, want, runs.snapshot(), "each tick runs once; a new schedule's tick before it existed only when asked")
			_, err := q.rdb.Get(ctx, q.ks.periodicKey(q.ks.shardOf("daily"), "daily")).Result()
			require.NoError(t, err, "Redis records that it has seen the schedule")
		})
	}
}

// A schedule an earlier build ran is not new, though Redis holds no record
// of it in its name's shard: a build before markers left only the jobs of
// its ticks, and one that kept the marker beside the job (the tick's own
// shard, on one Redis too) left markers in other shards. Either trace
// counts as seen. Here the earlier build ran tick T0 and was down at the
// latest tick T: the new process catches up on T, as any process that was
// down does, and T0 is not enqueued again. When the earlier build ran T
// itself, the record says so.
func TestPeriodicScheduleAnEarlierBuildRanIsNotNew(t *testing.T) {
	t.Parallel()
	for _, trace := range []string{"marker beside an earlier tick", "the latest tick's job"} {
		t.Run(trace, func(t *testing.T) {
			t.Parallel()
			prefix := redistest.Prefix(t)
			ctx := context.Background()
			q := queueOn(t, redistest.Client(t, nil), prefix, Config{Shards: 8, Logger: quietLog()})
			now := time.Now().Truncate(time.Millisecond)
			t0, tl := now.Add(-2*time.Hour), now.Add(-time.Hour)
			ps := []PeriodicJob{{Name: "nightly", Schedule: ticksAt{t0, tl}, Type: "report"}}
			record := q.ks.periodicKey(q.ks.shardOf("nightly"), "nightly")
			switch trace {
			case "marker beside an earlier tick":
				s := q.ks.shardOf(periodicID("nightly", t0))
				if s == q.ks.shardOf("nightly") {
					t0 = t0.Add(time.Millisecond) // another shard than the record's
					ps[0].Schedule = ticksAt{t0, tl}
					s = q.ks.shardOf(periodicID("nightly", t0))
				}
				require.NotEqual(t, q.ks.shardOf("nightly"), s, "test set-up: the marker is not the record")
				require.NoError(t, q.rdb.Set(ctx, q.ks.periodicKey(s, "nightly"), toMillis(t0), 0).Err())
			default:
				_, err := q.Enqueue(ctx, "report", nil, &EnqueueOpts{ID: periodicID("nightly", tl), RunAt: tl})
				require.NoError(t, err)
			}
			runs := newRunsByID()
			stop := runPeriodic(q, runs.handler(), ps)
			require.Eventually(t, func() bool {
				v, err := q.rdb.Get(ctx, record).Result()
				return err == nil && v != ""
			}, 5*time.Second, 10*time.Millisecond, "the schedule is recorded")
			require.Eventually(t, func() bool { return runs.snapshot()[periodicID("nightly", tl)] == 1 },
				5*time.Second, 10*time.Millisecond, "the latest tick is caught up on, or was run by the earlier build")
			time.Sleep(200 * time.Millisecond)
			require.NoError(t, stop())
			require.Equal(t, map[string]int{periodicID("nightly", tl): 1}, runs.snapshot())
			if trace == "the latest tick's job" {
				v, err := q.rdb.Get(ctx, record).Result()
				require.NoError(t, err)
				require.Equal(t, strconv.FormatInt(toMillis(tl), 10), v, "recorded as ran up to the tick the earlier build ran")
			}
		})
	}
}
