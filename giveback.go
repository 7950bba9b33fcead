package jobkey

import (
	"context"
	"errors"
	"time"

	"github.com/jobkey/jobkey/internal/cas"
)

// giveBack releases j, claimed for a caller that left before the claim's
// answer reached it, so that it is not leased to nobody until its lease
// ends, spending an attempt it never ran. It runs on its own goroutine,
// bounded by the lease: the flush that claimed it goes on meanwhile. t,
// the caller's trail, counts it until it is over (Work waits for its
// own). The release is fenced on j's lease token, so it writes nothing if
// the claim did not land, or if the lease has already passed to someone
// else; if it cannot land at all, the job is claimed again once its lease
// runs out.
func (q *Queue) giveBack(t *cas.Trail, j *Job) {
	if j == nil {
		return
	}
	t.Add()
	go func() {
		defer t.Done()
		if err := q.releaseUnrun(context.Background(), j, time.Now().Add(q.cfg.Lease)); err != nil && !claimGone(err) {
			q.cfg.Logger.Warn("jobkey: could not give back a job claimed for a caller that left; it is claimed again when its lease ends",
				"queue", q.name, "job", j.ID, "err", err)
		}
	}()
}

// releaseUnrun gives back j, claimed for a run that never started, by a
// fenced Release retried with backoff until it lands, is refused, or until
// passes; one attempt is made however late it is asked, bounded by a tenth
// of the lease. A claim that did not land, or whose lease passed to
// another claim, is refused (claimGone): nothing is written then. A
// release the replicas did not confirm stands on the master: if a failover
// loses it, the job is claimed again once its lease runs out. ctx gives
// its values, not its end: the release is what an ended caller leaves.
func (q *Queue) releaseUnrun(ctx context.Context, j *Job, until time.Time) error {
	ctx = context.WithoutCancel(ctx)
	delay := 10 * time.Millisecond
	for {
		rctx, cancel := context.WithTimeout(ctx, max(time.Until(until), q.cfg.Lease/10))
		_, err := q.Release(rctx, j)
		cancel()
		switch {
		case err == nil, errors.Is(err, ErrNotReplicated):
			return nil
		case final(err), time.Until(until) <= 0:
			return err
		}
		time.Sleep(min(delay, max(time.Until(until), 0)))
		delay = min(2*delay, q.cfg.Lease/10)
	}
}

// claimGone reports a give-back refused because there was nothing to give
// back: the claim did not land, or its job moved on.
func claimGone(err error) bool { return errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrNotFound) }
