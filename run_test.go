package jobkey

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/faultproxy"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A worker cut off from Redis stops its handler before its lease can run
// out, so the worker that claims the job next never runs it at the same
// time.
func TestWorkFencesItselfWhenCutOff(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	q, rival, proxy, j := cutOffAndRival(t, lease)
	ctx := context.Background()

	started := make(chan struct{})
	type stop struct {
		at    time.Time
		cause error
	}
	stopped := make(chan stop, 1)
	startWork(t, q, HandlerFunc(func(ctx context.Context, _ *Job) ([]byte, error) {
		close(started)
		select {
		case <-ctx.Done():
			stopped <- stop{time.Now(), context.Cause(ctx)}
		case <-time.After(10 * time.Second):
			stopped <- stop{time.Now(), errors.New("never stopped")}
		}
		return nil, ctx.Err()
	}), &WorkOpts{Concurrency: 1})
	<-started
	proxy.Partition(true)
	cutAt := time.Now()

	c, claimedAt := rivalClaimsAfterLease(t, ctx, rival)
	require.Equal(t, j.ID, c.ID)
	s := <-stopped
	require.ErrorIs(t, s.cause, ErrLeaseExpired)
	require.True(t, s.at.Before(claimedAt), "the cut-off handler stopped %v after the cut, the rival claimed %v after it",
		s.at.Sub(cutAt), claimedAt.Sub(cutAt))
	proxy.Partition(false)
}

// The lease is kept until the outcome is written, not only while the
// handler runs: a completion that starts late does not let the job run
// again.
func TestWorkKeepsLeaseUntilOutcomeRecorded(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	prefix := redistest.Prefix(t)
	const lease = 600 * time.Millisecond
	slow := redistest.Client(t, nil)
	var slowed atomic.Int32
	slow.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		// A completion's first round trip types the succeeded index: hold
		// the first one back for twice the lease, as a backlog would.
		if has(cmds, "type", ":succeeded") && slowed.Add(1) == 1 {
			time.Sleep(2 * lease)
		}
		return nil
	}))
	q := queueOn(t, slow, prefix, Config{Lease: lease})
	rival := queueOn(t, redistest.Client(t, nil), prefix, Config{Lease: lease})
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)

	var runs atomic.Int32
	h := HandlerFunc(func(context.Context, *Job) ([]byte, error) { runs.Add(1); return []byte("ok"), nil })
	startWork(t, q, h, &WorkOpts{Concurrency: 1})
	waitFor(t, "the first run", func() bool { return runs.Load() == 1 })
	startWork(t, rival, h, &WorkOpts{Concurrency: 4, PollInterval: 20 * time.Millisecond})
	waitFor(t, "success", func() bool { return state(t, q, j.ID) == StateSucceeded })
	time.Sleep(lease) // time for a rival to take a lease that was let go
	require.EqualValues(t, 1, runs.Load(), "the job ran once")
	require.Positive(t, slowed.Load())
	got, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, 1, got.Attempt)
}

// A handler that succeeds as the grace period ends is completed, not
// released to run again.
func TestWorkShutdownCompletesSuccess(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	running := make(chan struct{})
	stop := startWork(t, q, HandlerFunc(func(ctx context.Context, _ *Job) ([]byte, error) {
		close(running)
		<-ctx.Done() // the grace ran out; the work is done anyway
		return []byte("finished at the bell"), nil
	}), &WorkOpts{ShutdownGrace: 100 * time.Millisecond})
	<-running
	stop()
	got, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, StateSucceeded, got.State)
	require.Equal(t, []byte("finished at the bell"), got.Result)
}

