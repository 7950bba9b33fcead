package jobkey

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestWorkRunsJobsConcurrently(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
	ctx := context.Background()
	var running, peak atomic.Int32
	release := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		running.Add(-1)
		return append([]byte("done:"), j.Payload...), nil
	})
	var ids []string
	for i := range 8 {
		j, err := q.Enqueue(ctx, "t", []byte(fmt.Sprint(i)), nil)
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	startWork(t, q, h, &WorkOpts{Concurrency: 4})
	waitFor(t, "4 handlers at once", func() bool { return running.Load() == 4 })
	close(release)
	waitFor(t, "all succeeded", func() bool {
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		return st.Succeeded == 8
	})
	require.EqualValues(t, 4, peak.Load(), "never more than Concurrency")
	j, err := q.Get(ctx, ids[3])
	require.NoError(t, err)
	require.Equal(t, []byte("done:3"), j.Result)
}

func TestWorkFailsAndRecoversPanics(t *testing.T) {
	t.Parallel()
	q := realQueue(t, &Config{Backoff: func(int) time.Duration { return time.Hour }})
	ctx := context.Background()
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		switch string(j.Payload) {
		case "panic":
			panic("handler exploded")
		case "skip":
			return nil, fmt.Errorf("unfixable: %w", ErrSkipRetry)
		}
		return nil, errors.New("transient")
	})
	p, err := q.Enqueue(ctx, "t", []byte("panic"), nil)
	require.NoError(t, err)
	e, err := q.Enqueue(ctx, "t", []byte("err"), nil)
	require.NoError(t, err)
	s, err := q.Enqueue(ctx, "t", []byte("skip"), nil)
	require.NoError(t, err)
	startWork(t, q, h, nil)
	waitFor(t, "outcomes", func() bool {
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		return st.Failed == 1 && st.Scheduled == 2
	})
	got, err := q.Get(ctx, p.ID)
	require.NoError(t, err)
	require.Equal(t, StatePending, got.State, "a panic is a failed attempt, retried later")
	require.Contains(t, got.LastError, "panic: handler exploded")
	require.Contains(t, got.LastError, "worker_test.go", "with the stack")
	got, err = q.Get(ctx, e.ID)
	require.NoError(t, err)
	require.Equal(t, "transient", got.LastError)
	require.Equal(t, StateFailed, state(t, q, s.ID))
}

// An idle worker starts a new job on the wake-up hint, not on its poll.
func TestWorkWakesOnEnqueue(t *testing.T) {
	t.Parallel()
	// 200 ms lets the workers go idle and subscribe.
	requireIdleWorkerStarts(t, &WorkOpts{Concurrency: 2, PollInterval: time.Hour}, 200*time.Millisecond, nil,
		"an idle worker with an hour-long poll did not wake on enqueue")
}

// A delayed job starts when due: the idle worker sleeps until the next
// run-at it learns of, not for its hour-long poll interval.
func TestWorkRunsScheduledJobWhenDue(t *testing.T) {
	t.Parallel()
	requireIdleWorkerStarts(t, &WorkOpts{PollInterval: time.Hour}, 100*time.Millisecond, &EnqueueOpts{Delay: 300 * time.Millisecond},
		"scheduled job not run")
}

func TestWorkRenewsLease(t *testing.T) {
	t.Parallel()
	// The lease is long enough that a loaded CI machine still renews it in
	// time (every 300 ms), short enough that the handler outlives three.
	q := realQueue(t, &Config{Lease: 900 * time.Millisecond})
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	var claims atomic.Int32
	startWork(t, q, HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		claims.Add(1)
		time.Sleep(2700 * time.Millisecond) // three leases long
		return nil, ctx.Err()
	}), &WorkOpts{Concurrency: 2})
	waitFor(t, "the worker's claim", func() bool { return claims.Load() == 1 })
	// A rival claimer tries to take the job all along; the renewals keep it out.
	rival := time.Now().Add(2 * time.Second)
	for time.Now().Before(rival) {
		_, err := q.Claim(ctx, "rival")
		require.ErrorIs(t, err, ErrNoJob)
		time.Sleep(50 * time.Millisecond)
	}
	waitFor(t, "success", func() bool { return state(t, q, j.ID) == StateSucceeded })
	require.EqualValues(t, 1, claims.Load())
}

