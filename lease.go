package jobkey

import (
	"context"
	"errors"
	"fmt"
	"unicode/utf8"
)

// MaxErrorLen bounds the LastError stored in a job, so failures cannot grow
// the value without limit.
const MaxErrorLen = 4 << 10

// fenced runs a transition that only the lease holder may make. It writes
// only while the stored job is active with the same Attempt and LeaseOwner
// as the caller's copy j (fencing): a worker whose lease expired and whose
// job was claimed again, canceled or finished gets ErrLeaseLost and writes
// nothing. done, when not nil, recognises a stored job in which this very
// transition already landed (a retry after a lost reply) and returns it
// without writing.
func (q *Queue) fenced(ctx context.Context, j *Job, predict []string, done func(cur *Job) bool,
	fn func(cur *Job) *Job) (*Job, error) {
	if j == nil {
		return nil, errors.New("jobkey: nil job")
	}
	if j.Queue != "" && j.Queue != q.name {
		return nil, fmt.Errorf("jobkey: job %q belongs to queue %q, not %q", j.ID, j.Queue, q.name)
	}
	return q.update(ctx, j.ID, predict, func(cur *Job) (*Job, error) {
		if done != nil && done(cur) {
			return nil, nil
		}
		if cur.State != StateActive || cur.Attempt != j.Attempt || cur.LeaseOwner != j.LeaseOwner {
			return nil, &LeaseLostError{ID: j.ID, Attempt: j.Attempt, Owner: j.LeaseOwner, Now: cur}
		}
		return fn(cloneJob(cur)), nil
	}, "")
}

// LeaseLostError explains ErrLeaseLost: the job as it is now stored.
type LeaseLostError struct {
	ID      string
	Attempt int    // the caller's attempt
	Owner   string // the caller's lease owner
	Now     *Job   // the stored job
}

func (e *LeaseLostError) Error() string {
	return fmt.Sprintf("jobkey: lease lost on job %q: attempt %d of %q, but the job is now %s at attempt %d of %q",
		e.ID, e.Attempt, e.Owner, e.Now.State, e.Now.Attempt, e.Now.LeaseOwner)
}

// Is makes errors.Is(err, ErrLeaseLost) hold.
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

// Extend renews the lease of a claimed job to Config.Lease from now.
func (q *Queue) Extend(ctx context.Context, j *Job) (*Job, error) {
	return q.fenced(ctx, j, []string{idxLeased}, nil, func(next *Job) *Job {
		next.LeaseUntil = q.now().Add(q.cfg.Lease)
		return next
	})
}

// Complete finishes a claimed job with a result. Its key then expires after
// Config.Retention. Calling it again after a reply was lost returns the
// completed job and writes nothing.
func (q *Queue) Complete(ctx context.Context, j *Job, result []byte) (*Job, error) {
	if j != nil {
		probe := *j
		probe.Result, probe.State, probe.LeaseUntil = result, StateSucceeded, q.now()
		if n := encodedSize(&probe); n > q.cfg.MaxValueBytes {
			return nil, fmt.Errorf("%w: job %q with its result would be %d bytes, limit %d", ErrTooLarge, j.ID, n, q.cfg.MaxValueBytes)
		}
	}
	already := func(cur *Job) bool {
		return cur.State == StateSucceeded && cur.Attempt == j.Attempt && cur.LeaseOwner == j.LeaseOwner
	}
	return q.fenced(ctx, j, []string{idxLeased, idxSucceeded}, already, func(next *Job) *Job {
		next.State = StateSucceeded
		next.Result = result
		return next
	})
}

// Fail records a failed attempt of a claimed job. With attempts left the
// job goes back to pending, to run again after Config.Backoff; with none
// left, or when cause wraps ErrSkipRetry, it fails for good. cause becomes
// LastError (cut to MaxErrorLen).
func (q *Queue) Fail(ctx context.Context, j *Job, cause error) (*Job, error) {
	msg := "failed"
	if cause != nil {
		msg = cause.Error()
	}
	msg = truncate(msg, MaxErrorLen)
	final := errors.Is(cause, ErrSkipRetry)
	return q.fenced(ctx, j, []string{idxLeased, idxReady, idxFailed}, nil, func(next *Job) *Job {
		next.LastError = msg
		if final || next.Attempt >= next.MaxAttempts {
			next.State = StateFailed
			return next
		}
		next.State = StatePending
		next.RunAt = q.now().Add(max(0, q.cfg.Backoff(next.Attempt)))
		return next
	})
}

// Release gives a claimed job back without spending its attempt: it is
// pending again and due at once. Work uses it on shutdown.
func (q *Queue) Release(ctx context.Context, j *Job) (*Job, error) {
	return q.fenced(ctx, j, []string{idxLeased, idxReady}, nil, func(next *Job) *Job {
		next.State = StatePending
		next.Attempt--
		next.RunAt = q.now()
		return next
	})
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