// A message on the cancel channel is a hint: a job that was not canceled
// keeps running.
func TestWorkIgnoresForgedCancel(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	running, release := make(chan struct{}), make(chan struct{})
	canceled := make(chan error, 1)
	startWork(t, q, HandlerFunc(func(ctx context.Context, _ *Job) ([]byte, error) {
		close(running)
		select {
		case <-release:
			return []byte("ok"), nil
		case <-ctx.Done():
			canceled <- context.Cause(ctx)
			return nil, ctx.Err()
		}
	}), nil)
	<-running
	n, err := q.rdb.Publish(ctx, q.ks.cancelChannel(), j.ID).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the worker heard it")
	select {
	case c := <-canceled:
		t.Fatalf("a forged cancel stopped the handler: %v", c)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	waitFor(t, "success", func() bool { return state(t, q, j.ID) == StateSucceeded })
	got, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, 1, got.Attempt, "no attempt was spent")
}

// Two runs of one job in one worker are tracked apart: the first one's
// exit does not hide the second from shutdown. (The second run waits out
// the canceled first run's lease: a short one, renewed well within it.)
func TestWorkTracksEachRun(t *testing.T) {
	t.Parallel()
	q := realQueue(t, &Config{Lease: 2 * time.Second})
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	var runs atomic.Int32
	first, second := make(chan struct{}), make(chan struct{})
	release := make(chan struct{})
	cause := make(chan error, 1)
	wctx, stopWork := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, HandlerFunc(func(ctx context.Context, _ *Job) ([]byte, error) {
			if runs.Add(1) == 1 {
				close(first)
				<-release // ignores its context, for a while
				return nil, nil
			}
			close(second)
			select {
			case <-ctx.Done():
				cause <- context.Cause(ctx)
			case <-time.After(20 * time.Second):
				cause <- errors.New("never canceled")
			}
			return nil, ctx.Err()
		}), &WorkOpts{Concurrency: 2, ShutdownGrace: 200 * time.Millisecond, Logger: quiet})
	}()
	<-first
	_, err = q.Cancel(ctx, j.ID)
	require.NoError(t, err)
	_, err = q.Retry(ctx, j.ID) // the other slot takes it: a second run of one ID
	require.NoError(t, err)
	<-second
	close(release) // the first run ends
	time.Sleep(50 * time.Millisecond)
	stopWorkPromptly(t, stopWork, done, "Work hung: shutdown did not reach the second run")
	require.ErrorIs(t, <-cause, ErrShutdown)
	got, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, StatePending, got.State, "released at shutdown")
}

// A claim still in flight when the grace period ends gives its job back
// unrun, and Work returns.
func TestWorkShutdownDuringClaim(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	inClaim := make(chan struct{})
	var once sync.Once
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		// A claim's EXEC moves the job from ready to leased: hold it back
		// until the grace period is over.
		if has(cmds, "zrem", ":ready") && has(cmds, "zadd", ":leased") {
			once.Do(func() { close(inClaim) })
			time.Sleep(500 * time.Millisecond)
		}
		return nil
	}))
	q := queueOn(t, rdb, redistest.Prefix(t), Config{})
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	var ran atomic.Bool
	wctx, stopWork := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, HandlerFunc(func(ctx context.Context, _ *Job) ([]byte, error) {
			ran.Store(true)
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Second):
			}
			return nil, ctx.Err()
		}), &WorkOpts{Concurrency: 1, ShutdownGrace: 50 * time.Millisecond, Logger: quiet})
	}()
	<-inClaim
	stopWorkPromptly(t, stopWork, done, "Work hung on a claim that landed after the grace period")
	require.False(t, ran.Load(), "no handler starts once shutdown has begun")
	got, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, StatePending, got.State, "the job went back")
	require.Zero(t, got.Attempt, "without spending an attempt")
}

// An outcome that cannot be written while Redis is unreachable is written
// once it is back, while the lease still holds: the job does not run again.
func TestWorkRecordsOutcomeAfterOutage(t *testing.T) {
	t.Parallel()
	const lease = 3 * time.Second
	q, rival, proxy, j := cutOffAndRival(t, lease)
	ctx := context.Background()
	var runs atomic.Int32
	h := HandlerFunc(func(context.Context, *Job) ([]byte, error) {
		if runs.Add(1) == 1 {
			proxy.Partition(true) // Redis goes away as the handler succeeds
			go func() { time.Sleep(lease / 2); proxy.Partition(false) }()
		}
		return []byte("ok"), nil
	})
	startWork(t, q, h, &WorkOpts{Concurrency: 1})
	startWork(t, rival, h, &WorkOpts{Concurrency: 2, PollInterval: 50 * time.Millisecond})
	waitFor(t, "success", func() bool {
		got, err := rival.Get(ctx, j.ID)
		return err == nil && got.State == StateSucceeded
	})
	time.Sleep(lease) // time for a rerun, if the lease had been let go
	require.EqualValues(t, 1, runs.Load(), "the job ran once")
	got, err := rival.Get(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, 1, got.Attempt)
}

