package jobkey

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// run is one claimed job in a Work runner, from the claim until its outcome
// is recorded. Work's renewer (renew.go) renews the lease the whole time,
// not only while the handler runs: a lease that ran out while a slow outcome write waited
// would let another worker run the job again.
//
// Self-fencing: fencing stops a stale worker's writes, not its handler. So
// the run keeps the deadline of its last confirmed lease on this host's
// monotonic clock, measured from the moment it asked for the lease (the
// lease in Redis began later, so it ends later), less WorkOpts.LeaseMargin.
// When that passes without a renewal (Redis unreachable or too slow), the
// handler's context is canceled with ErrLeaseExpired, before any other
// worker can claim the job.
type run struct {
	w      *worker
	job    *Job // the claimed copy: its token fences every write
	ctx    context.Context
	cancel context.CancelCauseFunc
	values runValues // ctx's parent: Work's runs, and the run under runKey
	// watching is the stuck watch of the handler call under way, when its
	// context is ctx itself: end tells it (stuck.go).
	watching atomic.Pointer[stuckWatch]

	mu       sync.Mutex
	deadline time.Time // last confirmed lease end, less the margin: the renewer fences the run then
	// progress is what the handler reported last (SetProgress), when
	// progressSet: every renewal and the outcome write it (current).
	progress    []byte
	progressSet bool
	expired     chan struct{}
	once        sync.Once // closes expired

	hints   atomic.Int64 // cancel hints not yet confirmed; a check runs while > 0
	writing atomic.Bool  // an outcome write is in flight
	// abandoned is set when shutdown gives up on the run's stuck handler:
	// its lease is no longer renewed (worker.giveUp).
	abandoned atomic.Bool
	// own is the job as the handler's own CompleteTx completed it: the
	// run's outcome, recorded with no write of Work's (ownCompletion).
	own atomic.Pointer[Job]
	// unknown is the error of a try of the outcome's write that was sent
	// and not answered (ErrOutcomeUnknown): it may have landed. Set by the
	// runner's goroutine only.
	unknown error

	// Under the renewer's mu: the run's place in its heap (-1 when out),
	// the time it is keyed by, when the next renewal is due, whether one
	// is in flight, and whether the run has stopped.
	idx      int
	at       time.Time
	renewAt  time.Time
	renewing bool
	stopped  bool
	renewals sync.WaitGroup // renewals in flight
}

// runValues is context.WithValue(runs, runKey{}, r), held in the run
// itself rather than allocated beside it. Done and Err are the embedded
// context's, so the run's context still joins Work's cancellation as a
// child of its cancelCtx, with no goroutine.
type runValues struct {
	context.Context
	r *run
}

// Value returns the run under runKey, else the embedded context's value.
func (v *runValues) Value(key any) any {
	if key == (runKey{}) {
		return v.r
	}
	return v.Context.Value(key)
}

// start registers a run of j, claimed by a request sent at asked, and
// starts keeping its lease.
func (w *worker) start(j *Job, asked time.Time) *run {
	r := &run{w: w, job: j, expired: make(chan struct{}), idx: -1}
	r.values = runValues{Context: w.runs, r: r}
	r.ctx, r.cancel = context.WithCancelCause(&r.values)
	r.deadline = asked.Add(leaseLeft(j) - w.o.LeaseMargin)
	w.mu.Lock()
	w.running[r] = struct{}{}
	w.mu.Unlock()
	w.runsChanged()
	w.renewer.add(r)
	return r
}

// stop ends the run: its lease is no longer renewed nor fenced, no
// renewal of it is in flight, and the run is forgotten.
func (w *worker) stop(r *run) {
	w.renewer.remove(r)
	r.cancel(nil)
	w.mu.Lock()
	delete(w.running, r)
	w.mu.Unlock()
	w.runsChanged()
}

// leaseLeft is how long the lease of j lasts from the moment it was
// written: both times come from Redis's clock in the same transaction.
func leaseLeft(j *Job) time.Duration { return j.LeaseUntil.Sub(j.UpdatedAt) }

