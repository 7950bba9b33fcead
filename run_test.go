package jobkey

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/faultproxy"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// queueOn returns a queue named "q" under prefix on rdb.
func queueOn(t *testing.T, rdb *redis.Client, prefix string, cfg Config) *Queue {
	t.Helper()
	cfg.Prefix = prefix
	q, err := NewQueue(rdb, "q", &cfg)
	require.NoError(t, err)
	return q
}

// proxied returns a client of the shared real Redis through a fault proxy.
func proxied(t *testing.T) (*redis.Client, *faultproxy.Proxy) {
	t.Helper()
	target := redistest.RequireReal(t)
	o, err := redis.ParseURL(target.URL)
	require.NoError(t, err)
	p, err := faultproxy.Start(o.Addr)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return redistest.ClientFor(t, "redis://"+p.Addr, func(o *redis.Options) {
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
	}), p
}

// A worker cut off from Redis stops its handler before its lease can run
// out, so the worker that claims the job next never runs it at the same
// time (issue 9, item 2).
func TestWorkFencesItselfWhenCutOff(t *testing.T) {
	t.Parallel()
	cut, proxy := proxied(t)
	prefix := redistest.Prefix(t)
	const lease = time.Second
	q := queueOn(t, cut, prefix, Config{Lease: lease})
	rival := queueOn(t, redistest.Client(t, nil), prefix, Config{Lease: lease})
	ctx := context.Background()
	j, err := rival.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)

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

	var c *Job
	waitFor(t, "the rival's claim after the lease ran out", func() bool {
		c, err = rival.Claim(ctx, "rival")
		if errors.Is(err, ErrNoJob) {
			return false
		}
		require.NoError(t, err)
		return true
	})
	claimedAt := time.Now()
	require.Equal(t, j.ID, c.ID)
	s := <-stopped
	require.ErrorIs(t, s.cause, ErrLeaseExpired)
	require.True(t, s.at.Before(claimedAt), "the cut-off handler stopped %v after the cut, the rival claimed %v after it",
		s.at.Sub(cutAt), claimedAt.Sub(cutAt))
	proxy.Partition(false)
}

// The lease is kept until the outcome is written, not only while the
// handler runs: a completion that starts late does not let the job run
// again (issue 9, item 3).
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
// released to run again (issue 9, item 4).
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
// keeps running (issue 9, item 7).
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
// exit does not hide the second from shutdown (issue 9, item 9).
func TestWorkTracksEachRun(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
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
	t0 := time.Now()
	stopWork()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Work hung: shutdown did not reach the second run")
	}
	require.Less(t, time.Since(t0), 3*time.Second)
	require.ErrorIs(t, <-cause, ErrShutdown)
	got, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, StatePending, got.State, "released at shutdown")
}

// A claim still in flight when the grace period ends gives its job back
// unrun, and Work returns (issue 9, item 10).
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
	t0 := time.Now()
	stopWork()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Work hung on a claim that landed after the grace period")
	}
	require.Less(t, time.Since(t0), 3*time.Second)
	require.False(t, ran.Load(), "no handler starts once shutdown has begun")
	got, err := q.Get(ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, StatePending, got.State, "the job went back")
	require.Zero(t, got.Attempt, "without spending an attempt")
}

// An outcome that cannot be written while Redis is unreachable is written
// once it is back, while the lease still holds: the job does not run again
// (issue 10, item 3).
func TestWorkRecordsOutcomeAfterOutage(t *testing.T) {
	t.Parallel()
	cut, proxy := proxied(t)
	prefix := redistest.Prefix(t)
	const lease = 3 * time.Second
	q := queueOn(t, cut, prefix, Config{Lease: lease})
	rival := queueOn(t, redistest.Client(t, nil), prefix, Config{Lease: lease})
	ctx := context.Background()
	j, err := rival.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
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
// is stopped (issue 10, item 9).
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