// A job deleted while it runs: the renewal finds no job, and the handler
// is stopped.
func TestWorkStopsHandlerOfDeletedJob(t *testing.T) {
	t.Parallel()
	q := realQueue(t, &Config{Lease: 600 * time.Millisecond})
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	running := make(chan struct{})
	cause := make(chan error, 1)
	startWork(t, q, HandlerFunc(func(ctx context.Context, _ *Job) ([]byte, error) {
		close(running)
		select {
		case <-ctx.Done():
			cause <- context.Cause(ctx)
		case <-time.After(10 * time.Second):
			cause <- errors.New("never stopped")
		}
		return nil, ctx.Err()
	}), nil)
	<-running
	require.NoError(t, q.rdb.Del(ctx, q.Keys(j.ID).Job).Err())
	c := <-cause
	require.ErrorIs(t, c, ErrLeaseLost)
	require.ErrorIs(t, c, ErrNotFound)
}

// Work recognises its own landed Fail (or Release) as it does its Complete.
// Work's outcome write is retried after an ambiguous error; a retried Fail
// whose EXEC ran and whose reply was lost finds the job no longer active
// under its token, and is reported as written, not as failed with
// ErrLeaseLost: OnRecorded and the log must not say "not written" for a
// write that landed.
func TestWorkRecognisesItsLandedFail(t *testing.T) {
	t.Parallel()
	cut, proxy := proxied(t)
	q := queueOn(t, cut, redistest.Prefix(t), Config{Lease: 10 * time.Second, MaxAttempts: 5})
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)

	type rec struct {
		j   *Job
		err error
	}
	recs := make(chan rec, 4)
	running, fail := make(chan struct{}), make(chan struct{})
	var once sync.Once
	startWork(t, q, HandlerFunc(func(context.Context, *Job) ([]byte, error) {
		once.Do(func() { close(running) })
		<-fail
		return nil, errors.New("handler failed")
	}), &WorkOpts{Concurrency: 1, OnRecorded: func(j *Job, err error) { recs <- rec{j, err} }})
	<-running
	proxy.Set(faultproxy.Faults{ExecCutProb: 1}) // the next EXEC (the Fail) runs, its reply is lost
	close(fail)
	var r rec
	select {
	case r = <-recs:
	case <-time.After(10 * time.Second):
		t.Fatal("nothing recorded")
	}
	proxy.Set(faultproxy.Faults{})
	stored, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	t.Logf("OnRecorded err: %v; stored: %s, LastError %q, exec cuts %d", r.err, stored.State, stored.LastError, proxy.Counts().ExecCuts)
	require.Equal(t, "handler failed", stored.LastError, "precondition: the Fail landed")
	require.NoError(t, r.err, "the Fail landed, but Work reported it as not written")
}

