package jobkey

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// logRecorder is a slog.Handler that keeps every record, for tests that
// check what was logged and how often.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r.Clone())
	return nil
}

// find returns the attributes of the records at level whose message
// starts with msg.
func (l *logRecorder) find(level slog.Level, msg string) []map[string]slog.Value {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]slog.Value
	for _, r := range l.recs {
		if r.Level != level || !strings.HasPrefix(r.Message, msg) {
			continue
		}
		attrs := map[string]slog.Value{}
		r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value; return true })
		out = append(out, attrs)
	}
	return out
}

// stuckCounts are the three places a stuck handler shows.
func stuckCounts(t *testing.T, q *Queue) (now, detected, inStats int64) {
	t.Helper()
	m := q.Metrics()
	st, err := q.Stats(context.Background())
	require.NoError(t, err)
	return m.StuckHandlers, m.StuckDetected, st.StuckHandlers
}

// A handler that ignores its context after its job was canceled, or its
// lease lost, is reported stuck StuckAfter later: logged once at WARN with
// the job's ID and type and how long, counted in Metrics and in Stats. Its
// runner stays taken: with Concurrency 1, no other job starts until it
// returns. Once it returns, the slot takes the next job and the counts
// drop.
func TestStuckHandlerIsReportedAndKeepsItsSlot(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		cause error
		end   func(t *testing.T, q *Queue, j *Job) // ends the run's context
	}{
		{"canceled", ErrJobCanceled, func(t *testing.T, q *Queue, j *Job) {
			_, err := q.Cancel(context.Background(), j.ID)
			require.NoError(t, err)
		}},
		{"lease lost", ErrLeaseLost, func(t *testing.T, q *Queue, j *Job) {
			// Another worker takes the job over, as after an expired lease.
			_, err := q.update(context.Background(), j.ID, nil, func(cur *Job, _ time.Time) (*Job, error) {
				cur.Attempt++
				cur.LeaseOwner, cur.LeaseToken = "thief", newToken()
				cur.LeaseUntil = time.Now().Add(time.Hour)
				return cur, nil
			}, "")
			require.NoError(t, err)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const stuckAfter = 400 * time.Millisecond
			log := &logRecorder{}
			q := realQueue(t, &Config{Lease: 600 * time.Millisecond})
			ctx := context.Background()
			stuck, err := q.Enqueue(ctx, "stubborn", nil, nil)
			require.NoError(t, err)

			started := make(chan struct{})
			ended := make(chan error, 1)
			release := make(chan struct{})
			var others atomic.Int32
			startWork(t, q, HandlerFunc(func(hctx context.Context, j *Job) ([]byte, error) {
				if j.ID != stuck.ID {
					others.Add(1)
					return nil, nil
				}
				close(started)
				<-hctx.Done()
				ended <- context.Cause(hctx)
				<-release // ignores its context
				return nil, nil
			}), &WorkOpts{Concurrency: 1, StuckAfter: stuckAfter, Logger: slog.New(log)})
			<-started
			next, err := q.Enqueue(ctx, "next", nil, nil)
			require.NoError(t, err)

			asked := time.Now() // the context ends after this
			c.end(t, q, stuck)
			var cause error
			select {
			case cause = <-ended:
			case <-time.After(10 * time.Second):
				t.Fatal("the handler's context did not end")
			}
			require.ErrorIs(t, cause, c.cause)
			n, _, _ := stuckCounts(t, q)
			require.Zero(t, n, "not stuck before StuckAfter")

			waitFor(t, "the stuck report", func() bool { n, _, _ := stuckCounts(t, q); return n == 1 })
			require.GreaterOrEqual(t, time.Since(asked), stuckAfter, "reported only after StuckAfter")
			waitFor(t, "Stats to count it", func() bool { _, _, s := stuckCounts(t, q); return s == 1 })
			_, detected, _ := stuckCounts(t, q)
			require.EqualValues(t, 1, detected)

			// Past a few report renewals: still one WARN, and the slot has
			// taken nothing else.
			time.Sleep(3 * q.cfg.Lease / 2)
			warns := log.find(slog.LevelWarn, "jobkey: handler stuck")
			require.Len(t, warns, 1, "logged once")
			require.Equal(t, stuck.ID, warns[0]["job"].String())
			require.Equal(t, "stubborn", warns[0]["type"].String())
			require.GreaterOrEqual(t, warns[0]["since"].Duration(), stuckAfter)
			require.Contains(t, warns[0]["cause"].String(), c.cause.Error())
			require.Zero(t, others.Load(), "the stuck handler's slot took no other job")
			require.Equal(t, StatePending, state(t, q, next.ID))
			n, detected, inStats := stuckCounts(t, q)
			require.Equal(t, [3]int64{1, 1, 1}, [3]int64{n, detected, inStats}, "the report is renewed, not lapsed")

			close(release)
			waitFor(t, "the next job to run in the freed slot", func() bool { return others.Load() == 1 })
			n, detected, inStats = stuckCounts(t, q)
			require.Equal(t, [3]int64{0, 1, 0}, [3]int64{n, detected, inStats}, "the stuck count drops; the detections stay counted")
			require.Len(t, log.find(slog.LevelInfo, "jobkey: stuck handler returned"), 1)
		})
	}
}

