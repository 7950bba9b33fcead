package asynqcompat

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
)

// Handler runs an asynq.Handler as a jobkey.Handler. For each job it builds
// an *asynq.Task with asynq.NewTask(job.Type, job.Payload), so Type and
// Payload read as they did in asynq (Headers is nil: jobkey jobs have no
// headers), and calls h.ProcessTask with the job's context, in which
// JobFrom finds the *jobkey.Job.
//
// The handler's error decides the job's outcome:
//
//   - nil: the job succeeds; its result is what the handler passed to
//     SetResult, else nil.
//   - an error wrapping asynq.SkipRetry: the job fails for good
//     (jobkey.ErrSkipRetry), as asynq archives it.
//   - an error wrapping asynq.RevokeTask: the job fails for good too. asynq
//     drops a revoked task without a trace; jobkey keeps it among the
//     failed jobs, with the error, until Config.Retention removes it.
//   - any other error: jobkey retries it with backoff while attempts
//     remain, as asynq retries while retries remain.
//
// A panic is turned into a failed attempt by jobkey's worker, as asynq's
// server does.
//
// The job's Timeout (from asynq.Timeout through Client, or carried by
// Migrate), else WorkOpts.Timeout, bounds the handler's context as asynq's
// Timeout does: once it passes, ctx.Err() is context.DeadlineExceeded
// (context.Cause is jobkey.ErrTimeout) and the attempt fails and is
// retried. asynq fails the attempt at the timeout whatever the handler
// returns later; so does Handler: a handler that returns nil after its
// timeout has passed fails the attempt with jobkey.ErrTimeout. asynq's
// Deadline has no jobkey equivalent (Client refuses it, Migrate skips the
// tasks that have one).
//
// What asynq serves only from inside its own server, and jobkey cannot:
//
//   - task.ResultWriter() is nil: asynq's ResultWriter has no exported
//     constructor. A handler that calls task.ResultWriter().Write panics,
//     and the attempt fails. Call SetResult(ctx, data) instead; the data
//     becomes jobkey's Job.Result.
//   - asynq.GetTaskID, asynq.GetRetryCount, asynq.GetMaxRetry and
//     asynq.GetQueueName return ok == false: they read a context key of
//     asynq's internal/context package, unexported, which no other package
//     can set. Use JobFrom(ctx) instead: Job.ID is the task ID (a task moved
//     by Migrate keeps its asynq ID), Job.Attempt-1 the retry count,
//     Job.MaxAttempts-1 the max retry, and Job.Queue the queue's name.
func Handler(h asynq.Handler) jobkey.Handler {
	return jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
		var res resultBox
		ctx = context.WithValue(ctx, jobCtxKey{}, j)
		ctx = context.WithValue(ctx, resultCtxKey{}, &res)
		task := asynq.NewTask(j.Type, j.Payload)
		err := h.ProcessTask(ctx, task)
		switch {
		case err == nil && errors.Is(context.Cause(ctx), jobkey.ErrTimeout):
			// asynq's server fails the run at the timeout and does not wait
			// for the handler's nil.
			return nil, fmt.Errorf("asynqcompat: the handler returned after the job's timeout, which fails the run as in asynq: %w", context.Cause(ctx))
		case err == nil:
			return res.get(), nil
		case errors.Is(err, asynq.SkipRetry), errors.Is(err, asynq.RevokeTask):
			if errors.Is(err, jobkey.ErrSkipRetry) {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %w", jobkey.ErrSkipRetry, err)
		default:
			return nil, err
		}
	})
}

// HandlerFunc runs an asynq handler function as a jobkey.Handler; see
// Handler.
func HandlerFunc(f func(context.Context, *asynq.Task) error) jobkey.Handler {
	return Handler(asynq.HandlerFunc(f))
}

type jobCtxKey struct{}

type resultCtxKey struct{}

// resultBox holds what a handler passed to SetResult; a handler may hand
// ctx to goroutines of its own, hence the lock.
type resultBox struct {
	mu   sync.Mutex
	data []byte
}

func (b *resultBox) get() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.data
}

// JobFrom returns the jobkey job that a handler run by Handler or
// HandlerFunc is working on: jobkey's answer to asynq.GetTaskID (Job.ID),
// asynq.GetRetryCount (Job.Attempt-1), asynq.GetMaxRetry (Job.MaxAttempts-1)
// and asynq.GetQueueName (Job.Queue). ok is false outside such a handler.
// The job is the worker's: read it, do not change it.
func JobFrom(ctx context.Context) (j *jobkey.Job, ok bool) {
	j, ok = ctx.Value(jobCtxKey{}).(*jobkey.Job)
	return j, ok && j != nil
}

// SetResult sets the result that a handler run by Handler or HandlerFunc
// returns to jobkey on success (Job.Result), in place of asynq's
// task.ResultWriter().Write, which cannot be served outside asynq. A later
// call replaces an earlier one. It reports false, and keeps nothing,
// outside such a handler.
func SetResult(ctx context.Context, data []byte) bool {
	box, ok := ctx.Value(resultCtxKey{}).(*resultBox)
	if !ok || box == nil {
		return false
	}
	box.mu.Lock()
	box.data = append([]byte(nil), data...)
	box.mu.Unlock()
	return true
}
