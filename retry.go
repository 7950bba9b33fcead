package jobkey

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// RetryPolicy decides what becomes of a job after a failed run, from the
// job and the handler's error: how long until it runs again, whether it
// fails for good, or whether the run is a snooze that gives its attempt
// back. j is a copy of the job as stored, with Attempt the attempt that
// failed and LastError the failure before this one; err is what the
// handler returned. It is called for every failed run, the last attempt's
// too (so that it can snooze it), inside the outcome's compare-and-set: it
// must be fast and must not block, and it may be called again for the same
// run if that compare-and-set is retried. A policy that panics is replaced
// for that run by Config.Backoff.
//
// Set one per Work (WorkOpts.RetryPolicy) or per type (WithRetryPolicy,
// which a Mux consults by Job.Type); without either, Config.Backoff
// decides. Errors made by Snooze, RetryAfter and SkipRetry decide for
// themselves, without the policy.
type RetryPolicy func(j *Job, err error) RetryDecision

// RetryDecision is a RetryPolicy's answer.
type RetryDecision struct {
	// Delay is how long until the job may run again, from the outcome's
	// write by Redis's clock; a negative one is 0, one past MaxRetryDelay
	// is MaxRetryDelay.
	Delay time.Duration
	// GiveUp fails the job for good now, attempts left or not.
	GiveUp bool
	// Snooze gives the attempt back, as Snooze does: the run counts in
	// Job.Snoozes, not against MaxAttempts, and is bounded by
	// Config.MaxSnoozes. It takes precedence over GiveUp.
	Snooze bool
}

// MaxRetryDelay bounds the delay of a retry, a snooze and ReleaseAfter.
const MaxRetryDelay = 365 * 24 * time.Hour

// Retrier is a Handler with a retry policy of its own, which Work asks
// before WorkOpts.RetryPolicy. NextRetry's ok is false when it has none
// for j (a Mux whose handler for j.Type has none, say).
type Retrier interface {
	NextRetry(j *Job, err error) (d RetryDecision, ok bool)
}

// WithRetryPolicy returns h with p as its retry policy: Work consults it
// for the jobs h runs, before WorkOpts.RetryPolicy. Registered in a Mux,
// it sets the policy of one type.
func WithRetryPolicy(h Handler, p RetryPolicy) Handler { return &retrying{h, p} }

type retrying struct {
	Handler
	p RetryPolicy
}

// NextRetry implements Retrier.
func (r *retrying) NextRetry(j *Job, err error) (RetryDecision, bool) {
	if r.p == nil {
		return nextRetryOf(r.Handler, j, err)
	}
	return r.p(j, err), true
}

// NextRetry implements Retrier: the decision of the handler registered for
// j.Type, when it has a retry policy.
func (m Mux) NextRetry(j *Job, err error) (RetryDecision, bool) {
	return nextRetryOf(m[j.Type], j, err)
}

func nextRetryOf(h Handler, j *Job, err error) (RetryDecision, bool) {
	if r, ok := h.(Retrier); ok {
		return r.NextRetry(j, err)
	}
	return RetryDecision{}, false
}

// SnoozeError is the error Snooze returns: the run asks to run again after
// Delay without spending its attempt.
type SnoozeError struct {
	Delay time.Duration
}

func (e *SnoozeError) Error() string { return fmt.Sprintf("jobkey: snoozed for %v", e.Delay) }

// Snooze returns an error that a handler returns to run its job again
// after d without spending the attempt (a dependency that said "not now",
// a 429's Retry-After): the job is pending again, due d from the outcome's
// write by Redis's clock, with Attempt given back and Snoozes counted. It
// is not a failure: LastError is kept, and Queue.Metrics counts the run as
// Snoozed. A job that has snoozed Config.MaxSnoozes times fails for good
// on its next snooze, with ErrSnoozeLimit. d is clamped to
// 0..MaxRetryDelay. Queue.Fail given such an error snoozes likewise.
func Snooze(d time.Duration) error { return &SnoozeError{Delay: d} }

// RetryAfterError is the error RetryAfter returns: the run failed, and
// asks to run again no sooner than Delay.
type RetryAfterError struct {
	Delay time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("jobkey: retry after %v", e.Delay)
	}
	return fmt.Sprintf("%v (retry after %v)", e.Err, e.Delay)
}

// Unwrap returns Err.
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter returns an error that fails the attempt, as err does, and
// sets the retry's delay to d in place of the retry policy's: the attempt
// is spent, and with none left the job fails for good as usual. d is
// clamped to 0..MaxRetryDelay.
func RetryAfter(d time.Duration, err error) error { return &RetryAfterError{Delay: d, Err: err} }

