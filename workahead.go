package jobkey

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/jobkey/jobkey/internal/cas"
)

// Bulk finishing and claiming ahead. A Work runner whose handler succeeded
// does not wait for its completion to be written: it hands the run to the
// Work's feeder and takes its next job. The feeder, one long-lived
// goroutine per Work, writes every completion handed to it since its last
// transaction in one compare-and-set, and in the same transaction claims
// the jobs the Work's slots will take before the next one lands. Those
// wait, claimed for this Work and their leases renewed, until a runner
// takes them. So under load one transaction of two round trips finishes
// and claims many jobs, where a runner that waits for its own completion
// shares a transaction only with the runners that finished at the same
// moment.
//
// What stays as it was:
//   - Each completion is fenced on its lease token and decided under its
//     own WATCH; each claim, from its job's value read under WATCH; types
//     are checked before MULTI (the same complete-and-claim transaction,
//     completeclaim.go).
//   - A completion's lease is renewed until the completion is written: the
//     run stays registered with the renewer until the feeder has its
//     answer.
//   - A completion the feeder could not write (a transient error, a reply
//     lost, replicas that did not confirm) is recorded the usual way, with
//     retries while its lease holds (worker.record).
//   - Concurrency still bounds the handlers that run: the feeder runs
//     none.
//
// What claiming ahead costs, and its bounds:
//   - Fairness between workers: a job claimed ahead is this Work's while
//     it waits, so an idle worker elsewhere cannot take it. At most
//     WorkOpts.Prefetch are held at once (claimed or being claimed), and
//     no more than the slots are expected to take during the next
//     transaction (twice the rate at which they finish jobs, times a
//     transaction's duration: zero when handlers run long next to a round
//     trip). One held past aheadHold, because every slot is busy with a
//     long job, is given back (a fenced Release, as at shutdown).
//   - Order: a job enqueued after the jobs held ahead, at a higher
//     priority, starts after them: at most one transaction's claims late.
//   - Shutdown: once Work's ctx ends nothing more is claimed ahead, and
//     every job held is given back unrun; completions are written until
//     the last runner has returned.

// aheadHold is the longest a job claimed ahead waits for a free slot
// before it is given back for another worker to take.
const aheadHold = 100 * time.Millisecond

// aheadRun is a job claimed ahead: its run, registered with the renewer,
// and when its claim was asked for (its lease is measured from then).
type aheadRun struct {
	r     *run
	asked time.Time
	at    time.Time // when it joined the buffer, by the local clock
}

// doneRun is a success handed to the feeder: its run and its result.
type doneRun struct {
	r      *run
	result []byte
}

// feeder writes a Work's completions in bulk and holds the jobs it
// claims ahead of free slots.
type feeder struct {
	w     *worker
	limit int // WorkOpts.Prefetch: the most jobs held ahead or being claimed

	mu      sync.Mutex
	done    []doneRun  // completions handed over, not sent yet
	ahead   []aheadRun // claimed ahead, oldest first
	busy    bool       // a transaction is being made or is in flight
	waiters int        // runners waiting in take
	coming  int        // runners that handed a success over and have not called take yet
	arrived *sync.Cond // broadcast when a job arrives or a transaction ends
	ended   bool       // Work's ctx ended: nothing more is held ahead
	closed  bool       // no more hand-offs: the feeder writes what it has and exits

	kick   chan struct{} // a completion was handed over
	quit   chan struct{} // closed by close
	exited chan struct{} // closed when loop returned
	// tasks are the records, give-backs and searches the feeder started;
	// close waits for them.
	tasks sync.WaitGroup

	// The loop's own: the rate at which the slots finish jobs and how long
	// a transaction takes, both smoothed; when the last transaction began;
	// the slot number the next claim is made for.
	rate float64
	txn  time.Duration
	last time.Time
	slot int
}

// newFeeder starts the feeder of w, whose Work runs under ctx.
func newFeeder(ctx context.Context, w *worker) *feeder {
	f := &feeder{w: w, limit: w.o.Prefetch, kick: make(chan struct{}, 1), quit: make(chan struct{}), exited: make(chan struct{})}
	f.arrived = sync.NewCond(&f.mu)
	go f.loop(ctx)
	return f
}

// close stops the feeder once it has written every completion handed to
// it, and waits for what it started. Runners must have stopped handing
// over, except stuck ones, whose later hand-offs are refused.
func (f *feeder) close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	close(f.quit)
	<-f.exited
	f.tasks.Wait()
}

// handOff gives the feeder r's success to write, and reports whether it
// took it: a result the job cannot store, or a feeder that is closing,
// leaves the write to the runner.
func (f *feeder) handOff(r *run, result []byte) bool {
	if f.w.q.checkJob(r.job) != nil || f.w.q.resultFits(r.job, result) != nil {
		return false
	}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return false
	}
	// Not yet a write in flight (commit marks it so once its transaction
	// is made): while it waits here, behind a transaction that may be slow,
	// its lease is renewed every Lease/3 like any run's. Skipping those
	// renewals left its first to when less than half the lease was left,
	// and a renewal slow to answer then came after the run's deadline.
	f.done = append(f.done, doneRun{r: r, result: result})
	f.coming++ // its runner wants its next job at once: the transaction claims one for it
	f.mu.Unlock()
	select {
	case f.kick <- struct{}{}:
	default:
	}
	return true
}

