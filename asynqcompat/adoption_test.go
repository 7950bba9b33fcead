package asynqcompat

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/stretchr/testify/require"
)

// token is one task's record across both systems: the retry count its
// handler saw at each run, wherever it ran.
type token struct {
	mu   sync.Mutex
	runs []int
}

// tokenClass is what a task's handler does, and so how many runs asynq
// alone would give it.
type tokenClass int

const (
	classOK      tokenClass = iota // succeeds: 1 run
	classRetry2                    // fails twice, then succeeds: 3 runs
	classSkip                      // returns SkipRetry: 1 run
	classExhaust                   // MaxRetry(1), always fails: 2 runs
	classes
)

func (c tokenClass) runs() int { return [...]int{1, 3, 1, 2}[c] }

// ledger records the runs of every token, and runs the one handler both
// systems use, unchanged: asynq's server calls it directly, jobkey's Work
// through Handler.
type ledger struct {
	mu     sync.Mutex
	tokens map[string]*token
	class  map[string]tokenClass
}

func (l *ledger) add(id string, c tokenClass) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tokens[id] = &token{}
	l.class[id] = c
}

func (l *ledger) handle(ctx context.Context, task *asynq.Task) error {
	id := string(task.Payload())
	n, _ := asynq.GetRetryCount(ctx)
	l.mu.Lock()
	tk, c := l.tokens[id], l.class[id]
	l.mu.Unlock()
	if tk == nil {
		return fmt.Errorf("unknown token %q", id)
	}
	tk.mu.Lock()
	tk.runs = append(tk.runs, n)
	tk.mu.Unlock()
	time.Sleep(2 * time.Millisecond)
	switch {
	case c == classRetry2 && n < 2, c == classExhaust:
		return errors.New("fails")
	case c == classSkip:
		return fmt.Errorf("gives up: %w", asynq.SkipRetry)
	}
	return nil
}

// settled says whether every token ran as often as asynq alone would run
// it, and how many runs all tokens made so far.
func (l *ledger) settled() (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ok, all := true, 0
	for id, tk := range l.tokens {
		tk.mu.Lock()
		n := len(tk.runs)
		tk.mu.Unlock()
		all += n
		ok = ok && n >= l.class[id].runs()
	}
	return ok, all
}