// end cancels the run's context with cause, and tells the stuck watch of
// its handler call, if one watches that context.
func (r *run) end(cause error) {
	r.cancel(cause)
	if s := r.watching.Load(); s != nil {
		s.ended(context.Cause(r.ctx))
	}
}

// expire is the self-fence: the lease may be running out unseen.
func (r *run) expire() {
	r.end(ErrLeaseExpired)
	r.once.Do(func() { close(r.expired) })
}

// confirm moves the deadline after a renewal asked for at asked; the
// renewer then fences the run at the new one.
func (r *run) confirm(asked time.Time, j *Job) {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.expired:
		return // too late: the handler was already stopped
	default:
	}
	if d := asked.Add(leaseLeft(j) - r.w.o.LeaseMargin); d.After(r.deadline) {
		r.deadline = d
	}
}

// fenceAt is the deadline.
func (r *run) fenceAt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.deadline
}

// nextRenewal is when to renew next: every Lease/3, and sooner when the
// deadline is nearer than that (a claim that took long left less lease).
func (r *run) nextRenewal() time.Duration {
	return max(time.Millisecond, min(r.w.q.cfg.Lease/3, r.left()/2))
}

// left is how long until the deadline.
func (r *run) left() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return time.Until(r.deadline)
}

// record writes the run's outcome with write, retrying with backoff while
// the renewer renews the lease, until it lands, is refused for good (lease
// lost, job gone, bad input), or the lease deadline passes. It returns the
// last error when the write did not land.
func (w *worker) record(r *run, write func(context.Context, *Job) (*Job, error)) error {
	delay := 10 * time.Millisecond
	for {
		late := r.left() <= 0 // the run's deadline passed before this try began
		ctx, cancel := context.WithTimeout(w.writes, max(r.left(), time.Millisecond))
		r.writing.Store(true)
		stored, err := write(ctx, r.current())
		r.writing.Store(false)
		cancel()
		if err == nil {
			w.recorded(r.job, stored, nil)
			return nil
		}
		r.sent(err)
		if ll := (*LeaseLostError)(nil); errors.As(err, &ll) && ownCompletion(r.job, ll.Now) {
			// The handler completed its own job (CompleteTx) and then
			// returned an error, or was stopped: the completion stands.
			w.o.Logger.Warn("jobkey: the handler completed its job itself; its completion stands", "queue", w.q.name, "job", r.job.ID)
			w.recorded(r.job, ll.Now, nil)
			return nil
		}
		if final(err) || r.left() <= 0 {
			err = r.notSent(err, late)
			w.recorded(r.job, r.job, err)
			return err
		}
		w.o.Logger.Warn("jobkey: recording job outcome failed; retrying", "queue", w.q.name, "job", r.job.ID, "err", err)
		t := time.NewTimer(min(delay, max(r.left(), 0)))
		select {
		case <-t.C:
		case <-r.expired:
		}
		t.Stop()
		delay = min(2*delay, w.q.cfg.Lease/10)
	}
}

// sent notes err, a try of the run's outcome write, when it was sent
// and not answered: that try may land yet.
func (r *run) sent(err error) {
	if errors.Is(err, ErrOutcomeUnknown) {
		r.unknown = err
	}
}

// notSent names the error of the run's last try of its outcome's write
// when its deadline stopped that try before it was sent: a context error
// that is not ErrOutcomeUnknown (a try in flight when its deadline ended
// says so). That try never reached Redis. When an earlier try was sent and
// not answered, it may have landed: the outcome is unknown
// (ErrOutcomeUnknown). Else, when the try began after the run's deadline
// (its lease end less the margin) had passed, as a stuck handler's late
// write does, the run no longer held the job when it wrote, and nothing
// was written (ErrLeaseLost). Either way the error still matches the
// context's. A try that began within the deadline keeps its error: the
// lease may still hold in Redis for the margin.
func (r *run) notSent(err error, late bool) error {
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrLeaseLost) {
		return err
	}
	switch {
	case r.unknown != nil:
		return fmt.Errorf("%w: job %q: the run's lease ran out, by this process's clock, before its last try could be sent, "+
			"and an earlier one that was sent may have landed (%v): %w", ErrOutcomeUnknown, r.job.ID, r.unknown, err)
	case late:
		return fmt.Errorf("%w: job %q: the run's lease had run out, by this process's clock, before its write was tried; nothing was written: %w",
			ErrLeaseLost, r.job.ID, err)
	}
	return err
}

