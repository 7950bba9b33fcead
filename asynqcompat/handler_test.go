package asynqcompat

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/stretchr/testify/require"
)

// work runs h on q until every job in ids is finished, and returns them.
func work(t *testing.T, e *env, q *jobkey.Queue, h jobkey.Handler, ids ...string) map[string]*jobkey.Job {
	t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- q.Work(ctx, h, &jobkey.WorkOpts{Concurrency: 4, PollInterval: 20 * time.Millisecond}) }()
	out := map[string]*jobkey.Job{}
	require.Eventually(t, func() bool {
		for _, id := range ids {
			j, err := q.Get(e.ctx, id)
			if err != nil || !j.State.Finished() {
				return false
			}
			out[id] = j
		}
		return true
	}, 20*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	return out
}

// A real asynq handler, unchanged: it reads the task's type and payload,
// and its error decides the outcome as it did in asynq.
func TestHandlerOutcomes(t *testing.T) {
	e := newEnv(t)
	q := e.queue(t, "h", &jobkey.Config{Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	var mu sync.Mutex
	seen := map[string][]string{} // id -> what the handler saw, per attempt
	h := HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		j, ok := JobFrom(ctx)
		if !ok {
			return errors.New("no job in ctx")
		}
		mu.Lock()
		seen[j.ID] = append(seen[j.ID], fmt.Sprintf("%s:%s:%d/%d:%s", task.Type(), task.Payload(), j.Attempt, j.MaxAttempts, j.Queue))
		mu.Unlock()
		switch string(task.Payload()) {
		case "ok":
			SetResult(ctx, []byte("result of "+j.ID))
			return nil
		case "skip":
			return fmt.Errorf("bad input: %w", asynq.SkipRetry)
		case "revoke":
			return asynq.RevokeTask
		case "flaky":
			if j.Attempt < 3 {
				return errors.New("try again")
			}
			return nil
		case "panic":
			var w *asynq.ResultWriter
			_, err := w.Write([]byte("x")) // a handler that panics
			return err
		}
		return errors.New("unexpected payload")
	})
	for _, p := range []string{"ok", "skip", "revoke", "flaky", "panic"} {
		_, err := q.Enqueue(e.ctx, "t:"+p, []byte(p), &jobkey.EnqueueOpts{ID: p, MaxAttempts: 5})
		require.NoError(t, err)
	}
	jobs := work(t, e, q, h, "ok", "skip", "revoke", "flaky", "panic")

	require.Equal(t, jobkey.StateSucceeded, jobs["ok"].State)
	require.Equal(t, "result of ok", string(jobs["ok"].Result))
	require.Equal(t, []string{"t:ok:ok:1/5:h"}, seen["ok"])

	for _, id := range []string{"skip", "revoke"} {
		require.Equal(t, jobkey.StateFailed, jobs[id].State, id)
		require.Equal(t, 1, jobs[id].Attempt, "%s: failed for good at the first attempt", id)
		require.Len(t, seen[id], 1, id)
	}
	require.Contains(t, jobs["skip"].LastError, "bad input")
	require.Contains(t, jobs["revoke"].LastError, "revoke task")

	require.Equal(t, jobkey.StateSucceeded, jobs["flaky"].State)
	require.Equal(t, 3, jobs["flaky"].Attempt)

	require.Equal(t, jobkey.StateFailed, jobs["panic"].State)
	require.Equal(t, 5, jobs["panic"].Attempt, "a panic fails the attempt, and the job is retried")
	require.Contains(t, jobs["panic"].LastError, "nil pointer")
}

// asynq's ServeMux with a middleware runs as a jobkey handler: routing by
// type, the middleware around each task, and NotFound for unknown types.
func TestHandlerServeMux(t *testing.T) {
	e := newEnv(t)
	q := e.queue(t, "mux", nil)
	var mu sync.Mutex
	var log []string
	mux := asynq.NewServeMux()
	mux.Use(func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			mu.Lock()
			log = append(log, "before "+task.Type())
			mu.Unlock()
			err := next.ProcessTask(ctx, task)
			mu.Lock()
			log = append(log, fmt.Sprintf("after %s: %v", task.Type(), err))
			mu.Unlock()
			return err
		})
	})
	mux.HandleFunc("email:welcome", func(ctx context.Context, task *asynq.Task) error {
		SetResult(ctx, append([]byte("sent "), task.Payload()...))
		return nil
	})
	mux.HandleFunc("email:", func(ctx context.Context, task *asynq.Task) error { // asynq's prefix match
		return fmt.Errorf("no template for %s: %w", task.Type(), asynq.SkipRetry)
	})
	for _, spec := range [][2]string{{"a", "email:welcome"}, {"b", "email:other"}, {"c", "sms:hello"}} {
		_, err := q.Enqueue(e.ctx, spec[1], []byte("ada"), &jobkey.EnqueueOpts{ID: spec[0], MaxAttempts: 2})
		require.NoError(t, err)
	}
	jobs := work(t, e, q, Handler(mux), "a", "b", "c")
	require.Equal(t, jobkey.StateSucceeded, jobs["a"].State)
	require.Equal(t, "sent ada", string(jobs["a"].Result))
	require.Equal(t, jobkey.StateFailed, jobs["b"].State)
	require.Equal(t, 1, jobs["b"].Attempt, "SkipRetry through the mux and the middleware")
	require.Contains(t, jobs["b"].LastError, "no template for email:other")
	// The mux's NotFound handler errors without SkipRetry, as in asynq: the
	// job uses its attempts.
	require.Equal(t, jobkey.StateFailed, jobs["c"].State)
	require.Equal(t, 2, jobs["c"].Attempt)
	require.Contains(t, jobs["c"].LastError, "handler not found")
	mu.Lock()
	defer mu.Unlock()
	require.Contains(t, log, "before email:welcome")
	require.Contains(t, log, "after email:welcome: <nil>")
	require.Contains(t, log, "before sms:hello")
}