// Work does not start a handler whose lease has already run out.
//
// A claim decides by the TIME read in its first round trip and sets
// LeaseUntil = TIME + Lease; its EXEC lands later. When the EXEC is held up
// for longer than a lease (the process paused between the read and the EXEC,
// or the request sat in a congested link), the claim commits a lease that is
// already over, and any other worker may claim the job at once. Work knows
// it (the run's deadline, asked + Lease - LeaseMargin, has passed when
// execute starts); the self-fence only cancels the handler's context
// asynchronously, so whatever a handler started then did before it looked at
// ctx would overlap a rival's run of the same job.
func TestWorkDoesNotRunOnExpiredLease(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	const lease = 300 * time.Millisecond
	rdb := redistest.Client(t, nil)
	var held atomic.Bool
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		// The claim's EXEC (ready -> leased) is held up once, for two leases.
		if has(cmds, "zrem", ":ready") && has(cmds, "zadd", ":leased") && held.CompareAndSwap(false, true) {
			time.Sleep(2 * lease)
		}
		return nil
	}))
	prefix := redistest.Prefix(t)
	q := queueOn(t, rdb, prefix, Config{Lease: lease})
	other := redistest.Client(t, nil)
	rival := queueOn(t, other, prefix, Config{Lease: lease})
	ctx := context.Background()
	j, err := rival.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)

	type entry struct {
		redisNow   time.Time
		leaseUntil time.Time
		ctxErr     error
		rival      *Job
		rivalErr   error
	}
	entered := make(chan entry, 1)
	var once sync.Once
	startWork(t, q, HandlerFunc(func(hctx context.Context, jj *Job) ([]byte, error) {
		once.Do(func() {
			e := entry{leaseUntil: jj.LeaseUntil, ctxErr: hctx.Err()}
			e.redisNow, _ = other.Time(ctx).Result()
			// Another worker looks for work now, while this run is inside
			// its handler.
			e.rival, e.rivalErr = rival.Claim(ctx, "rival")
			entered <- e
		})
		<-hctx.Done()
		return nil, hctx.Err()
	}), &WorkOpts{Concurrency: 1})

	var e entry
	select {
	case e = <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never ran")
	}
	require.True(t, held.Load())
	t.Logf("handler entered at Redis time %v, its lease ended at %v (%v earlier); ctx.Err at entry: %v; rival claim: %v",
		e.redisNow.UTC().Format("15:04:05.000"), e.leaseUntil.UTC().Format("15:04:05.000"), e.redisNow.Sub(e.leaseUntil), e.ctxErr, e.rivalErr)
	if e.rival != nil {
		t.Logf("the rival claimed %q (attempt %d) while the first run was inside its handler", e.rival.ID, e.rival.Attempt)
	}
	if e.rival != nil {
		require.Equal(t, j.ID, e.rival.ID)
	}
	require.True(t, e.redisNow.Before(e.leaseUntil),
		"Work called the handler %v after its lease had run out in Redis; a rival could claim the job meanwhile (rival got it: %v)",
		e.redisNow.Sub(e.leaseUntil), e.rival != nil)
}

// The keeper renews relative to the run's deadline, not on a fixed Lease/3
// ticker started with the run. A claim that took a large share of the lease
// (slow EXEC, a pause, a queue of group-commit callers) leaves less than
// Lease/3 before the self-fence deadline; a fixed ticker would let the fence
// fire before the first renewal was even tried, cancel the handler with
// ErrLeaseExpired although Redis answered every request, and leave the job
// to sit out the rest of its lease and run again.
func TestWorkRenewsAfterSlowClaim(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	// Long enough that the first renewal, due within the 40% of the lease
	// the claim leaves less LeaseMargin, lands in time on a loaded machine.
	const lease = 3 * time.Second
	rdb := redistest.Client(t, nil)
	var held atomic.Bool
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		// The claim's EXEC is slow once: 60% of a lease. Nothing else is.
		if has(cmds, "zrem", ":ready") && has(cmds, "zadd", ":leased") && held.CompareAndSwap(false, true) {
			time.Sleep(lease * 6 / 10)
		}
		return nil
	}))
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Lease: lease})
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)

	var runs atomic.Int32
	causes := make(chan error, 4)
	startWork(t, q, HandlerFunc(func(hctx context.Context, _ *Job) ([]byte, error) {
		runs.Add(1)
		select {
		case <-hctx.Done(): // should not happen: Redis is reachable throughout
			causes <- context.Cause(hctx)
			return nil, hctx.Err()
		case <-time.After(2 * lease): // a handler that needs two leases, renewed
			causes <- nil
			return []byte("ok"), nil
		}
	}), &WorkOpts{Concurrency: 1})

	var cause error
	select {
	case cause = <-causes:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never ran")
	}
	require.True(t, held.Load())
	require.NoError(t, cause, "the handler was stopped although Redis answered every request")
	waitFor(t, "success", func() bool { return state(t, q, j.ID) == StateSucceeded })
	require.EqualValues(t, 1, runs.Load())
}

