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
func (q *Queue) fenced(ctx context.Context, j *Job, predict []string, done func(j, cur *Job) bool,
	fn func(j, next *Job) *Job) (*Job, error) {
	out, errs, err := q.fencedMany(ctx, []*Job{j}, predict, done, fn)
	if err != nil {
		return nil, err
	}
	return out[0], errs[0]
}

// fencedMany is fenced for a batch, one compare-and-set per transaction
// group (per shard on a cluster). Each job is fenced on its own: a lost
// lease is reported in errs for that job and does not stop the others.
func (q *Queue) fencedMany(ctx context.Context, jobs []*Job, predict []string, done func(j, cur *Job) bool,
	fn func(j, next *Job) *Job) (out []*Job, errs []error, err error) {
	ids := make(map[string]bool, len(jobs))
	for _, j := range jobs {
		if err := q.checkJob(j); err != nil {
			return nil, nil, err
		}
		if ids[j.ID] {
			return nil, nil, fmt.Errorf("jobkey: job %q appears twice in one batch", j.ID)
		}
		ids[j.ID] = true
	}
	out, errs = make([]*Job, len(jobs)), make([]error, len(jobs))
	for _, group := range q.groups(jobs) {
		for start := 0; start < len(group); start += q.cfg.MaxBatch {
			if err := q.fencedTxn(ctx, jobs, group[start:min(len(group), start+q.cfg.MaxBatch)], predict, done, fn, out, errs); err != nil {
				return nil, nil, err
			}
		}
	}
	return out, errs, nil
}

func (q *Queue) fencedTxn(ctx context.Context, jobs []*Job, idx []int, predict []string, done func(j, cur *Job) bool,
	fn func(j, next *Job) *Job, out []*Job, errs []error) error {
	keys, shards, checks := q.txnKeys(jobs, idx, predict...)
	_, _, err := q.cas.run(ctx, &casTxn{keys: keys, checks: checks, decide: func(r *casRead) (*casPlan, error) {
		plan := &casPlan{}
		var ip indexPlan
		now := q.now()
		for k, i := range idx {
			j, cur := jobs[i], r.jobs[k]
			out[i], errs[i] = nil, nil
			switch {
			case r.errs[k] != nil:
				errs[i] = r.errs[k]
			case cur == nil:
				errs[i] = fmt.Errorf("%w: %q in queue %q", ErrNotFound, j.ID, q.name)
			case done != nil && done(j, cur):
				out[i] = cur
			case cur.State != StateActive || cur.Attempt != j.Attempt || cur.LeaseOwner != j.LeaseOwner:
				errs[i] = &LeaseLostError{ID: j.ID, Attempt: j.Attempt, Owner: j.LeaseOwner, Now: cur}
			default:
				next := fn(j, cloneJob(cur))
				next.UpdatedAt = now
				q.move(&ip, shards[k], j.ID, cur, next, "")
				plan.writes = append(plan.writes, q.write(keys[k], next))
				out[i] = next
			}
		}
		plan.steps, plan.checks = ip.steps(), ip.checks
		return plan, nil
	}})
	return err
}

// checkJob refuses a job copy that cannot be this queue's.
func (q *Queue) checkJob(j *Job) error {
	if j == nil {
		return errors.New("jobkey: nil job")
	}
	if j.Queue != "" && j.Queue != q.name {
		return fmt.Errorf("jobkey: job %q belongs to queue %q, not %q", j.ID, j.Queue, q.name)
	}
	return validID(j.ID)
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
	if err := q.checkJob(j); err != nil {
		return nil, err
	}
	if q.extends != nil {
		return q.extends.do(ctx, j)
	}
	return q.fenced(ctx, j, []string{idxLeased}, nil, q.extend)
}

func (q *Queue) extend(_, next *Job) *Job {
	next.LeaseUntil = q.now().Add(q.cfg.Lease)
	return next
}

func (q *Queue) flushExtends(ctx context.Context, batch []*call[*Job, *Job]) {
	flushFenced(ctx, q, batch, func(c *call[*Job, *Job]) *Job { return c.in }, []string{idxLeased}, nil,
		func(*call[*Job, *Job]) func(j, next *Job) *Job { return q.extend })
}

// completeIn is one Complete call waiting in its group.
type completeIn struct {
	job    *Job
	result []byte
}

func (q *Queue) flushCompletes(ctx context.Context, batch []*call[completeIn, *Job]) {
	flushFenced(ctx, q, batch, func(c *call[completeIn, *Job]) *Job { return c.in.job },
		[]string{idxLeased, idxSucceeded}, completed,
		func(c *call[completeIn, *Job]) func(j, next *Job) *Job { return succeed(c.in.result) })
}