// ErrSnoozeLimit is the cause of a job failed for good because it snoozed
// more than Config.MaxSnoozes times; LastError starts with its text.
var ErrSnoozeLimit = errors.New("jobkey: snoozed too often")

// clampDelay keeps d within 0..MaxRetryDelay.
func clampDelay(d time.Duration) time.Duration { return min(max(d, 0), MaxRetryDelay) }

// failure is what a failed run's outcome write decides from its cause.
type failure struct {
	msg    string      // LastError, cut to MaxErrorLen
	cause  error       // what the handler returned
	policy RetryPolicy // nil: Config.Backoff
}

func newFailure(cause error, policy RetryPolicy) failure {
	msg := "failed"
	if cause != nil {
		msg = cause.Error()
	}
	return failure{msg: truncate(msg, MaxErrorLen), cause: cause, policy: policy}
}

// decide returns the decision for next, the job as stored with the failed
// attempt: an error's own, else the policy's, else Config.Backoff's.
func (f failure) decide(cfg *Config, next *Job) (d RetryDecision) {
	var sn *SnoozeError
	var ra *RetryAfterError
	switch {
	case errors.As(f.cause, &sn):
		return RetryDecision{Delay: sn.Delay, Snooze: true}
	case errors.Is(f.cause, ErrSkipRetry):
		return RetryDecision{GiveUp: true}
	case errors.As(f.cause, &ra):
		return RetryDecision{Delay: ra.Delay}
	case f.policy == nil:
		return RetryDecision{Delay: cfg.Backoff(next.Attempt)}
	}
	defer func() {
		if recover() != nil {
			d = RetryDecision{Delay: cfg.Backoff(next.Attempt)}
		}
	}()
	// The policy gets its own copy: what it changes never reaches the write.
	c := cloneJob(next)
	c.Meta, c.History = cloneMeta(next.Meta), slices.Clone(next.History)
	c.Payload, c.Result, c.Progress = slices.Clone(next.Payload), slices.Clone(next.Result), slices.Clone(next.Progress)
	return f.policy(c, f.cause)
}

// transition is the failed run's outcome: snoozed, retried later, or
// failed for good, decided in the outcome's own compare-and-set.
func (f failure) transition(cfg *Config) transition {
	return func(j, next *Job, now time.Time) *Job {
		cur := cloneJob(next) // the run as it stood
		next.Progress = j.Progress
		d := f.decide(cfg, next)
		next.LeaseUntil = now // the run is over; so is its lease
		if d.Snooze {
			if next.Snoozes < cfg.MaxSnoozes {
				next.State = StatePending
				next.Snoozes++
				next.Attempt = max(0, next.Attempt-1)
				next.RunAt = now.Add(clampDelay(d.Delay))
				recordRun(next, cur, now, OutcomeSnoozed, f.msg)
				return next
			}
			next.LastError = truncate(fmt.Sprintf("%v: %d snoozes, limit %d; the last: %s", ErrSnoozeLimit, next.Snoozes, cfg.MaxSnoozes, f.msg), MaxErrorLen)
			next.State = StateFailed
			recordRun(next, cur, now, OutcomeFailed, next.LastError)
			return next
		}
		next.LastError = f.msg
		recordRun(next, cur, now, OutcomeFailed, f.msg)
		if d.GiveUp || next.Attempt >= next.MaxAttempts {
			next.State = StateFailed
			return next
		}
		next.State = StatePending
		next.RunAt = now.Add(clampDelay(d.Delay))
		return next
	}
}

// done recognises a stored job in which this failure of j's run already
// landed (a retry after a lost reply): no longer active, still under j's
// token, and either its History's last record is this run's, ended by
// this error (cut to fit: a prefix of it), or its LastError is (perhaps
// cut to fit MaxValueBytes), or, for a snooze, it holds one more snooze
// than j had, or failed for good on the snooze limit.
func (f failure) done(j, cur *Job) bool {
	if cur.LeaseToken != j.LeaseToken || cur.State != StatePending && cur.State != StateFailed {
		return false
	}
	if n := len(cur.History); n > 0 {
		r := cur.History[n-1]
		if r.Attempt == j.Attempt && r.Started.Equal(j.StartedAt) && r.Worker == j.LeaseOwner &&
			(r.Outcome == OutcomeFailed || r.Outcome == OutcomeSnoozed) && r.Error != "" && strings.HasPrefix(f.msg, r.Error) {
			return true
		}
	}
	var sn *SnoozeError
	if errors.As(f.cause, &sn) {
		if cur.State == StatePending && cur.Snoozes > j.Snoozes ||
			cur.State == StateFailed && strings.HasPrefix(cur.LastError, ErrSnoozeLimit.Error()) {
			return true
		}
	}
	return cur.LastError != "" && strings.HasPrefix(f.msg, cur.LastError)
}