func TestWorkCancelStopsHandler(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
	ctx := context.Background()
	j, cause := runUntilCanceled(t, q, context.Context.Err)
	_, err := q.Cancel(ctx, j.ID)
	require.NoError(t, err)
	select {
	case c := <-cause:
		require.ErrorIs(t, c, ErrJobCanceled)
	case <-time.After(10 * time.Second):
		t.Fatal("handler not canceled")
	}
	time.Sleep(50 * time.Millisecond)
	require.Equal(t, StateCanceled, state(t, q, j.ID), "the worker did not overwrite the cancel")
}

// A run whose job someone else took over is stopped with ErrLeaseLost at
// its keeper's next renewal. (The lease is long enough that, on a loaded
// machine, no renewal comes too late: that would stop it with
// ErrLeaseExpired instead.)
func TestWorkLostLeaseCancelsHandler(t *testing.T) {
	t.Parallel()
	// A lease long enough that a renewal delayed by a loaded machine still
	// comes (at Lease/3) well before the self-fence (Lease less a fifth):
	// the handler is to be stopped by the lost lease, not by the fence.
	q := realQueue(t, &Config{Lease: 6 * time.Second})
	ctx := context.Background()
	j, cause := runUntilCanceled(t, q, func(context.Context) error { return nil })
	// Someone else takes the job over (as after an expired lease): fenced.
	_, err := q.Update(ctx, j.ID, func(*Job) error { return nil })
	require.NoError(t, err)
	_, err = q.update(ctx, j.ID, nil, func(cur *Job, _ time.Time) (*Job, error) {
		cur.Attempt++
		cur.LeaseOwner = "thief"
		cur.LeaseToken = newToken()
		cur.LeaseUntil = time.Now().Add(time.Hour)
		return cur, nil
	}, "")
	require.NoError(t, err)
	select {
	case c := <-cause:
		require.ErrorIs(t, c, ErrLeaseLost)
	case <-time.After(10 * time.Second):
		t.Fatal("handler not canceled on lost lease")
	}
	time.Sleep(50 * time.Millisecond)
	got, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, StateActive, got.State)
	require.Equal(t, "thief", got.LeaseOwner, "the zombie wrote nothing")
}

func TestWorkGracefulShutdown(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
	ctx := context.Background()
	quick, err := q.Enqueue(ctx, "quick", nil, nil)
	require.NoError(t, err)
	slow, err := q.Enqueue(ctx, "slow", nil, nil)
	require.NoError(t, err)
	var started sync.WaitGroup
	started.Add(2)
	stop := startWork(t, q, HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		started.Done()
		if j.Type == "quick" {
			time.Sleep(100 * time.Millisecond) // finishes within the grace
			return []byte("ok"), nil
		}
		<-ctx.Done() // runs past the grace
		require.ErrorIs(t, context.Cause(ctx), ErrShutdown)
		return nil, ctx.Err()
	}), &WorkOpts{Concurrency: 2, ShutdownGrace: 500 * time.Millisecond})
	started.Wait()
	t0 := time.Now()
	stop()
	require.Less(t, time.Since(t0), 5*time.Second)
	require.Equal(t, StateSucceeded, state(t, q, quick.ID), "in-flight work finished within the grace")
	got, err := q.Get(ctx, slow.ID)
	require.NoError(t, err)
	require.Equal(t, StatePending, got.State, "work past the grace is released")
	require.Zero(t, got.Attempt, "release does not spend the attempt")
	_, err = q.Claim(ctx, "after")
	require.NoError(t, err, "and is claimable at once")
}