// A success whose Complete is refused for good (here ErrTooLarge: the result
// does not fit Config.MaxValueBytes) does not leave the job to run again:
// its handler runs once. Were the refusal only logged, the job would stay
// active under a lease nobody renews, be claimed and run again after each
// full lease until its attempts were spent, and then fail with "lease ...
// expired", not with the reason: a handler that succeeded would run
// MaxAttempts times.
func TestWorkFailsSuccessThatCannotBeStored(t *testing.T) {
	t.Parallel()
	const lease = 200 * time.Millisecond
	q := realQueue(t, &Config{Lease: lease, MaxValueBytes: 1024})
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{MaxAttempts: 3})
	require.NoError(t, err)
	var runs atomic.Int32
	var recorded atomic.Value
	startWork(t, q, HandlerFunc(func(context.Context, *Job) ([]byte, error) {
		runs.Add(1)
		return make([]byte, 4096), nil // succeeded, with a result too large to store
	}), &WorkOpts{Concurrency: 2, PollInterval: 20 * time.Millisecond,
		OnRecorded: func(_ *Job, err error) {
			if err != nil {
				recorded.Store(err.Error())
			}
		}})
	waitFor(t, "the job to end", func() bool { s := state(t, q, j.ID); return s.Finished() })
	got, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	t.Logf("handler runs: %d; job %s after %d attempts, LastError %q; OnRecorded error: %v",
		runs.Load(), got.State, got.Attempt, got.LastError, recorded.Load())
	require.EqualValues(t, 1, runs.Load(), "a handler that succeeded was run again")
}

// Retry of a job canceled while it ran waits for the canceled run's lease,
// so that the job is not claimable while that run is still inside its
// handler. The canceled worker learns of the cancel by a pub/sub hint plus a
// GET, and its handler then needs a moment to stop; a Retry with RunAt = now
// would let another worker claim and run the job alongside. Here the handler
// stops 50ms after its ctx is canceled, well inside LeaseMargin (200ms), the
// margin within which self-fencing promises that no other worker runs the
// job.
func TestRetryAfterCancelWaitsForCanceledRun(t *testing.T) {
	t.Parallel()
	const lease = time.Second
	q := realQueue(t, &Config{Lease: lease})
	rival, err := NewQueue(redistest.Client(t, nil), "q", &q.cfg)
	require.NoError(t, err)
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)

	var inside, most, runs atomic.Int32
	h := HandlerFunc(func(hctx context.Context, _ *Job) ([]byte, error) {
		n := inside.Add(1)
		runs.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		defer inside.Add(-1)
		<-hctx.Done()
		time.Sleep(50 * time.Millisecond) // stopping takes a moment
		return nil, hctx.Err()
	})
	startWork(t, q, h, &WorkOpts{Concurrency: 1, ShutdownGrace: 100 * time.Millisecond})
	waitFor(t, "the first run", func() bool { return runs.Load() == 1 })
	startWork(t, rival, h, &WorkOpts{Concurrency: 1, PollInterval: 10 * time.Millisecond, ShutdownGrace: 100 * time.Millisecond})

	_, err = q.Cancel(ctx, j.ID)
	require.NoError(t, err)
	_, err = q.Retry(ctx, j.ID)
	require.NoError(t, err)
	waitFor(t, "the second run", func() bool { return runs.Load() == 2 })
	time.Sleep(100 * time.Millisecond)
	require.EqualValues(t, 1, most.Load(), "two runs of job %q were inside the handler at once", j.ID)
}