// A handler that returns soon after its context ends is not stuck, and a
// timeout counts as its context ending.
func TestHandlerThatStopsInTimeIsNotStuck(t *testing.T) {
	t.Parallel()
	log := &logRecorder{}
	q := realQueue(t, nil)
	ctx := context.Background()
	_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{Timeout: 50 * time.Millisecond, MaxAttempts: 1})
	require.NoError(t, err)
	var recorded atomic.Int32
	startWork(t, q, HandlerFunc(func(hctx context.Context, _ *Job) ([]byte, error) {
		<-hctx.Done()
		time.Sleep(100 * time.Millisecond) // some cleanup, well within StuckAfter
		return nil, hctx.Err()
	}), &WorkOpts{StuckAfter: time.Second, Logger: slog.New(log), OnRecorded: func(*Job, error) { recorded.Add(1) }})
	waitFor(t, "the outcome", func() bool { return recorded.Load() == 1 })
	time.Sleep(1200 * time.Millisecond) // past StuckAfter from the timeout
	n, detected, inStats := stuckCounts(t, q)
	require.Equal(t, [3]int64{0, 0, 0}, [3]int64{n, detected, inStats})
	require.Empty(t, log.find(slog.LevelWarn, "jobkey: handler stuck"))
}

// Shutdown does not wait forever for a handler that ignores its context:
// once the grace has run out and StuckAfter has passed, Work returns
// ErrHandlerStuck naming the job, and stops renewing its lease, so the job
// can be claimed again once the lease runs out. When the handler finally
// returns, the release it asks for is fenced off.
func TestShutdownReturnsWithoutStuckHandler(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	q := realQueue(t, &Config{Lease: lease})
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "stubborn", nil, nil)
	require.NoError(t, err)
	started := make(chan struct{})
	release := make(chan struct{})
	returned := make(chan struct{})
	recorded := make(chan error, 1)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, HandlerFunc(func(context.Context, *Job) ([]byte, error) {
			close(started)
			<-release // ignores its context
			close(returned)
			return nil, nil
		}), &WorkOpts{Concurrency: 2, ShutdownGrace: 200 * time.Millisecond, StuckAfter: 300 * time.Millisecond, Logger: quiet,
			OnRecorded: func(_ *Job, err error) { recorded <- err }})
	}()
	<-started
	t0 := time.Now()
	stop()
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Work did not return: shutdown waits forever for a stuck handler")
	}
	took := time.Since(t0)
	require.ErrorIs(t, err, ErrHandlerStuck)
	require.ErrorContains(t, err, j.ID)
	require.GreaterOrEqual(t, took, 500*time.Millisecond, "ShutdownGrace, then StuckAfter")
	require.Less(t, took, 5*time.Second)

	// The lease is no longer renewed: the job is claimed again once it
	// runs out.
	var c *Job
	waitFor(t, "a claim after the lease ran out", func() bool {
		c, err = q.Claim(ctx, "rival")
		return err == nil
	})
	require.Equal(t, j.ID, c.ID)
	require.Equal(t, 2, c.Attempt)
	// Nor is its report: it lapses, though the handler still runs.
	waitFor(t, "the report to lapse", func() bool {
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		return st.StuckHandlers == 0
	})
	require.EqualValues(t, 1, q.Metrics().StuckHandlers, "this process still counts it")
	close(release)
	<-returned
	select {
	case err = <-recorded:
		// Its lease is long over, so the write gets one short try: it is
		// refused (ErrLeaseLost); or, on a loaded machine, that try's
		// deadline ends before it is sent (ErrLeaseLost too: nothing was
		// written) or while it is in flight (ErrOutcomeUnknown). Either
		// way the value below shows it was fenced off.
		require.True(t, errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrOutcomeUnknown),
			"the stuck run's late write is refused or unknown, got %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the late release was never tried")
	}
	got, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, StateActive, got.State)
	require.Equal(t, c.LeaseToken, got.LeaseToken, "the stuck run's late release is fenced off")
	require.Zero(t, q.Metrics().StuckHandlers)
}