// final reports a write error that trying again cannot fix.
func final(err error) bool {
	var rerr redis.Error
	return errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalid) ||
		errors.Is(err, ErrCorrupt) || errors.Is(err, ErrUnsupportedFormat) || errors.Is(err, ErrWrongType) ||
		errors.Is(err, ErrTooLarge) || errors.Is(err, ErrStep) || errors.Is(err, ErrEvictionPolicy) ||
		errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "NOPERM") // an ACL that lacks a grant
}

// confirmCancel checks a cancel hint against the stored job, and stops the
// handler only when the job is no longer active under this run's lease.
//
// One check runs at a time per run, so a flood of hints costs one read at a
// time; a hint that arrives during a check makes it read again after, since
// the read in flight may have been answered before the cancel landed.
func (r *run) confirmCancel(w *worker) {
	if r.hints.Add(1) != 1 {
		return // the check running now will read again
	}
	for {
		seen := r.hints.Load()
		if r.checkCancel(w) || r.hints.CompareAndSwap(seen, 0) {
			return
		}
	}
}

// checkCancel reads the stored job once and stops the handler when the job
// is no longer active under this run's lease; it reports whether it did.
func (r *run) checkCancel(w *worker) bool {
	ctx, cancel := context.WithTimeout(w.writes, w.q.cfg.Lease/3)
	defer cancel()
	cur, err := w.q.Get(ctx, r.job.ID)
	switch {
	case errors.Is(err, ErrNotFound):
		r.end(errors.Join(ErrLeaseLost, err))
	case err != nil:
		return false // unreadable now: the next renewal will tell
	case cur.State == StateActive && cur.LeaseToken == r.job.LeaseToken:
		return false // still ours: the hint was stale or forged
	case ownCompletion(r.job, cur):
		r.own.CompareAndSwap(nil, cur)
		return false // the handler completed it (CompleteTx): recorded once it returns
	case cur.State == StateCanceled && cur.LeaseToken == r.job.LeaseToken:
		r.end(ErrJobCanceled)
	default:
		r.end(&LeaseLostError{ID: r.job.ID, Attempt: r.job.Attempt, Owner: r.job.LeaseOwner, Token: r.job.LeaseToken, Now: cur})
	}
	return true
}

// ownRun returns the Work run of ctx when it holds j in q: a handler's
// own job, by its ID and lease token; else nil.
func ownRun(ctx context.Context, q *Queue, j *Job) *run {
	r, ok := ctx.Value(runKey{}).(*run)
	if !ok || r.w.q.name != q.name || r.w.q.ks.prefix != q.ks.prefix || r.job.ID != j.ID || r.job.LeaseToken != j.LeaseToken {
		return nil
	}
	return r
}

// withProgress is j with the progress its handler reported last
// (SetProgress), when it reported any: a handler's own CompleteTx writes
// it, as Work's outcome would (current).
func (r *run) withProgress(j *Job) *Job {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.progressSet {
		return j
	}
	c := cloneJob(j)
	c.Progress = r.progress
	return c
}

// completedOwn tells the run of ctx, if any, that its handler completed
// its job as out (CompleteTx of the job the run holds, by its token).
func completedOwn(ctx context.Context, q *Queue, j, out *Job) {
	if r := ownRun(ctx, q, j); r != nil {
		r.own.CompareAndSwap(nil, out)
	}
}

// ownCompletion reports a stored job cur that the run of claimed completed
// itself: a handler's CompleteTx of its own job. It is the run's success,
// not a lost lease; Work's completion then finds it (completed) and
// writes nothing more.
func ownCompletion(claimed, cur *Job) bool {
	return cur != nil && completed(claimed, cur)
}