// take returns the oldest job held ahead for a runner. While none is held
// and a transaction is on its way (completions wait to be sent, or one is
// in flight), it waits for that transaction's claims: they count the
// runners waiting, as a runner's complete-and-claim would claim its next
// job. It reports false when there is nothing to wait for, or once Work's
// ctx has ended: the runner then claims by itself.
func (f *feeder) take() (aheadRun, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.coming > 0 {
		f.coming--
	}
	for len(f.ahead) == 0 && (f.busy || len(f.done) > 0) && !f.ended {
		f.waiters++
		f.arrived.Wait()
		f.waiters--
	}
	if len(f.ahead) == 0 || f.ended {
		return aheadRun{}, false
	}
	a := f.ahead[0]
	f.ahead[0] = aheadRun{}
	f.ahead = f.ahead[1:]
	return a, true
}

// loop writes completions as they come, until close.
func (f *feeder) loop(ctx context.Context) {
	defer close(f.exited)
	hold := time.NewTimer(time.Hour)
	defer hold.Stop()
	var conns context.Context
	release := func() {}
	defer func() { release() }()
	ended := ctx.Done()
	for {
		if ended != nil && ctx.Err() != nil {
			// Seen here too, not only while idle: a feeder kept busy by
			// successes claims nothing ahead once Work's ctx has ended.
			ended = nil
			f.end()
		}
		f.mu.Lock()
		batch := f.done[:min(len(f.done), f.w.q.cfg.MaxBatch)]
		f.done = f.done[len(batch):]
		closed := f.closed
		f.busy = len(batch) > 0
		f.mu.Unlock()
		if len(batch) > 0 {
			if conns == nil {
				// The connections are kept while completions keep coming,
				// and go back to the pool when the feeder goes idle.
				conns, release = cas.WithConnCache(f.w.writes)
			}
			f.commit(ctx, conns, batch)
			f.giveBackOld()
			continue
		}
		release()
		conns, release = nil, func() {}
		if closed {
			f.end()
			return
		}
		if d, ok := f.nextHold(); ok {
			hold.Reset(d)
		}
		select {
		case <-f.kick:
		case <-hold.C:
		case <-ended:
			ended = nil
			f.end()
		case <-f.quit:
		}
		f.giveBackOld()
	}
}

// commit writes batch's completions, claims ahead in the same
// transaction, and settles what came of each.
func (f *feeder) commit(ctx context.Context, conns context.Context, batch []doneRun) {
	w := f.w
	// A run whose lease is nearly out by this process's clock is recorded
	// on its own, with the usual retries: a transaction's deadline is its
	// earliest run's, and one late run must not cut it short for the rest.
	// Nearly out is never more than half of what a fresh lease leaves: the
	// estimate of a transaction's duration is measured only by the
	// transactions made, so after a spell of slow ones, were every run
	// recorded on its own, none would be made again, nor any claim ahead.
	soon := min(2*f.txn+5*time.Millisecond, (w.q.cfg.Lease-w.o.LeaseMargin)/2)
	left := time.Duration(1<<63 - 1)
	keep := batch[:0:0]
	for _, d := range batch {
		if l := d.r.left(); l < soon {
			f.tasks.Go(func() { w.recordSuccess(d.r, d.result); w.stop(d.r) })
		} else {
			left = min(left, l)
			keep = append(keep, d)
		}
	}
	defer func() {
		f.mu.Lock()
		f.busy = false
		f.arrived.Broadcast()
		f.mu.Unlock()
	}()
	if len(keep) == 0 {
		return
	}
	batch = keep
	start := time.Now()
	if !f.last.IsZero() {
		// The slots finished len(batch) jobs since the last transaction
		// began: their rate, smoothed.
		inst := float64(len(batch)) / max(start.Sub(f.last).Seconds(), 1e-6)
		f.rate = 0.8*f.rate + 0.2*inst
	}
	f.last = start
	n := f.wanted()
	tctx, cancel := context.WithTimeout(conns, left)
	defer cancel()
	ins := make([]finishIn, len(batch))
	for i, d := range batch {
		ins[i] = finishIn{job: d.r.current(), result: d.result}
		if i == 0 && n > 0 {
			ins[i].worker, ins[i].more = f.claimName(), n-1
		}
		d.r.writing.Store(true)
	}
	// Read below only once each is answered: no channel each.
	calls := cas.NewAnsweredCalls[finishIn, finishOut](tctx, ins)
	w.q.finishes.Count(len(calls))
	w.q.flushFinishes(tctx, calls)
	cancel()
	var claimed, unsure []*Job
	for i, d := range batch {
		calls[i].Finish(finishOut{}, errFeedUnanswered) // the first answer stands
		out, err := calls[i].Wait()
		r := d.r
		r.writing.Store(false)
		r.sent(err)
		switch {
		case err == nil:
			w.recorded(r.job, out.done, nil)
			w.stop(r)
		case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrNotFound):
			w.recorded(r.job, r.job, err)
			w.stop(r)
		default:
			// Recorded the usual way, with retries: it failed alone, or
			// the whole transaction did, or its reply was lost (the run
			// then recognises its own write).
			f.tasks.Go(func() { w.recordSuccess(r, d.result); w.stop(r) })
		}
		if out.next != nil {
			claimed = append(claimed, out.next)
		}
		claimed = append(claimed, out.more...)
		if out.unsure != nil {
			unsure = append(unsure, out.unsure)
		}
		unsure = append(unsure, out.unsureMore...)
	}
	f.txn = (4*f.txn + time.Since(start)) / 5
	asked := start
	for _, j := range claimed {
		f.hold(j, asked)
	}
	for _, j := range unsure {
		// Its EXEC's reply was lost: held once found under the token this
		// transaction chose, else given back (findClaim).
		f.tasks.Go(func() {
			if got := w.findClaim(ctx, j, asked); got != nil {
				f.hold(got, asked)
			}
		})
	}
}