// Work checks again a cancel hint that arrives while a check of an earlier
// hint is in flight. A hint that is forged (or stale, from an earlier run of
// the same ID) starts a check whose GET may be answered before the real
// Cancel lands; were the real cancel's hint dropped meanwhile, the stale
// answer "still ours" would let the handler run on until the keeper's next
// renewal, up to Lease/3 later (10s with the default lease), instead of a
// round trip later.
func TestWorkRechecksCancelHintsDuringCheck(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	const lease = 6 * time.Second
	rdb := redistest.Client(t, nil)
	readDone := make(chan struct{})
	var gets atomic.Int32
	rdb.AddHook(getHook(func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		err := next(ctx, cmd)
		if cmd.Name() == "get" && gets.Add(1) == 1 {
			close(readDone)                    // Redis has answered the first check's GET ...
			time.Sleep(300 * time.Millisecond) // ... and the reply is slow to come back
		}
		return err
	}))
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Lease: lease})
	admin := queueOn(t, redistest.Client(t, nil), q.cfg.Prefix, Config{Lease: lease})
	ctx := context.Background()
	j, err := admin.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)

	running := make(chan struct{})
	stopped := make(chan time.Time, 1)
	startWork(t, q, HandlerFunc(func(hctx context.Context, _ *Job) ([]byte, error) {
		close(running)
		<-hctx.Done()
		stopped <- time.Now()
		return nil, hctx.Err()
	}), &WorkOpts{Concurrency: 1, ShutdownGrace: 100 * time.Millisecond})
	<-running

	// A forged hint (anyone who may publish on the channel can send one).
	require.NoError(t, admin.rdb.Publish(ctx, q.ks.cancelChannel(), j.ID).Err())
	<-readDone
	_, err = admin.Cancel(ctx, j.ID) // the real cancel, while that check is in flight
	require.NoError(t, err)
	canceledAt := time.Now()

	select {
	case at := <-stopped:
		t.Logf("handler stopped %v after the cancel", at.Sub(canceledAt))
		require.Less(t, at.Sub(canceledAt), time.Second, "the real cancel was only noticed by the keeper's renewal")
	case <-time.After(5 * time.Second):
		t.Fatal("the handler was never stopped")
	}
}

// Work runs a job at least once, never twice at once. A success whose
// completion cannot reach Redis (cut off as the handler returns, so the
// completion's reply and every renewal are lost) is not recorded: when
// the run's deadline passes it gives up, reports the outcome it could not
// record, and lets the job go. The job then runs again, but only once the
// first run's lease has ended in Redis, after that run's handler returned,
// and it finishes once: the first completion, delivered late when the link
// heals, is fenced off.
func TestWorkRunsAgainOnlyAfterLostCompletionsLease(t *testing.T) {
	t.Parallel()
	const lease = 2 * time.Second
	q, rival, proxy, j := cutOffAndRival(t, lease)
	ctx := context.Background()

	type event struct {
		at  time.Time
		j   *Job
		err error
	}
	returned := make(chan event, 1)
	recorded := make(chan event, 4)
	startWork(t, q, HandlerFunc(func(_ context.Context, c *Job) ([]byte, error) {
		proxy.Partition(true) // nothing this worker writes from now on gets through
		returned <- event{at: time.Now(), j: c}
		return []byte("first"), nil
	}), &WorkOpts{Concurrency: 1, OnRecorded: func(j *Job, err error) { recorded <- event{time.Now(), j, err} }})
	first := <-returned

	var gaveUp event
	select {
	case gaveUp = <-recorded:
	case <-time.After(10 * lease):
		t.Fatal("the cut-off run never gave up its outcome")
	}
	t.Logf("the run gave up: %v", gaveUp.err)
	require.Error(t, gaveUp.err, "the completion could not be recorded")
	require.NotErrorIs(t, gaveUp.err, ErrLeaseLost, "nobody else took the job: the run gave up at its own deadline")
	require.Equal(t, first.j.LeaseToken, gaveUp.j.LeaseToken)
	held, err := rival.Get(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, StateActive, held.State, "the completion did not land")
	require.Equal(t, first.j.LeaseToken, held.LeaseToken)

	c, claimedAt := rivalClaimsAfterLease(t, ctx, rival)
	require.Equal(t, j.ID, c.ID)
	require.Equal(t, 2, c.Attempt, "a new attempt")
	require.NotEqual(t, first.j.LeaseToken, c.LeaseToken)
	require.False(t, c.UpdatedAt.Before(held.LeaseUntil),
		"claimed again at %v, by Redis's clock, before the first run's lease ended at %v", c.UpdatedAt, held.LeaseUntil)
	require.True(t, first.at.Before(gaveUp.at) && gaveUp.at.Before(claimedAt),
		"the first handler returned, then its run gave up, then the job was claimed again")
	_, err = rival.Complete(ctx, c, []byte("second"))
	require.NoError(t, err)

	proxy.Partition(false) // what the cut-off worker sent is delivered now, late
	time.Sleep(lease)
	got, err := rival.Get(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, StateSucceeded, got.State)
	require.Equal(t, "second", string(got.Result), "finished once, by the second run")
	require.Equal(t, c.LeaseToken, got.LeaseToken)
	select {
	case e := <-recorded:
		t.Fatalf("the first run recorded a second outcome: %+v", e)
	default:
	}
}