func succeed(result []byte) func(_, next *Job) *Job {
	return func(_, next *Job) *Job {
		next.State = StateSucceeded
		next.Result = result
		return next
	}
}

// flushFenced runs a group-commit batch of one fenced transition as one
// fencedMany. A job that appears twice waits for a batch of its own, and a
// batch refused as a whole is retried call by call, so each caller gets its
// own outcome.
func flushFenced[T any](ctx context.Context, q *Queue, batch []*call[T, *Job], job func(*call[T, *Job]) *Job,
	predict []string, done func(j, cur *Job) bool, fn func(*call[T, *Job]) func(j, next *Job) *Job) {
	batch = live(batch)
	for len(batch) > 0 {
		var now, later []*call[T, *Job]
		seen := map[string]bool{}
		for _, c := range batch {
			if id := job(c).ID; seen[id] {
				later = append(later, c)
			} else {
				seen[id] = true
				now = append(now, c)
			}
		}
		jobs := make([]*Job, len(now))
		byJob := make(map[*Job]*call[T, *Job], len(now))
		for i, c := range now {
			jobs[i] = job(c)
			byJob[jobs[i]] = c
		}
		out, errs, err := q.fencedMany(ctx, jobs, predict, done, func(j, next *Job) *Job { return fn(byJob[j])(j, next) })
		switch {
		case err != nil && len(now) > 1 && refusedWhole(err):
			for _, c := range now {
				o, e, err := q.fencedMany(ctx, []*Job{job(c)}, predict, done, fn(c))
				if err != nil {
					c.err = err
				} else {
					c.out, c.err = o[0], e[0]
				}
			}
		case err != nil:
			for _, c := range now {
				c.err = err
			}
		default:
			for i, c := range now {
				c.out, c.err = out[i], errs[i]
			}
		}
		batch = later
	}
}

// Complete finishes a claimed job with a result. Its key then expires after
// Config.Retention. Calling it again after a reply was lost returns the
// completed job and writes nothing.
func (q *Queue) Complete(ctx context.Context, j *Job, result []byte) (*Job, error) {
	if err := q.checkJob(j); err != nil {
		return nil, err
	}
	if err := q.resultFits(j, result); err != nil {
		return nil, err
	}
	if q.completes != nil {
		return q.completes.do(ctx, completeIn{j, result})
	}
	return q.fenced(ctx, j, []string{idxLeased, idxSucceeded}, completed, succeed(result))
}

// completed recognises a job that j's own Complete already finished.
func completed(j, cur *Job) bool {
	return cur.State == StateSucceeded && cur.Attempt == j.Attempt && cur.LeaseOwner == j.LeaseOwner
}

// CompleteMany completes a batch of claimed jobs, two round trips per
// transaction of at most Config.MaxBatch jobs (per shard on a cluster).
// results[i] is jobs[i]'s result; results may be nil. Each job is fenced on
// its own: errs[i] is jobs[i]'s ErrLeaseLost (or ErrNotFound, ErrCorrupt),
// and the others complete regardless. err is set only when nothing could
// be decided (Redis unreachable, a conflict that did not clear, ...).
func (q *Queue) CompleteMany(ctx context.Context, jobs []*Job, results [][]byte) (done []*Job, errs []error, err error) {
	if results != nil && len(results) != len(jobs) {
		return nil, nil, fmt.Errorf("jobkey: CompleteMany with %d jobs and %d results", len(jobs), len(results))
	}
	pos := make(map[*Job]int, len(jobs))
	for i, j := range jobs {
		pos[j] = i
		if j != nil && results != nil {
			if err := q.resultFits(j, results[i]); err != nil {
				return nil, nil, err
			}
		}
	}
	return q.fencedMany(ctx, jobs, []string{idxLeased, idxSucceeded}, completed, func(j, next *Job) *Job {
		next.State = StateSucceeded
		if results != nil {
			next.Result = results[pos[j]]
		}
		return next
	})
}

// resultFits refuses a result that would push the value past the limit.
func (q *Queue) resultFits(j *Job, result []byte) error {
	probe := *j
	probe.Result, probe.State, probe.LeaseUntil = result, StateSucceeded, q.now()
	if n := encodedSize(&probe); n > q.cfg.MaxValueBytes {
		return fmt.Errorf("%w: job %q with its result would be %d bytes, limit %d", ErrTooLarge, j.ID, n, q.cfg.MaxValueBytes)
	}
	return nil
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
	return q.fenced(ctx, j, []string{idxLeased, idxReady, idxFailed}, nil, func(_, next *Job) *Job {
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
	return q.fenced(ctx, j, []string{idxLeased, idxReady}, nil, func(_, next *Job) *Job {
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