// Work stopped mid-job with no Complete, as if the process died: the job is
// reclaimed after its lease and finished by another worker.
func TestWorkCrashedWorkerJobIsReclaimed(t *testing.T) {
	t.Parallel()
	q := realQueue(t, &Config{Lease: 300 * time.Millisecond})
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	c, err := q.Claim(ctx, "crashed")
	require.NoError(t, err) // and never heard from again
	startWork(t, q, HandlerFunc(func(context.Context, *Job) ([]byte, error) { return []byte("second"), nil }),
		&WorkOpts{PollInterval: 50 * time.Millisecond})
	waitFor(t, "reclaimed and finished", func() bool { return state(t, q, j.ID) == StateSucceeded })
	got, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, 2, got.Attempt)
	_, err = q.Complete(ctx, c, []byte("zombie"))
	require.ErrorIs(t, err, ErrLeaseLost)
}

func TestWorkRefusesBadOptions(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
	require.Error(t, q.Work(context.Background(), nil, nil))
	require.Error(t, q.Work(context.Background(), HandlerFunc(nil), &WorkOpts{Concurrency: -1}))
	require.ErrorIs(t, q.Work(context.Background(), HandlerFunc(nil), &WorkOpts{StuckAfter: -time.Second}), ErrInvalid)
}

// A claim flush whose only caller gave up stops. A flush that consulted gone
// only inside each decision would, after the caller was answered, still walk
// every candidate of every round, one WATCH round trip each, on a goroutine
// of its own: at shutdown Work would return while that goroutine still
// talked to Redis on the caller's client (here, on a 2ms network, dozens of
// round trips after Work returned).
func TestWorkLeavesNoClaimFlushBehind(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	var returned atomic.Bool
	var after atomic.Int32
	inRead := make(chan struct{}, 1)
	var slow, armed atomic.Bool
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		if returned.Load() {
			after.Add(1)
		}
		time.Sleep(2 * time.Millisecond) // a network with a 2ms round trip
		if reads(cmds) && armed.Load() && slow.CompareAndSwap(false, true) {
			select {
			case inRead <- struct{}{}:
			default:
			}
			time.Sleep(100 * time.Millisecond) // shutdown begins during the first claim's read
		}
		return nil
	}))
	q := queueOn(t, rdb, redistest.Prefix(t), Config{})
	ctx := context.Background()
	batch := make([]JobSpec, 16)
	for i := range batch {
		batch[i] = JobSpec{Type: "t"}
	}
	_, err := q.EnqueueMany(ctx, batch)
	require.NoError(t, err)

	armed.Store(true)
	ran, stop := workCountingRuns(t, ctx, q)
	<-inRead
	stop()
	returned.Store(true)
	time.Sleep(500 * time.Millisecond)
	t.Logf("handler runs: %d; pipelines sent on the queue's client after Work returned: %d", ran.Load(), after.Load())
	require.Zero(t, after.Load(), "Work returned while its claim flush kept talking to Redis")
}

// An idle worker does not busy-poll Redis while a job in a newer major
// format sits at the head of an index: it waits PollInterval (here 1s), as
// the doc says. The first entry of ready is then the newer job the claimer
// skips; read as "due now", it would have the slot wait max(1ms, 0) and
// claim again, about a thousand claim reads a second per slot.
func TestWorkDoesNotSpinBehindNewerMajorJob(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb, hook := hooked(t, 0)
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Logger: quietLog()})
	ctx := context.Background()
	now, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	plantNewer(t, ctx, rdb, q, "from-v2", now.UnixMilli(), newerMajorValue(t))

	wctx, stop := context.WithTimeout(ctx, 2*time.Second)
	defer stop()
	hook.Reset()
	require.NoError(t, q.Work(wctx, HandlerFunc(func(context.Context, *Job) ([]byte, error) { return nil, nil }),
		&WorkOpts{Concurrency: 1, PollInterval: time.Second, TrimInterval: -1}))
	rtt := hook.RTT.Load()
	t.Logf("one idle slot made %d round trips in 2s (PollInterval 1s)", rtt)
	require.Less(t, rtt, int64(40), "an idle worker must not busy-poll a queue holding only a job it cannot read")
}

