package jobkey

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jobkey/jobkey/internal/cas"
)

// With Config.MinReplicas, every write waits for the replicas in its own
// round trip (internal/cas/wait.go). A claim the replicas did not confirm
// could be lost by a failover and its job run again beside this run: it is
// handed to no handler until a renewal of its lease is confirmed, and
// given back unrun if none is before its lease could end.

// confirmClaims deals with claims that committed on the master and that
// fewer than Config.MinReplicas replicas confirmed (unconfirmed): a
// failover could lose them and make their jobs pending again, for another
// worker to run beside the caller. So no such claim is handed over: each
// is renewed (Extend, fenced on its token) until a renewal is confirmed,
// which proves the replicas hold the job leased to this claim, and then
// replaces it in jobs. One that cannot be confirmed while its lease,
// measured from asked less a fifth of it, still holds is given back
// unrun, and its place in jobs set to nil.
func (q *Queue) confirmClaims(ctx context.Context, jobs []*Job, asked time.Time, unconfirmed error) {
	var all sync.WaitGroup
	// Each on its own connection: the caller's cache (a flush's) serves one
	// goroutine at a time.
	ctx = cas.WithoutConnCache(ctx)
	for i, j := range jobs {
		if j != nil {
			all.Go(func() { jobs[i] = q.confirmClaim(ctx, j, asked, unconfirmed) })
		}
	}
	all.Wait()
}

// confirmClaim renews j until a renewal is confirmed, and returns it; or
// nil once j's lease may be ending, its claim lost, or ctx done. A claim
// it does not return is given back before it returns.
func (q *Queue) confirmClaim(ctx context.Context, j *Job, asked time.Time, err error) *Job {
	deadline := asked.Add(leaseLeft(j) - q.cfg.Lease/5)
	delay := 10 * time.Millisecond
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			// Given back before returning, not on a goroutine of its own: the
			// caller (a Work runner, a flush Work waits for) may be shutting
			// down, and nothing it started may outlive it.
			q.cfg.Logger.Warn("jobkey: claim not confirmed by replicas before its lease could end; given back unrun",
				"queue", q.name, "job", j.ID, "err", err)
			if rerr := q.releaseUnrun(ctx, j, asked.Add(leaseLeft(j))); rerr != nil && !claimGone(rerr) {
				q.cfg.Logger.Warn("jobkey: could not give back an unconfirmed claim; it is claimed again when its lease ends",
					"queue", q.name, "job", j.ID, "err", rerr)
			}
			return nil
		}
		cctx, cancel := context.WithTimeout(ctx, left)
		var ext *Job
		ext, err = q.Extend(cctx, j)
		cancel()
		switch {
		case err == nil:
			return ext
		case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrNotFound):
			return nil // the claim was lost (a failover), or its job moved on
		case final(err):
			deadline = time.Now() // no renewal can be confirmed (an ACL without +wait)
			continue
		}
		if sleepCtx(ctx, min(delay, max(time.Until(deadline), 0))) != nil {
			continue // reported and given back above
		}
		delay = min(2*delay, q.cfg.Lease/10)
	}
}