// cutOffAndRival returns a queue q that reaches Redis through proxy, which
// the test can partition, and a rival queue on the same keys that reaches
// Redis directly, both with the given lease; the rival has enqueued one
// job, j.
func cutOffAndRival(t *testing.T, lease time.Duration) (q, rival *Queue, proxy *faultproxy.Proxy, j *Job) {
	t.Helper()
	cut, proxy := proxied(t)
	prefix := redistest.Prefix(t)
	q = queueOn(t, cut, prefix, Config{Lease: lease})
	rival = queueOn(t, redistest.Client(t, nil), prefix, Config{Lease: lease})
	j, err := rival.Enqueue(context.Background(), "t", nil, nil)
	require.NoError(t, err)
	return q, rival, proxy, j
}

// rivalClaimsAfterLease waits until rival claims a job, which it can only
// once the lease of the job's current run has run out, and returns the
// claimed job and when the claim returned.
func rivalClaimsAfterLease(t *testing.T, ctx context.Context, rival *Queue) (*Job, time.Time) {
	t.Helper()
	var c *Job
	waitFor(t, "the rival's claim after the lease ran out", func() bool {
		var err error
		c, err = rival.Claim(ctx, "rival")
		if errors.Is(err, ErrNoJob) {
			return false
		}
		require.NoError(t, err)
		return true
	})
	return c, time.Now()
}

// stopWorkPromptly cancels Work's context with stopWork and requires Work
// to return nil on done within 3 seconds; hung is the failure message if it
// does not return at all.
func stopWorkPromptly(t *testing.T, stopWork context.CancelFunc, done <-chan error, hung string) {
	t.Helper()
	t0 := time.Now()
	stopWork()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal(hung)
	}
	require.Less(t, time.Since(t0), 3*time.Second)
}