func TestJobFromAndSetResultOutsideAHandler(t *testing.T) {
	_, ok := JobFrom(context.Background())
	require.False(t, ok)
	require.False(t, SetResult(context.Background(), []byte("x")))
}

// A handler that reads asynq's context helpers and writes its result with
// task.ResultWriter() runs unchanged: the helpers report what asynq would,
// the counts going on from the retries spent in asynq before a move, and
// the last write becomes the job's result.
func TestHandlerServesAsynqHelpersAndResultWriter(t *testing.T) {
	e := newEnv(t)
	q := e.queue(t, "jk", &jobkey.Config{Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	var mu sync.Mutex
	seen := map[string][]string{}
	h := HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, ok1 := asynq.GetTaskID(ctx)
		n, ok2 := asynq.GetRetryCount(ctx)
		m, ok3 := asynq.GetMaxRetry(ctx)
		qn, ok4 := asynq.GetQueueName(ctx)
		if !ok1 || !ok2 || !ok3 || !ok4 {
			return fmt.Errorf("asynq helpers not served: %v %v %v %v", ok1, ok2, ok3, ok4)
		}
		mu.Lock()
		seen[id] = append(seen[id], fmt.Sprintf("%d/%d %s", n, m, qn))
		mu.Unlock()
		w := task.ResultWriter()
		if w == nil {
			return errors.New("no ResultWriter")
		}
		if w.TaskID() != id {
			return fmt.Errorf("ResultWriter.TaskID %q, want %q", w.TaskID(), id)
		}
		if _, err := w.Write([]byte("first")); err != nil {
			return err
		}
		if n == 5 || id == "fresh" && n == 0 {
			return errors.New("fail once")
		}
		_, err := w.Write([]byte("done at " + strconv.Itoa(n)))
		return err
	})
	_, err := q.Enqueue(e.ctx, "t", nil, &jobkey.EnqueueOpts{ID: "moved", MaxAttempts: 3,
		Meta: map[string]string{MetaRetried: "5", MetaQueue: "critical"}})
	require.NoError(t, err)
	_, err = q.Enqueue(e.ctx, "t", nil, &jobkey.EnqueueOpts{ID: "fresh", MaxAttempts: 4})
	require.NoError(t, err)
	jobs := work(t, e, q, h, "moved", "fresh")

	require.Equal(t, jobkey.StateSucceeded, jobs["moved"].State, jobs["moved"].LastError)
	require.Equal(t, []string{"5/7 critical", "6/7 critical"}, seen["moved"])
	require.Equal(t, "done at 6", string(jobs["moved"].Result))
	require.Equal(t, jobkey.StateSucceeded, jobs["fresh"].State, jobs["fresh"].LastError)
	require.Equal(t, []string{"0/3 jk", "1/3 jk"}, seen["fresh"])
	require.Equal(t, "done at 1", string(jobs["fresh"].Result))
}

// As in asynq, the ResultWriter refuses a write once the run's context has
// ended.
func TestHandlerResultWriterRefusesAfterTheRunEnds(t *testing.T) {
	t.Parallel()
	var werr error
	h := HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		<-ctx.Done()
		_, werr = task.ResultWriter().Write([]byte("late"))
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := h.Work(ctx, &jobkey.Job{ID: "x", Queue: "q", Type: "t", Attempt: 1, MaxAttempts: 1})
	require.NoError(t, err)
	require.Nil(t, res)
	require.ErrorIs(t, werr, context.Canceled)
}

// An unchanged asynq handler run by Work sees its context end at the
// Deadline given through the Client (ctx.Err() is DeadlineExceeded, as in
// asynq), and a nil it returns after that fails the attempt, as asynq's
// server fails it; a job whose Deadline passed before it was claimed is
// never handed to the handler, and fails, as asynq fails such a task.
func TestHandlerDeadline(t *testing.T) {
	e := newEnv(t)
	q := e.queue(t, "h", &jobkey.Config{Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	c := NewClient(nil, []Route{{Type: moveType, To: q}})
	for id, deadline := range map[string]time.Time{
		"ignores-ctx": time.Now().Add(300 * time.Millisecond),
		"past":        time.Now().Add(-time.Minute),
		"fast":        time.Now().Add(time.Hour),
	} {
		_, err := c.Enqueue(asynq.NewTask(moveType, []byte(id)), asynq.TaskID(id), asynq.Deadline(deadline), asynq.MaxRetry(0))
		require.NoError(t, err)
	}
	var mu sync.Mutex
	errs, causes := map[string]error{}, map[string]error{}
	h := HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id := string(task.Payload())
		if id == "ignores-ctx" {
			time.Sleep(600 * time.Millisecond)
		}
		mu.Lock()
		errs[id], causes[id] = ctx.Err(), context.Cause(ctx)
		mu.Unlock()
		return nil
	})
	loadInternals()
	jobs := work(t, e, q, h, "ignores-ctx", "past", "fast")

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, jobkey.StateFailed, jobs["ignores-ctx"].State)
	require.ErrorIs(t, errs["ignores-ctx"], context.DeadlineExceeded)
	require.ErrorIs(t, causes["ignores-ctx"], jobkey.ErrDeadline)
	require.Contains(t, jobs["ignores-ctx"].LastError, "deadline")
	require.Equal(t, jobkey.StateFailed, jobs["past"].State)
	require.NotContains(t, errs, "past", "never handed to the handler")
	require.Contains(t, jobs["past"].LastError, "not run")
	require.Equal(t, jobkey.StateSucceeded, jobs["fast"].State)
	require.NoError(t, errs["fast"])
}