// A claim whose EXEC is on the wire when shutdown begins is still Work's
// to give back: Work returns once the job is pending again, its attempt
// unspent, and nothing of it talks to Redis after Work returned (a
// process that exits then would leave the job leased to nobody, its
// attempt spent).
func TestWorkGivesBackClaimInFlightAtShutdownBeforeReturning(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	var armed, returned atomic.Bool
	var after atomic.Int32
	inExec := make(chan struct{}, 1)
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		if returned.Load() {
			after.Add(1)
		}
		return nil
	}))
	rdb.AddHook(&replyDelay{armed: &armed, delay: 300 * time.Millisecond, seen: inExec})
	prefix := redistest.Prefix(t)
	q := queueOn(t, rdb, prefix, Config{})
	clean := queueOn(t, redistest.Client(t, nil), prefix, Config{})
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)

	armed.Store(true)
	ran, stop := workCountingRuns(t, ctx, q)
	<-inExec // the claim's EXEC has run; its reply is late
	stop()
	returned.Store(true)
	got, err := clean.Get(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, StatePending, got.State, "Work returned with the job it claimed still leased to it")
	require.Zero(t, got.Attempt)
	require.Zero(t, ran.Load())
	time.Sleep(500 * time.Millisecond)
	require.Zero(t, after.Load(), "Work's claim talked to Redis after Work returned")
}

// replyDelay holds back the reply of every MULTI/EXEC while armed: the
// EXEC runs in Redis at once, and its caller hears of it delay later.
type replyDelay struct {
	armed *atomic.Bool
	delay time.Duration
	seen  chan struct{}
}

func (h *replyDelay) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *replyDelay) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *replyDelay) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if h.armed.Load() && slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "exec" }) {
			select {
			case h.seen <- struct{}{}:
			default:
			}
			time.Sleep(h.delay)
		}
		return err
	}
}

// A paused worker waits for its poll interval or Resume, however many jobs
// producers enqueue. Every enqueue publishes a wake-up; were a paused
// worker's idle slots to answer each with a whole claim (the due read, then
// the next-due read), a queue paused during an incident, with producers
// still running, would have its workers hammer Redis at the producers' rate
// times the number of processes. Here one Work (4 slots, PollInterval 1 s)
// on a paused queue sees 100 enqueues over about 2 s by another client, and
// makes at most 24 round trips: a poll of at most 3 round trips per slot
// per second (more seconds, and polls, when a loaded machine stretches the
// enqueues' 2 s).
func TestPausedWorkerWaitsThroughEnqueues(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2})
	f.q.clock.Fake = nil
	require.NoError(t, f.q.Pause(f.ctx))
	producer := queueOn(t, redistest.Client(t, nil), f.q.cfg.Prefix, Config{Shards: 2})
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	done := make(chan error, 1)
	var ran atomic.Int64
	go func() {
		done <- f.q.Work(ctx, HandlerFunc(func(context.Context, *Job) ([]byte, error) {
			ran.Add(1)
			return nil, nil
		}), &WorkOpts{Concurrency: 4, PollInterval: time.Second, TrimInterval: -1})
	}()
	time.Sleep(200 * time.Millisecond) // Work subscribed, slots idle
	f.hook.Reset()
	t0 := time.Now()
	for range 100 {
		_, err := producer.Enqueue(f.ctx, "t", nil, nil)
		require.NoError(t, err)
		time.Sleep(20 * time.Millisecond)
	}
	rtt := f.hook.RTT.Load()
	seconds := max(2, int64(math.Round(time.Since(t0).Seconds())))
	cancel()
	require.NoError(t, <-done)
	t.Logf("paused worker: %d round trips during 100 enqueues over %v; %d jobs ran", rtt, time.Since(t0), ran.Load())
	require.Zero(t, ran.Load())
	require.LessOrEqual(t, rtt, 4*3*seconds, "a paused worker waits for its poll interval or Resume")
}