// A report whose process stopped renewing it lapses: Stats does not count
// it, and Trim removes it.
func TestLapsedStuckReportIsNotCountedAndIsTrimmed(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	now, err := q.clock.Now(ctx, q.rdb)
	require.NoError(t, err)
	key := q.ks.index(0, seenStuck)
	require.NoError(t, rdb.ZAdd(ctx, key,
		redis.Z{Score: float64(toMillis(now.Add(-time.Minute))), Member: "1:gone"},
		redis.Z{Score: float64(toMillis(now.Add(time.Minute))), Member: "2:live"}).Err())
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.StuckHandlers)
	n, err := q.Trim(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	left, err := rdb.ZRange(ctx, key, 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{"2:live"}, left)
}

// Shutdown gives up on stuck handlers only once nothing else is left: a
// handler that stops when told, beside one already stuck, still has its
// job released before Work returns.
func TestShutdownWaitsForHandlersThatStopBesideAStuckOne(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
	ctx := context.Background()
	stuck, err := q.Enqueue(ctx, "stubborn", nil, nil)
	require.NoError(t, err)
	polite, err := q.Enqueue(ctx, "polite", nil, nil)
	require.NoError(t, err)
	var started sync.WaitGroup
	started.Add(2)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, HandlerFunc(func(hctx context.Context, j *Job) ([]byte, error) {
			started.Done()
			if j.ID == stuck.ID {
				<-release // ignores its context
				return nil, nil
			}
			<-hctx.Done()
			time.Sleep(300 * time.Millisecond) // stops, in its own time
			return nil, hctx.Err()
		}), &WorkOpts{Concurrency: 2, ShutdownGrace: 100 * time.Millisecond, StuckAfter: 400 * time.Millisecond, Logger: quiet})
	}()
	started.Wait()
	_, err = q.Cancel(ctx, stuck.ID)
	require.NoError(t, err)
	waitFor(t, "the stuck report", func() bool { return q.Metrics().StuckHandlers == 1 })

	stop()
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Work did not return")
	}
	require.ErrorIs(t, err, ErrHandlerStuck)
	require.ErrorContains(t, err, stuck.ID)
	require.NotContains(t, err.Error(), polite.ID)
	got, err := q.Get(ctx, polite.ID)
	require.NoError(t, err)
	require.Equal(t, StatePending, got.State, "the handler that stopped had its job released before Work returned")
	require.Zero(t, got.Attempt)
}

// Shutdown that gives up on a stuck handler stops renewing that handler's
// lease only. A success that another runner handed over to be written in
// bulk (WorkOpts.Prefetch), and whose write is slow, keeps its lease until
// its outcome lands, as a runner that records its own outcome does: before,
// every run's renewals stopped, the write ran past the lease and gave up,
// and the job was left to run again.
func TestShutdownThatGivesUpOnAStuckHandlerKeepsTheLeasesOfSuccessesBeingWritten(t *testing.T) {
	t.Parallel()
	for _, prefetch := range []int{0, -1} {
		t.Run(fmt.Sprintf("prefetch %d", prefetch), func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Client(t, nil)
			var slow atomic.Bool
			rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
				if slow.Load() && has(cmds, "zadd", ":succeeded") {
					<-ctx.Done() // completions cannot be sent for now
					return ctx.Err()
				}
				return nil
			}))
			q := queueOn(t, rdb, redistest.Prefix(t), Config{Lease: time.Second, Logger: quietLog()})
			ctx := context.Background()
			stuck, err := q.Enqueue(ctx, "stubborn", nil, nil)
			require.NoError(t, err)
			ok, err := q.Enqueue(ctx, "quick", nil, nil)
			require.NoError(t, err)
			release := make(chan struct{})
			t.Cleanup(func() { close(release) })
			stuckStarted, okReturned := make(chan struct{}), make(chan struct{})
			var mu sync.Mutex
			var recorded []error
			slow.Store(true)
			wctx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- q.Work(wctx, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
					if j.ID == stuck.ID {
						close(stuckStarted)
						<-release // ignores its context
						return nil, nil
					}
					defer close(okReturned)
					return nil, nil
				}), &WorkOpts{Concurrency: 2, ShutdownGrace: 10 * time.Millisecond, StuckAfter: 50 * time.Millisecond, Logger: quietLog(),
					Prefetch: prefetch, OnRecorded: func(j *Job, err error) {
						if j.ID == ok.ID {
							mu.Lock()
							recorded = append(recorded, err)
							mu.Unlock()
						}
					}})
			}()
			<-stuckStarted
			<-okReturned
			stop()                              // shutdown gives up on the stuck handler while the success waits to be written
			time.Sleep(1500 * time.Millisecond) // longer than the lease
			slow.Store(false)
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Work did not return")
			}
			require.ErrorIs(t, err, ErrHandlerStuck)
			got, err := q.Get(ctx, ok.ID)
			require.NoError(t, err)
			require.Equal(t, StateSucceeded, got.State, "the success landed under a lease kept until then")
			mu.Lock()
			defer mu.Unlock()
			require.Equal(t, []error{nil}, recorded)
		})
	}
}