// A run's write that its deadline stopped before it was sent gets a clear
// typed error that still matches the context's, not a bare
// context.DeadlineExceeded: ErrOutcomeUnknown when an earlier try was sent
// and may yet land, and ErrLeaseLost when the try began after the run's
// deadline (its lease, by this process's clock, had run out: a stuck
// handler's late write) and nothing was written. A try that began within
// the deadline is not ErrLeaseLost: the lease may still hold in Redis for
// the margin, and no one else took the job.
func TestWorkWriteStoppedBeforeSentIsLeaseLost(t *testing.T) {
	t.Parallel()
	q := realQueue(t, &Config{Lease: 2 * time.Second})
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		earlierSent bool          // the first try was sent and its reply lost
		deadline    time.Duration // the run's deadline, from now
		want        error         // nil: neither ErrLeaseLost nor ErrOutcomeUnknown
	}{
		{"begun past the deadline", false, -time.Millisecond, ErrLeaseLost},
		{"an earlier try sent", true, 100 * time.Millisecond, ErrOutcomeUnknown},
		{"begun within the deadline", false, 50 * time.Millisecond, nil},
	} {
		j, err := q.Enqueue(ctx, "t", nil, nil)
		require.NoError(t, err)
		c, err := q.Claim(ctx, "w")
		require.NoError(t, err)
		require.Equal(t, j.ID, c.ID)
		var reported error
		w := &worker{q: q, writes: ctx, o: WorkOpts{Logger: quiet, OnRecorded: func(_ *Job, err error) { reported = err }}}
		r := &run{w: w, job: c, expired: make(chan struct{}), idx: -1, deadline: time.Now().Add(tc.deadline)}
		tries := 0
		err = w.record(r, func(ctx context.Context, j *Job) (*Job, error) {
			tries++
			if tc.earlierSent && tries == 1 {
				return nil, outcomeUnknown("complete", j.ID, context.DeadlineExceeded) // sent; its reply lost
			}
			<-ctx.Done() // the deadline ends before the write is sent
			return q.Complete(ctx, j, nil)
		})
		require.ErrorIs(t, err, context.DeadlineExceeded, tc.name)
		require.Equal(t, err, reported, "%s: OnRecorded gets the same error", tc.name)
		switch tc.want {
		case ErrLeaseLost:
			require.ErrorIs(t, err, ErrLeaseLost, tc.name)
			require.NotErrorIs(t, err, ErrOutcomeUnknown, "%s: the write was never sent", tc.name)
			require.ErrorContains(t, err, j.ID, tc.name)
		case ErrOutcomeUnknown:
			require.Equal(t, 2, tries, tc.name)
			require.ErrorIs(t, err, ErrOutcomeUnknown, "%s: the first try may yet land", tc.name)
			require.NotErrorIs(t, err, ErrLeaseLost, tc.name)
			require.ErrorContains(t, err, j.ID, tc.name)
		default:
			require.NotErrorIs(t, err, ErrLeaseLost, "%s: the lease may still hold", tc.name)
			require.NotErrorIs(t, err, ErrOutcomeUnknown, tc.name)
		}
		got, err := q.Get(ctx, j.ID)
		require.NoError(t, err)
		require.Equal(t, StateActive, got.State, "%s: nothing was written", tc.name)
		require.Equal(t, c.LeaseToken, got.LeaseToken, tc.name)
	}
}

// A run's context holds the run itself (runValues): a handler's lookups
// find it through any context derived from it, Work's cancellation reaches
// it with its cause, and joining Work's context starts no goroutine.
func TestARunsContextCarriesItsRunAndWorksCancellationWithoutAGoroutine(t *testing.T) {
	runs, stopRuns := context.WithCancelCause(context.Background())
	const n = 2000
	before := runtime.NumGoroutine()
	rs := make([]*run, n)
	for i := range rs {
		r := &run{}
		r.values = runValues{Context: runs, r: r}
		r.ctx, r.cancel = context.WithCancelCause(&r.values)
		rs[i] = r
	}
	require.Less(t, runtime.NumGoroutine()-before, n/2, "joining Work's context started a goroutine per run")
	type other struct{}
	r := rs[0]
	derived := []context.Context{
		r.ctx,
		context.WithValue(r.ctx, other{}, 1),
		context.WithoutCancel(r.ctx),
	}
	tctx, cancel := context.WithTimeout(context.WithValue(r.ctx, other{}, 1), time.Hour)
	defer cancel()
	derived = append(derived, tctx)
	for _, ctx := range derived {
		got, _ := ctx.Value(runKey{}).(*run)
		require.Same(t, r, got)
	}
	require.Nil(t, r.ctx.Value(other{}))
	rs[1].cancel(nil)
	require.Error(t, rs[1].ctx.Err())
	require.NoError(t, r.ctx.Err(), "one run's end leaves the others")
	cause := errors.New("work stopped")
	stopRuns(cause)
	for _, r := range rs {
		<-r.ctx.Done()
		if r != rs[1] {
			require.Same(t, cause, context.Cause(r.ctx))
		}
	}
	require.ErrorIs(t, context.Cause(tctx), cause)
}