// Work ended by its ctx's deadline, the ordinary way to stop it, while its
// slots claim jobs as fast as they can: the claims cut short by that
// deadline are the shutdown, and nothing is logged at ERROR.
func TestWorkShutdownByDeadlineLogsNoError(t *testing.T) {
	t.Parallel()
	rec := &logRecorder{}
	q := realQueue(t, &Config{Logger: slog.New(rec)})
	ctx := context.Background()
	batch := make([]JobSpec, 2000)
	for i := range batch {
		batch[i] = JobSpec{Type: "t"}
	}
	_, err := q.EnqueueMany(ctx, batch)
	require.NoError(t, err)
	h := HandlerFunc(func(context.Context, *Job) ([]byte, error) { return nil, nil })
	for i := range 20 {
		wctx, cancel := context.WithTimeout(ctx, time.Duration(20+i*3)*time.Millisecond)
		err := q.Work(wctx, h, &WorkOpts{Concurrency: 8, PollInterval: time.Millisecond})
		cancel()
		require.NoError(t, err)
	}
	require.Empty(t, rec.find(slog.LevelError, ""), "an ordinary shutdown is not an error")
}

// A handler that ends its goroutine with runtime.Goexit (t.FailNow does)
// neither returns nor panics. Its attempt fails at once, its slot goes on
// claiming, it is never reported stuck, and Work shuts down cleanly.
func TestHandlerGoexitFailsItsAttemptAndFreesItsSlot(t *testing.T) {
	t.Parallel()
	q := realQueue(t, &Config{Lease: time.Minute}) // a lease that cannot run out within the test
	ctx := context.Background()
	_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "exits", MaxAttempts: 1})
	require.NoError(t, err)
	exited := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		if j.ID == "exits" {
			close(exited)
			runtime.Goexit()
		}
		return []byte("ok"), nil
	})
	stop := startWork(t, q, h, &WorkOpts{Concurrency: 1, StuckAfter: 20 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	<-exited
	_, err = q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "after"})
	require.NoError(t, err)
	waitFor(t, "the job that called Goexit failed", func() bool { return state(t, q, "exits") == StateFailed })
	j, err := q.Get(ctx, "exits")
	require.NoError(t, err)
	require.Contains(t, j.LastError, "Goexit")
	waitFor(t, "the slot ran the next job", func() bool { return state(t, q, "after") == StateSucceeded })
	stop() // with no error: no handler is left stuck
	require.Zero(t, q.Metrics().StuckDetected, "a handler that called Goexit is not stuck")
}

// A Work's claim that finds a shard gone (its node could not be reached)
// reads it again apart (the due pool's probe). When Work returns, that
// read is over: nothing of a Work outlives it, even a read of a node that
// does not answer.
func TestWorkReturnsOnlyOnceItsShardProbeHasEnded(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t, nil)
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Shards: 2})
	tag := q.ks.index(1, "") // every key of shard 1 starts so
	var reads atomic.Int32
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			for _, a := range c.Args() {
				if s, ok := a.(string); ok && strings.HasPrefix(s, tag) {
					// Shard 1's node does not answer: the read waits out
					// its ctx.
					reads.Add(1)
					<-ctx.Done()
					return ctx.Err()
				}
			}
		}
		return nil
	}))
	// The last read could not reach shard 1, a while ago.
	q.pool.Fill(dueView{Shards: []int{0, 1}, Down: []int{1}, Full: -1, At: time.Now().Add(-time.Minute)})
	probing := q.pool.Probing
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, HandlerFunc(func(context.Context, *Job) ([]byte, error) { return nil, nil }),
			&WorkOpts{Concurrency: 1, Logger: quiet, TrimInterval: -1})
	}()
	waitFor(t, "a read of shard 1 under way", func() bool { return probing() && reads.Load() > 0 })
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Work did not return")
	}
	require.False(t, probing(), "the read of shard 1 a claim of Work started is over when Work returns")
}

// requireIdleWorkerStarts starts Work with opts on a queue of its own, lets
// the workers go idle for settle, enqueues a job with eopts, and requires its
// handler to start within 10 seconds; failure says what went wrong if not.
func requireIdleWorkerStarts(t *testing.T, opts *WorkOpts, settle time.Duration, eopts *EnqueueOpts, failure string) {
	t.Helper()
	q := realQueue(t, nil)
	started := make(chan struct{}, 1)
	startWork(t, q, HandlerFunc(func(context.Context, *Job) ([]byte, error) {
		started <- struct{}{}
		return nil, nil
	}), opts)
	time.Sleep(settle)
	_, err := q.Enqueue(context.Background(), "t", nil, eopts)
	require.NoError(t, err)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal(failure)
	}
}