// settle waits until every token ran as often as asynq alone would run it,
// or no token has run for quiet: a loaded machine slows the runs down, and
// only a stop in them tells that a task is lost or stuck.
func (l *ledger) settle(quiet time.Duration) {
	last, lastAt := -1, time.Now()
	for {
		ok, n := l.settled()
		if ok {
			return
		}
		if n != last {
			last, lastAt = n, time.Now()
		} else if time.Since(lastAt) > quiet {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// check holds each token to what asynq alone would have done: as many runs
// as its class gives, each with the next retry count (none run twice, none
// lost, none stuck). where says where a token's task is now, for the
// failure's message.
func (l *ledger) check(t *testing.T, where func(id string) string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, tk := range l.tokens {
		want := make([]int, l.class[id].runs())
		for i := range want {
			want[i] = i
		}
		tk.mu.Lock()
		got := slices.Clone(tk.runs)
		tk.mu.Unlock()
		slices.Sort(got)
		if !slices.Equal(want, got) {
			what := "ran too often, or with a retry count repeated"
			if len(got) < len(want) {
				what = "is lost or stuck: it stopped running"
			}
			require.Equal(t, want, got, "task %s (class %d) %s: asynq alone runs it with the retry counts %v, it ran with %v; it is now %s",
				id, l.class[id], what, want, got, where(id))
		}
	}
}

// One type, moved into jobkey and then rolled back to asynq, under load:
// producers enqueue through the routed Client the whole time, asynq's
// server and jobkey's Work run the same unchanged handler, which fails,
// retries and returns SkipRetry. Each direction is killed at every step of
// a move in turn (each rerun killed at the next step, with and without
// PauseQueue) and then rerun to its end. Every task runs as asynq alone
// would have run it, and nothing is left paused, held or locked.
func TestAdoptionRoundTripUnderLoadRunsEachTaskAsAsynqWould(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const typ = "email:send"
	fast := func(int) time.Duration { return 50 * time.Millisecond }
	q := e.queue(t, "emails", &jobkey.Config{Backoff: fast, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	l := &ledger{tokens: map[string]*token{}, class: map[string]tokenClass{}}

	srv := asynq.NewServerFromRedisClient(e.rdb, asynq.Config{
		Concurrency: 4, LogLevel: asynq.FatalLevel, DelayedTaskCheckInterval: 50 * time.Millisecond,
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return 50 * time.Millisecond },
	})
	require.NoError(t, srv.Start(asynq.HandlerFunc(l.handle)))
	defer srv.Shutdown()
	wctx, stopWork := context.WithCancel(e.ctx)
	workDone := make(chan error, 1)
	go func() {
		workDone <- q.Work(wctx, HandlerFunc(l.handle), &jobkey.WorkOpts{Concurrency: 4, PollInterval: 10 * time.Millisecond})
	}()
	defer func() { stopWork(); <-workDone }()

	// The producers: the routed Client, swapped when the type moves.
	ac := asynq.NewClientFromRedisClient(e.rdb)
	toAsynq := NewClient(ac, nil)
	toJobkey := NewClient(ac, []Route{{Type: typ, To: q}})
	var cli atomic.Pointer[Client]
	cli.Store(toAsynq)
	var seq atomic.Int64
	produce := func(n int) {
		for range n {
			i := seq.Add(1)
			id := fmt.Sprintf("tok-%d", i)
			c := tokenClass(i % int64(classes))
			l.add(id, c)
			opts := []asynq.Option{asynq.TaskID(id), asynq.ProcessIn(time.Duration(i%80) * 50 * time.Millisecond)}
			if c == classExhaust {
				opts = append(opts, asynq.MaxRetry(1))
			}
			_, err := cli.Load().EnqueueContext(e.ctx, asynq.NewTask(typ, []byte(id)), opts...)
			require.NoError(t, err)
		}
	}
	pctx, stopProducing := context.WithCancel(e.ctx)
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		for pctx.Err() == nil {
			produce(2)
			time.Sleep(20 * time.Millisecond) // about 100 tasks/s
		}
	}()
	produce(300) // a backlog in asynq, due over the next 4 seconds

	// Into jobkey: producers first, then the tasks that wait in asynq.
	cli.Store(toJobkey)
	for i, point := range crashPoints {
		var crashed atomic.Bool
		_, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: typ, To: q, Concurrency: 4, PauseQueue: i%2 == 0, Wait: 5 * time.Second,
			crashAt: crashOnce(point, &crashed), lockTTL: 600 * time.Millisecond})
		require.ErrorIs(t, err, errCrash, "into jobkey, killed at %s", point)
	}
	rep, err := Migrate(e.ctx, e.rdb, MigrateOpts{Type: typ, To: q, Wait: 5 * time.Second})
	require.NoError(t, err)
	require.Empty(t, rep.Twice)
	t.Logf("into jobkey, the last rerun: moved %d, finished %d, undone %d, left %d", rep.Moved, rep.AlreadyMoved, len(rep.Undone), len(rep.Left))

	produce(300) // a backlog in jobkey
	// Back to asynq, the same way.
	cli.Store(toAsynq)
	for i, point := range crashPoints {
		var crashed atomic.Bool
		_, err := MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: typ, Concurrency: 4, PauseQueue: i%2 == 1, Wait: 5 * time.Second,
			crashAt: crashOnce(point, &crashed), lockTTL: 600 * time.Millisecond})
		require.ErrorIs(t, err, errCrash, "into asynq, killed at %s", point)
	}
	rep, err = MigrateToAsynq(e.ctx, e.rdb, RollbackOpts{From: q, Type: typ, Wait: 5 * time.Second})
	require.NoError(t, err)
	require.Empty(t, rep.Twice)
	t.Logf("into asynq, the last rerun: moved %d, finished %d, undone %d, left %d", rep.Moved, rep.AlreadyMoved, len(rep.Undone), len(rep.Left))
	stopProducing()
	<-produced

	l.settle(10 * time.Second)
	time.Sleep(500 * time.Millisecond) // a run too many, if any, has time to show
	t.Logf("%d tasks", seq.Load())
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	l.check(t, func(id string) string {
		where := "in asynq: "
		if ti, err := ins.GetTaskInfo("default", id); err == nil {
			where += fmt.Sprintf("%s, retried %d of %d", ti.State, ti.Retried, ti.MaxRetry)
		} else {
			where += err.Error()
		}
		if j, err := q.Get(e.ctx, id); err == nil {
			where += fmt.Sprintf("; in jobkey: %s, attempt %d of %d, run at %s, meta %v", j.State, j.Attempt, j.MaxAttempts, j.RunAt.Format(time.RFC3339Nano), j.Meta)
		} else {
			where += "; in jobkey: " + err.Error()
		}
		return where
	})
	qi, err := ins.GetQueueInfo("default")
	require.NoError(t, err)
	require.False(t, qi.Paused, "no queue is left paused")
	noneLeft(t, e, q, "default")
}
