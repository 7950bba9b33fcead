package jobkey

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// blockHook fails every command and pipeline of a client while on is set:
// the process cannot reach Redis (a partition, or a process stopped).
type blockHook struct{ on *atomic.Bool }

var errBlocked = errors.New("break14: Redis unreachable from this process")

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

// DEFECT: the periodic loop skips a tick older than Retention only when
// the process has never seen a tick (done.IsZero()). PeriodicJob's doc
// says a process that "wakes from a pause" leaves a missed tick older than
// Retention alone, "since its job may have expired and the ID no longer
// proves it ran". A process whose enqueue of tick T fails (Redis
// unreachable from it, or it is stopped) for longer than Retention, while
// another process enqueued T and the job ran and expired, enqueues T again
// when it recovers: a second job for one tick. Observed (Every 4s,
// Retention 1s, B cut off for 1.6s after T): the job of tick T ran 2 times.
func TestBreak14PeriodicStaleTickAfterRetentionRunsTwice(t *testing.T) {
	redistest.RequireReal(t)
	prefix := redistest.Prefix(t)
	const every = 4 * time.Second
	sched := Every(every)
	var mu sync.Mutex
	runs := map[string]int{}
	h := HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
		mu.Lock()
		runs[j.ID]++
		mu.Unlock()
		return nil, nil
	})
	cfg := func() *Config { return &Config{Prefix: prefix, Logger: quietLog(), Retention: time.Second} }
	start := func(name string, rdb *redis.Client) func() {
		q, err := NewQueue(rdb, "q", cfg())
		require.NoError(t, err)
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- q.Work(ctx, h, &WorkOpts{Name: name, Concurrency: 1, Logger: quietLog(), PollInterval: 50 * time.Millisecond,
				Periodic: []PeriodicJob{{Name: "tick", Schedule: sched, Type: "t"}}})
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
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return runs[id2] == 1 }, 3*time.Second, 10*time.Millisecond)
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
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, runs[id2], "tick %s (older than Retention when B recovered) ran %d times", id2, runs[id2])
}

// stuck is a schedule whose Next does not advance: it returns the same
// time, already past, whatever it is asked.
type stuck struct {
	at    time.Time
	calls *atomic.Int64
}

func (s stuck) Next(time.Time) time.Time { s.calls.Add(1); return s.at }

// DEFECT: the periodic loop spins on a schedule whose Next returns a time
// that is not after now. lastTick guards against a non-advancing Next
// (!n.After(t)), but periodic() then waits time.NewTimer(next.Sub(now))
// with a negative duration and loops at once, forever, burning a core.
// Observed: millions of Next calls in 300ms (expected: a handful, or the
// loop giving up as for a schedule with no more ticks).
func TestBreak14PeriodicNonAdvancingScheduleSpins(t *testing.T) {
	redistest.RequireReal(t)
	prefix := redistest.Prefix(t)
	q, err := NewQueue(redistest.Client(t, nil), "q", &Config{Prefix: prefix, Logger: quietLog()})
	require.NoError(t, err)
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

// DEFECT: Every(d) truncates d to whole milliseconds (d.Milliseconds()) but
// its doc says "a tick every d" and accepts any d of at least a
// millisecond. Every(1500µs) ticks every 1ms: 50% more jobs than asked.
// Observed: consecutive ticks 1ms apart.
func TestBreak14EveryTruncatesToMilliseconds(t *testing.T) {
	for _, d := range []time.Duration{1500 * time.Microsecond, time.Second + 500*time.Microsecond} {
		s := Every(d)
		a := s.Next(time.Unix(1_000_000, 0))
		b := s.Next(a)
		require.Equal(t, d, b.Sub(a), "Every(%v): ticks %v apart", d, b.Sub(a))
	}
}

// DEFECT (doc/behaviour mismatch): lastTick's doc says it returns the zero
// time only when there is no tick "within a year and a bit", but its
// window doubles from a minute while w <= 400 days, so the widest window is
// 2^19 minutes, 364.09 days: less than a year. A yearly schedule whose last
// tick was 364.5 days ago has no last tick, so a process started then (with
// a Retention over a year) does not catch it up. Observed: zero time.
func TestBreak14LastTickWindowShorterThanAYear(t *testing.T) {
	s := Every(365 * 24 * time.Hour)
	tick := s.Next(time.Unix(1_700_000_000, 0))
	now := tick.Add(364*24*time.Hour + 12*time.Hour)
	require.True(t, s.Next(tick).After(now))
	require.Equal(t, tick, lastTick(s, now), "the latest tick, 364.5 days before now")
}