// runUntilCanceled enqueues a job j on q and starts Work whose handler runs
// until its context ends, sends the context's cause on cause, and returns
// what ret gives for that context. It returns once the handler runs.
func runUntilCanceled(t *testing.T, q *Queue, ret func(context.Context) error) (j *Job, cause <-chan error) {
	t.Helper()
	j, err := q.Enqueue(context.Background(), "t", nil, nil)
	require.NoError(t, err)
	running := make(chan struct{})
	causes := make(chan error, 1)
	startWork(t, q, HandlerFunc(func(ctx context.Context, _ *Job) ([]byte, error) {
		close(running)
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return nil, ret(ctx)
	}), nil)
	<-running
	return j, causes
}

// workCountingRuns starts Work on q with one worker, whose handler counts
// its runs in ran and succeeds; stop cancels it and requires Work to return
// nil.
func workCountingRuns(t *testing.T, ctx context.Context, q *Queue) (ran *atomic.Int32, stop func()) {
	t.Helper()
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	ran = new(atomic.Int32)
	go func() {
		done <- q.Work(wctx, HandlerFunc(func(context.Context, *Job) ([]byte, error) { ran.Add(1); return nil, nil }),
			&WorkOpts{Concurrency: 1, Logger: quiet})
	}()
	return ran, func() {
		cancel()
		require.NoError(t, <-done)
	}
}

// A claim whose EXEC's reply was lost is looked for by its lease token
// (findClaim). When Work's context ends before the search found it, while
// the search waits between reads that failed, while a read is under way,
// or while the replicas are asked to confirm it (MinReplicas), the search
// gives the claim back before it returns, fenced on its token: Redis was
// reachable all along, so the job is pending again, its attempt unspent,
// rather than leased to nobody for a whole lease. A give-back left to a
// goroutine would not be over when the search returns: the replicas' case
// slows it to show that.
func TestClaimSoughtWhenShutdownBeginsIsGivenBackBeforeTheSearchReturns(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	for _, c := range []string{"between reads", "during a read", "while replicas confirm it"} {
		t.Run(c, func(t *testing.T) {
			t.Parallel()
			rdb := redistest.Client(t, nil)
			prefix := redistest.Prefix(t)
			bg := context.Background()
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			var armed atomic.Bool
			var failed atomic.Int32
			rdb.AddHook(getHook(func(hctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
				if !armed.Load() || cmd.Name() != "get" {
					return next(hctx, cmd)
				}
				var err error
				switch c {
				case "between reads":
					// Every read fails at once; ctx ends while the search
					// waits to read again.
					if failed.Add(1) == 3 {
						time.AfterFunc(5*time.Millisecond, cancel)
					}
					err = errors.New("injected: the read failed")
				case "during a read":
					cancel()
					<-hctx.Done()
					err = hctx.Err()
				default:
					return next(hctx, cmd)
				}
				cmd.SetErr(err)
				return err
			}))
			rdb.AddHook(pipeHook(func(context.Context, []redis.Cmder) error {
				if armed.Load() && ctx.Err() != nil {
					time.Sleep(300 * time.Millisecond) // the give-back's round trips are slow
				}
				return nil
			}))
			cfg := Config{Logger: quietLog()}
			if c == "while replicas confirm it" {
				// No replica answers: a renewal is never confirmed.
				cfg.MinReplicas, cfg.ReplicaTimeout = 1, 20*time.Millisecond
			}
			q := queueOn(t, rdb, prefix, cfg)
			other := queueOn(t, redistest.Client(t, nil), prefix, Config{Logger: quietLog()})
			_, err := other.Enqueue(bg, "t", nil, &EnqueueOpts{ID: "j"})
			require.NoError(t, err)
			unsure, err := other.Claim(bg, "w") // the claim the lost EXEC made
			require.NoError(t, err)
			_, err = q.Get(bg, "j") // the one-time checks, before the faults
			require.NoError(t, err)

			armed.Store(true)
			if c == "while replicas confirm it" {
				time.AfterFunc(100*time.Millisecond, cancel)
			}
			found := (&worker{q: q}).findClaim(ctx, unsure, time.Now())
			require.Nil(t, found, "shutdown began before the claim was handed over")
			got, err := other.Get(bg, "j")
			require.NoError(t, err)
			require.Equal(t, StatePending, got.State, "the claim that landed is given back before the search returns")
			require.Zero(t, got.Attempt, "its attempt unspent")
		})
	}
}