// errFeedUnanswered is what a completion gets if the transaction forgot
// it: a bug, recorded then the usual way.
var errFeedUnanswered = errors.New("jobkey: internal error: a bulk completion got no answer")

// wanted returns how many jobs to claim now: one for each runner waiting
// for a job or on its way to take one after handing its success over (a
// runner leaves the second count as it joins the first), and what the
// slots are expected to take while the next
// transaction is in flight, less what is held; no more held ahead of the
// runners waiting than Prefetch. Nothing once Work's ctx has ended.
func (f *feeder) wanted() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended {
		return 0
	}
	soon := min(int(2*f.rate*f.txn.Seconds()+0.5), f.limit)
	return max(f.waiters+f.coming+soon-len(f.ahead), 0)
}

// claimName is the lease owner of the next claim ahead: the Work's name
// and a slot number, taken in turn (the runner that takes the job may be
// another).
func (f *feeder) claimName() string {
	f.slot = (f.slot + 1) % f.w.o.Concurrency
	return f.w.o.Name + "/" + strconv.Itoa(f.slot)
}

// hold starts the run of j, claimed ahead, and puts it in the buffer for a
// runner; once Work's ctx has ended it is given back instead.
func (f *feeder) hold(j *Job, asked time.Time) {
	f.w.q.work.prefetched.Add(1)
	r := f.w.start(j, asked)
	f.mu.Lock()
	if f.ended {
		f.mu.Unlock()
		f.giveBack(r)
		return
	}
	f.ahead = append(f.ahead, aheadRun{r: r, asked: asked, at: time.Now()})
	f.arrived.Signal()
	f.mu.Unlock()
	f.w.poke() // an idle runner takes it
}

// giveBack releases r's job, claimed ahead and never run, on a task:
// fenced on its lease token and retried for up to a lease
// (releaseUnrun): a job that never ran may go back whenever its claim
// still holds. One that cannot be is claimed again once
// its lease runs out.
func (f *feeder) giveBack(r *run) {
	f.tasks.Go(func() {
		defer f.w.stop(r)
		q := f.w.q
		err := q.releaseUnrun(f.w.writes, r.job, time.Now().Add(q.cfg.Lease))
		switch {
		case err == nil:
			q.work.prefetchReturned.Add(1)
		case !claimGone(err):
			f.w.o.Logger.Warn("jobkey: could not give back a job claimed ahead; it is claimed again when its lease ends",
				"queue", q.name, "job", r.job.ID, "err", err)
		}
	})
}

// end gives back every job held ahead: Work's ctx has ended, or the feeder
// is closing.
func (f *feeder) end() {
	f.mu.Lock()
	f.ended = true
	held := f.ahead
	f.ahead = nil
	f.arrived.Broadcast()
	f.mu.Unlock()
	for _, a := range held {
		f.giveBack(a.r)
	}
}

// giveBackOld gives back the jobs held longer than aheadHold: every slot
// is busy with a job that runs long, and another worker may be free.
func (f *feeder) giveBackOld() {
	f.mu.Lock()
	var old []aheadRun
	for len(f.ahead) > 0 && time.Since(f.ahead[0].at) >= aheadHold {
		old = append(old, f.ahead[0])
		f.ahead[0] = aheadRun{}
		f.ahead = f.ahead[1:]
	}
	f.mu.Unlock()
	for _, a := range old {
		f.giveBack(a.r)
	}
}

// nextHold returns how long until the oldest job held ahead has waited
// aheadHold, when one is held.
func (f *feeder) nextHold() (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.ahead) == 0 {
		return 0, false
	}
	return max(aheadHold-time.Since(f.ahead[0].at), 0), true
}
