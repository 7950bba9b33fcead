package asynqcompat

import (
	"errors"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
)

// DefaultMaxRetry is asynq's retry count for a task enqueued without
// asynq.MaxRetry. Client gives a routed task without MaxRetry
// MaxAttempts DefaultMaxRetry+1, whatever the jobkey queue's
// Config.MaxAttempts, so that it runs as often as asynq would run it.
const DefaultMaxRetry = 25

// ErrRunErrorUnknown is the error a RetryDelay passes to an asynq
// RetryDelayFunc in place of the failed run's: jobkey's Config.Backoff is
// given the attempt number only.
var ErrRunErrorUnknown = errors.New("asynqcompat: the failed run's error is not known to a jobkey Backoff")

// RetryDelay turns an asynq RetryDelayFunc into a jobkey Config.Backoff,
// for a queue whose every Work should retry so. RetryPolicy, for
// WorkOpts.RetryPolicy, gives the func the run's error and task as well.
// jobkey calls Backoff with the attempt that failed, counted from 1; asynq
// calls its func with the retries done so far, counted from 0, so f gets
// attempt-1, as asynq would give it. Backoff knows only the attempt: f gets
// ErrRunErrorUnknown for the error and a Task with an empty type and no
// payload, so a func that chooses its delay by the error or the task
// cannot work unchanged. A func that panics, or returns a negative delay,
// gets asynq's default delay instead.
func RetryDelay(f asynq.RetryDelayFunc) func(attempt int) time.Duration {
	return func(attempt int) (d time.Duration) {
		n := max(attempt-1, 0)
		defer func() {
			if recover() != nil || d < 0 {
				d = asynq.DefaultRetryDelayFunc(n, ErrRunErrorUnknown, asynq.NewTask("", nil))
			}
		}()
		return f(n, ErrRunErrorUnknown, asynq.NewTask("", nil))
	}
}

// DefaultBackoff is asynq's default retry delay as a jobkey Config.Backoff:
// asynq.DefaultRetryDelayFunc with the retry count asynq would pass, so
// the first retry waits 15 to 44 seconds, as in asynq (jobkey's own
// DefaultBackoff waits 0.5 to 1 second).
func DefaultBackoff(attempt int) time.Duration {
	return RetryDelay(asynq.DefaultRetryDelayFunc)(attempt)
}

// RetryPolicy turns asynq's server options RetryDelayFunc and IsFailure
// into a jobkey.RetryPolicy, for WorkOpts.RetryPolicy (or, for one type,
// jobkey.WithRetryPolicy). delay gets what asynq gives it: the retries so
// far (RetryCount), the run's error, and a Task of the job's type and
// payload; nil is asynq.DefaultRetryDelayFunc. An error for which
// isFailure returns false is retried after that delay without spending
// the attempt, as asynq retries it without counting a retry: a
// jobkey.Snooze, counted in Job.Snoozes. Unlike asynq, that is bounded:
// past jobkey.Config.MaxSnoozes such retries the job fails for good with
// jobkey.ErrSnoozeLimit. nil isFailure counts every error, as asynq's
// default does. An error wrapping asynq.SkipRetry fails the job for good
// before either is asked (Handler maps it to jobkey.ErrSkipRetry; asynq
// asks IsFailure first). A func that panics counts the error as a failure,
// or gets asynq's default delay.
func RetryPolicy(delay asynq.RetryDelayFunc, isFailure func(error) bool) jobkey.RetryPolicy {
	if delay == nil {
		delay = asynq.DefaultRetryDelayFunc
	}
	return func(j *jobkey.Job, err error) jobkey.RetryDecision {
		n := RetryCount(j)
		task := asynq.NewTask(j.Type, j.Payload)
		d := func() (d time.Duration) {
			defer func() {
				if recover() != nil || d < 0 {
					d = asynq.DefaultRetryDelayFunc(n, err, task)
				}
			}()
			return delay(n, err, task)
		}()
		failure := func() (ok bool) {
			defer func() {
				if recover() != nil {
					ok = true
				}
			}()
			return isFailure == nil || isFailure(err)
		}()
		return jobkey.RetryDecision{Delay: d, Snooze: !failure}
	}
}
