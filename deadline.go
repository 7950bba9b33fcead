package jobkey

import (
	"context"
	"fmt"
	"time"
)

// A job's Deadline bounds every run of it, as asynq's Deadline does: the
// handler's context ends at the Deadline or at the run's Timeout,
// whichever comes first, and a run that ends so fails its attempt, which is
// retried under the retry policy. asynq does not call the handler of a task
// whose deadline has passed when it is dequeued: it fails the attempt with
// the context's error at once (processor.exec). Work does the same.

// pastDeadline says whether j, as claimed, was due to stop before it could
// start: its Deadline is not after the claim's time (UpdatedAt, by Redis's
// clock).
func pastDeadline(j *Job) bool { return !j.Deadline.IsZero() && !j.Deadline.After(j.UpdatedAt) }

// withDeadline returns ctx, ended at j's Deadline with cause ErrDeadline.
// The Deadline is on Redis's clock; the handler's context needs this
// host's: the time left at the claim (Deadline less the claim's time) is
// counted from asked, when the claim was asked for, which came before the
// claim, so the run never outlasts the Deadline by Redis's clock (as a
// lease's end is kept: run.go).
func withDeadline(ctx context.Context, j *Job, asked time.Time) (context.Context, context.CancelFunc) {
	if j.Deadline.IsZero() {
		return ctx, func() {}
	}
	return context.WithDeadlineCause(ctx, asked.Add(j.Deadline.Sub(j.UpdatedAt)), ErrDeadline)
}

// deadlineError is the error a run's attempt fails with once the job's
// Deadline has passed: err is the handler's, or nil when the handler was
// not run. It matches ErrDeadline and context.DeadlineExceeded, as asynq's
// failure matches context.DeadlineExceeded.
func deadlineError(j *Job, err error) error {
	at := j.Deadline.UTC().Format(time.RFC3339Nano)
	if err == nil {
		return fmt.Errorf("%w (%s) before the job was claimed; not run: %w", ErrDeadline, at, context.DeadlineExceeded)
	}
	return fmt.Errorf("%w (%s) while the handler ran: %w: %w", ErrDeadline, at, context.DeadlineExceeded, err)
}
