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
// timeout has passed fails the attempt with jobkey.ErrTimeout. The job's
// Deadline (from asynq.Deadline through Client, or carried by Migrate)
// ends the context likewise (context.Cause is jobkey.ErrDeadline), and a
// job claimed after it fails its attempt without running, as asynq fails a
// task whose deadline has passed before its handler starts.
//
// What asynq serves only from inside its own server is served here too,
// with asynq v0.26.0 (the version whose unexported layout this package
// checks; with another, these fall back as described below):
//
//   - task.ResultWriter() is a working *asynq.ResultWriter: Write keeps the
//     data, and the last data written (or passed to SetResult) becomes
//     Job.Result when the run succeeds. asynq writes a result at once, and
//     keeps it even if the run then fails; jobkey records a result only
//     with a success. After the run's context ends, Write fails, as in
//     asynq. TaskID() is the job's ID.
//   - asynq.GetTaskID (Job.ID), asynq.GetRetryCount (RetryCount),
//     asynq.GetMaxRetry (MaxRetry) and asynq.GetQueueName (QueueName)
//     report what asynq would: counts go on from the retries a task had
//     spent in asynq before a move (Meta[MetaRetried]), and the queue is
//     the asynq queue the task was enqueued to (Meta[MetaQueue]).
//
// Both need asynq internals that no exported API reaches: the Task's
// unexported ResultWriter field, and the context key and value type of
// asynq's internal/context package (built here by that package's own New,
// linked by name). With an asynq other than v0.26.0, or a replaced one,
// task.ResultWriter() is nil and the helpers return ok == false; use
// SetResult and JobFrom(ctx) with RetryCount, MaxRetry and QueueName then.
func Handler(h asynq.Handler) jobkey.Handler {
	return jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
		var res resultBox
		in := loadInternals()
		hctx := context.WithValue(ctx, jobCtxKey{}, j)
		hctx = context.WithValue(hctx, resultCtxKey{}, &res)
		if in.ok {
			hctx = in.withMetadata(hctx, j.ID, QueueName(j), MaxRetry(j), RetryCount(j))
		}
		err := h.ProcessTask(hctx, in.newTask(hctx, j, &res))
		switch {
		case err == nil && (errors.Is(context.Cause(ctx), jobkey.ErrTimeout) || errors.Is(context.Cause(ctx), jobkey.ErrDeadline)):
			// asynq's server fails the run at the timeout or deadline and
			// does not wait for the handler's nil.
			return nil, fmt.Errorf("asynqcompat: the handler returned after the job's timeout or deadline, which fails the run as in asynq: %w: %w", context.Cause(ctx), ctx.Err())
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

func (b *resultBox) set(data []byte) {
	b.mu.Lock()
	b.data = append([]byte(nil), data...)
	b.mu.Unlock()
}

var errUnexpectedWrite = errors.New("asynqcompat: the adapted task's ResultWriter was asked for a write other than a result")

func (b *resultBox) get() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.data
}

// JobFrom returns the jobkey job that a handler run by Handler or
// HandlerFunc is working on; RetryCount, MaxRetry and QueueName read
// asynq's counts and queue name from it. ok is false outside such a
// handler.
// The job is the worker's: read it, do not change it.
func JobFrom(ctx context.Context) (j *jobkey.Job, ok bool) {
	j, ok = ctx.Value(jobCtxKey{}).(*jobkey.Job)
	return j, ok && j != nil
}

// SetResult sets the result that a handler run by Handler or HandlerFunc
// returns to jobkey on success (Job.Result), as task.ResultWriter().Write
// does. A later
// call replaces an earlier one. It reports false, and keeps nothing,
// outside such a handler.
func SetResult(ctx context.Context, data []byte) bool {
	box, ok := ctx.Value(resultCtxKey{}).(*resultBox)
	if !ok || box == nil {
		return false
	}
	box.set(data)
	return true
}