// A slot's fused complete-and-claim whose EXEC's reply is slow leaves the
// call at its deadline; the EXEC claimed the slot's next job meanwhile, and
// once the reply comes, that job is given back, its attempt unspent. Work
// returns only once that give-back is over, however slow the reply and
// the give-back's own round trips: nothing Work started runs after it
// returned, and the job is pending when it does.
func TestWorkReturnsOnlyOnceTheGiveBacksOfItsClaimsHaveEnded(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	var stage atomic.Int32 // 0 idle, 1 armed, 2 the fused EXEC's reply came
	var returned atomic.Bool
	var after atomic.Int32
	inExec := make(chan struct{})
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		if returned.Load() {
			after.Add(1)
		}
		if stage.Load() == 2 {
			time.Sleep(200 * time.Millisecond) // the give-back's round trips are slow too
		}
		return nil
	}))
	rdb.AddHook(&onceReplyDelay{stage: &stage, delay: 1500 * time.Millisecond, seen: inExec})
	prefix := redistest.Prefix(t)
	const lease = time.Second
	q := queueOn(t, rdb, prefix, Config{Lease: lease, Logger: quietLog()})
	clean := queueOn(t, redistest.Client(t, nil), prefix, Config{})
	bg := context.Background()
	for _, id := range []string{"a", "b"} {
		_, err := q.Enqueue(bg, "t", nil, &EnqueueOpts{ID: id})
		require.NoError(t, err)
	}
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	var ran atomic.Int32
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, HandlerFunc(func(context.Context, *Job) ([]byte, error) {
			if ran.Add(1) == 1 {
				stage.Store(1) // the completion fuses with the claim of the other job
			}
			return nil, nil
		}), &WorkOpts{Concurrency: 1, Logger: quietLog(), TrimInterval: -1})
	}()
	select {
	case <-inExec: // the fused EXEC ran; its reply is late
	case <-time.After(15 * time.Second):
		t.Fatal("no fused EXEC")
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Work did not return")
	}
	returned.Store(true)
	require.Equal(t, int32(1), ran.Load(), "the job claimed with the completion is not run at shutdown")
	var first, second *Job
	for _, id := range []string{"a", "b"} {
		j, err := clean.Get(bg, id)
		require.NoError(t, err)
		if j.State == StateSucceeded {
			first = j
		} else {
			second = j
		}
	}
	require.NotNil(t, first, "the first job's completion landed with the fused EXEC")
	require.NotNil(t, second)
	require.NotZero(t, second.LeaseToken, "the fused EXEC claimed the other job")
	require.Equal(t, StatePending, second.State, "Work returned before the job claimed for its slot was given back")
	require.Zero(t, second.Attempt)
	time.Sleep(500 * time.Millisecond)
	require.Zero(t, after.Load(), "something Work started talked to Redis after Work returned")
}

// onceReplyDelay holds back the reply of the first MULTI/EXEC sent once
// stage is 1: the EXEC runs in Redis at once, and its caller hears of it
// delay later. It closes seen when the EXEC has run, and sets stage to 2
// when the reply goes on.
type onceReplyDelay struct {
	stage *atomic.Int32
	delay time.Duration
	seen  chan struct{}
}

func (h *onceReplyDelay) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *onceReplyDelay) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *onceReplyDelay) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		exec := slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "exec" })
		if !exec || !h.stage.CompareAndSwap(1, 3) {
			return next(ctx, cmds)
		}
		err := next(ctx, cmds)
		close(h.seen)
		time.Sleep(h.delay)
		h.stage.Store(2)
		return err
	}
}
