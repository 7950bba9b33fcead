package jobkey

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jobkey/jobkey/internal/cas"
	"github.com/jobkey/jobkey/internal/weighted"
	"github.com/redis/go-redis/v9"
)

// Handler runs jobs for Work. It returns the job's result, or an error to
// fail the attempt. Its ctx is canceled when the job is canceled, when the
// lease is lost or could not be renewed in time, when the job's timeout
// or its Deadline passes, or when shutdown's grace period runs out;
// context.Cause says which. A job claimed after its Deadline is not handed
// to the handler (Job.Deadline). A handler must return soon
// after: past that point another worker may run the job.
type Handler interface {
	Work(ctx context.Context, j *Job) ([]byte, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, j *Job) ([]byte, error)

// Work calls f.
func (f HandlerFunc) Work(ctx context.Context, j *Job) ([]byte, error) { return f(ctx, j) }

// WorkOpts configure Work. A nil *WorkOpts means all defaults.
type WorkOpts struct {
	// Concurrency is how many handlers run at once (default: 10).
	Concurrency int
	// Name identifies this worker in LeaseOwner; each runner (the goroutine
	// that claims and runs one job at a time) appends
	// "/<n>" (default: "<hostname>-<pid>-<random>").
	Name string
	// PollInterval is the longest an idle worker waits before looking for
	// due jobs again when no wake-up hint arrives (default: 1s).
	PollInterval time.Duration
	// ShutdownGrace is how long in-flight handlers may run on after ctx ends
	// before their contexts are canceled and their jobs released (default: 10s).
	ShutdownGrace time.Duration
	// LeaseMargin is how long before its lease would run out a handler is
	// stopped when the lease could not be renewed (ErrLeaseExpired). The
	// worker measures the lease on its own monotonic clock from the moment
	// it asked for it, so the margin covers only its own scheduling delays,
	// the handler's time to stop, and clock skew between Redis nodes that
	// serve one shard in turn (a failover). Default: Lease/5; at most
	// Lease/2.
	LeaseMargin time.Duration
	// TrimInterval is how often Work removes index entries of finished jobs
	// whose keys expired, in bounded steps (see Queue.Trim). Each Work
	// starts at a random point of the interval, so workers spread it
	// (default: 1m; -1 disables).
	TrimInterval time.Duration
	// Logger receives errors Work cannot return (default: Config.Logger).
	Logger *slog.Logger
	// OnRecorded, when set, is called once for every job whose outcome the
	// worker wrote or tried to write: with the job as stored after Complete,
	// Fail or Release, or with the claimed copy and the error that stopped
	// the write. It is called from Work's goroutines and must not block
	// (default: none).
	OnRecorded func(j *Job, err error)
	// Timeout bounds each run of a job whose own Timeout is zero (see
	// Job.Timeout; default: none).
	Timeout time.Duration
	// Periodic lists the jobs this Work enqueues at every tick of their
	// schedules (see PeriodicJob). Any number of processes may list the
	// same ones: one job exists per tick (default: none).
	Periodic []PeriodicJob
	// StuckAfter is how long a handler may run on after its context ended
	// before Work reports it stuck: logged once at WARN, counted in
	// Queue.Metrics and in Stats.StuckHandlers until it returns. Its runner
	// takes no other job meanwhile. At shutdown, Work returns without the
	// handlers still stuck this long after ShutdownGrace, with
	// ErrHandlerStuck (default: 10s).
	StuckAfter time.Duration
	// RetryPolicy decides the retry of this Work's failed runs, in place
	// of Config.Backoff; a handler with a policy of its own (a Retrier:
	// WithRetryPolicy, a Mux of such handlers) decides first for its jobs
	// (default: none, Config.Backoff).
	RetryPolicy RetryPolicy
	// Prefetch is the most jobs Work may hold claimed ahead of its free
	// slots, their leases renewed, so that one transaction writes the
	// completions of many runs and claims the jobs its slots take next
	// (see docs/design.md, "Finishing in bulk, claiming ahead"). Work
	// claims no more ahead than its slots are expected to take during one
	// transaction, so handlers that run long next to a round trip get
	// none, and gives back a job held longer than 100 ms. -1 turns this
	// off: each runner then completes its job and claims its next one
	// itself, sharing transactions only with the runners that finish at
	// the same moment (default: 2×Concurrency; under WorkQueues, off).
	Prefetch int
}

// Work claims and runs jobs with h until ctx ends, then shuts down
// gracefully: it stops claiming, lets in-flight handlers finish within
// ShutdownGrace, then cancels the rest and releases their jobs. It returns
// nil once every handler has returned and its outcome is recorded (or its
// lease has run out, when Redis cannot be reached), and every job claimed
// for it and not run is given back: nothing it started runs on after it
// returns.
//
// A handler that ignores its context cannot be stopped: Go has no way to.
// StuckAfter after its context ended, Work reports it stuck (a WARN log,
// Queue.Metrics, Stats.StuckHandlers) until it returns, and its runner takes
// no other job meanwhile, so Concurrency stays a true bound. Once its job
// was canceled or its lease lost, another worker may run the job beside
// it; jobkey fences its writes but cannot prevent that run. At shutdown,
// once only stuck handlers are left, Work stops renewing their leases and
// returns ErrHandlerStuck rather than wait for them forever (see
// docs/design.md, "A handler that ignores its context").
//
// While a handler runs and until its outcome is recorded, its lease is
// renewed every Lease/3, and the outcome write is retried with backoff
// until it lands or the lease is gone. A handler whose lease could not be
// renewed is stopped before the lease runs out (see LeaseMargin). Idle
// workers do not busy-poll: they wait for the wake-up hint every enqueue
// publishes in its EXEC, for the next scheduled job's time, or for
// PollInterval.
func (q *Queue) Work(ctx context.Context, h Handler, opts *WorkOpts) error {
	if h == nil {
		return fmt.Errorf("%w: Work with nil handler", ErrInvalid)
	}
	o, err := q.workOpts(opts)
	if err != nil {
		return err
	}
	return q.runWork(ctx, h, o, nil, 0, []string{q.name})
}

// runWork is Work with its options checked. gate, when set, shares the runs
// with the other queues of a WorkQueues, where this one is queue gi;
// queues names them all (or this one), for the Work's report.
func (q *Queue) runWork(ctx context.Context, h Handler, o WorkOpts, gate *weighted.Gate, gi int, queues []string) (err error) {
	w := &worker{q: q, h: h, o: o, wake: make(chan struct{}, o.Concurrency), running: map[*run]struct{}{},
		stuck: map[*run]time.Time{}, changed: make(chan struct{}, 1), abandoned: make(chan struct{}), trail: &cas.Trail{},
		gate: gate, gi: gi, queues: queues, runsMoved: make(chan struct{}, 1)}
	// By Redis's clock: when it is not known yet, the first report sets it.
	if t, known := q.clock.Estimate(); known {
		w.started = t
	}
	// Every call of this Work carries its trail: a claim given back for a
	// runner that left its call is counted there until it is over.
	ctx = cas.WithTrail(ctx, w.trail)
	// Handlers outlive ctx by the grace period, so they hang off a context
	// that ctx's end does not cancel; it is canceled when the grace runs
	// out, which reaches every handler, even one whose claim was still in
	// flight then. Outcome writes hang off one that is never canceled.
	w.writes = context.WithoutCancel(ctx)
	var stopRuns context.CancelCauseFunc
	w.runs, stopRuns = context.WithCancelCause(w.writes)
	defer stopRuns(nil)
	w.renewer = newRenewer(w)
	defer w.renewer.close()
	if o.Prefetch >= 0 && gate == nil && q.finishes != nil {
		w.ahead = newFeeder(ctx, w)
		// After the runners, and before the renewer: the completions handed
		// over are written while their leases are kept.
		defer w.ahead.close()
	}
	sub := q.rdb.Subscribe(ctx, q.ks.wakeChannel(), q.ks.cancelChannel())
	q.listeners.Add(1)
	defer func() {
		if q.listeners.Add(-1) == 0 {
			q.pool.StopProbe() // a read of unreachable shards a claim of this Work may have started
		}
	}()
	listening := make(chan struct{})
	go func() { defer close(listening); w.listen(sub.Channel()) }()
	defer func() {
		// Nothing of this Work outlives it: the listener, and the checks
		// of cancel hints it started.
		sub.Close()
		<-listening
		w.checks.Wait()
	}()

	var runners, chores sync.WaitGroup
	w.live = o.Concurrency
	q.work.runners.Add(int64(o.Concurrency))
	defer q.work.runners.Add(-int64(o.Concurrency))
	for i := range o.Concurrency {
		w.goRunner(ctx, &runners, o.Name+"/"+strconv.Itoa(i))
	}
	if o.TrimInterval > 0 {
		chores.Go(func() { w.trimmer(ctx) })
	}
	// The report outlives ctx: it lists the runs shutdown still waits for,
	// and goes once Work returns.
	reportCtx, endReport := context.WithCancel(context.WithoutCancel(ctx))
	chores.Go(func() { w.reporter(reportCtx) })
	for _, p := range o.Periodic {
		chores.Go(func() { w.periodic(ctx, p) })
	}
	<-ctx.Done()
	// Runners stop claiming by themselves (they watch ctx); so do the chores
	// but the report, which ends when Work returns.
	defer chores.Wait()
	defer endReport()
	finished := make(chan struct{})
	go func() { runners.Wait(); close(finished) }()
	err = w.drain(finished, stopRuns)
	// Nothing of this Work outlives it: the flushes that still carry calls
	// its runners left at their deadline, and the give-backs of the jobs
	// those claimed. Each is bounded: a flush by its callers' deadlines and
	// Redis's read timeout, a give-back by the lease.
	w.trail.Wait()
	return err
}

// drain waits for the runners to finish: in-flight handlers get
// ShutdownGrace, then their contexts are canceled with ErrShutdown. Go
// cannot stop a handler that ignores that, so once every runner still
// running is held by a stuck handler (see WorkOpts.StuckAfter), drain
// stops waiting: their leases are no longer renewed, and the error names
// them.
func (w *worker) drain(finished <-chan struct{}, stopRuns context.CancelCauseFunc) error {
	grace := time.NewTimer(w.o.ShutdownGrace)
	defer grace.Stop()
	for {
		if err := w.giveUp(); err != nil {
			return err
		}
		select {
		case <-finished:
			return nil
		case <-grace.C:
			w.endRuns(stopRuns)
		case <-w.changed:
		}
	}
}

// endRuns cancels every run's context with ErrShutdown (stopRuns, the
// parent of them all) and tells the stuck watches of the handlers that
// run under them (stuck.go).
func (w *worker) endRuns(stopRuns context.CancelCauseFunc) {
	stopRuns(ErrShutdown)
	var watches []*stuckWatch
	w.mu.Lock()
	for r := range w.running {
		if s := r.watching.Load(); s != nil {
			watches = append(watches, s)
		}
	}
	w.mu.Unlock()
	// Outside w.mu: a watch that fires takes its own lock, then w.mu.
	for _, s := range watches {
		s.ended(ErrShutdown)
	}
}

// workOpts fills in the defaults and checks the options.
func (q *Queue) workOpts(opts *WorkOpts) (WorkOpts, error) {
	o := WorkOpts{}
	if opts != nil {
		o = *opts
	}
	o.Concurrency = cmp.Or(o.Concurrency, 10)
	o.PollInterval = cmp.Or(o.PollInterval, time.Second)
	o.ShutdownGrace = cmp.Or(o.ShutdownGrace, 10*time.Second)
	o.LeaseMargin = cmp.Or(o.LeaseMargin, q.cfg.Lease/5)
	o.TrimInterval = cmp.Or(o.TrimInterval, time.Minute)
	o.StuckAfter = cmp.Or(o.StuckAfter, 10*time.Second)
	o.Prefetch = cmp.Or(o.Prefetch, 2*o.Concurrency)
	if o.Name == "" {
		host, _ := os.Hostname()
		o.Name = fmt.Sprintf("%s-%d-%s", cmp.Or(host, "worker"), os.Getpid(), NewID()[20:])
	}
	if o.Logger == nil {
		o.Logger = q.cfg.Logger
	}
	if o.Concurrency < 1 || o.PollInterval <= 0 || o.ShutdownGrace < 0 || o.LeaseMargin < 0 || o.LeaseMargin > q.cfg.Lease/2 ||
		o.TrimInterval < 0 && o.TrimInterval != -1 || o.Timeout < 0 || o.StuckAfter < 0 || o.Prefetch < -1 {
		return o, fmt.Errorf("%w: WorkOpts: Concurrency %d, PollInterval %v, ShutdownGrace %v, LeaseMargin %v (at most Lease/2, %v), TrimInterval %v, Timeout %v, StuckAfter %v, Prefetch %d",
			ErrInvalid, o.Concurrency, o.PollInterval, o.ShutdownGrace, o.LeaseMargin, q.cfg.Lease/2, o.TrimInterval, o.Timeout, o.StuckAfter, o.Prefetch)
	}
	if err := validOwner(o.Name + "/" + strconv.Itoa(o.Concurrency)); err != nil {
		return o, err
	}
	if err := q.validPeriodic(o.Periodic, q.clock.Guess()); err != nil {
		return o, err
	}
	return o, nil
}

type worker struct {
	q    *Queue
	h    Handler
	o    WorkOpts
	wake chan struct{}
	// runs is the parent of every handler's context; writes, of every
	// write about a run.
	runs, writes context.Context

	mu      sync.Mutex
	running map[*run]struct{}
	checks  sync.WaitGroup // confirmations of cancel hints in flight
	// live counts the runners that have not returned; stuck, the handlers
	// reported stuck that have not returned. Both under mu; changed is
	// poked when either changes, for drain.
	live    int
	stuck   map[*run]time.Time // when each one's context ended
	changed chan struct{}
	// abandoned is closed when shutdown gives up on the stuck handlers:
	// their reports are no longer renewed, nor are their leases (each
	// run's abandoned).
	abandoned chan struct{}
	// renewer keeps the leases of the runs.
	renewer *renewer
	// trail counts what this Work's calls leave running once answered
	// (see cas.Trail); Work waits for it before it returns.
	trail *cas.Trail
	// gate, when set, shares runs with the other queues of a WorkQueues
	// (internal/weighted): a runner holds one of its runs from its claim
	// until its job's outcome is recorded. gi is this queue's index in it.
	gate *weighted.Gate
	gi   int
	// queues and started are what this Work reports of itself
	// (workers.go): the queues of its WorkQueues (or its own), and when it
	// started, by Redis's clock (the reporter's alone once set).
	queues  []string
	started time.Time
	// runsMoved is poked when a run starts or stops: the report follows
	// within reportGap.
	runsMoved chan struct{}
	// ahead, when set, writes successes in bulk and holds the jobs claimed
	// ahead of free slots (workahead.go).
	ahead *feeder
}

// listen turns pub/sub messages into wake-ups and cancellations. Anyone
// allowed to publish on the channel can send a cancel message, so it is a
// hint: the run is stopped only once the stored job confirms it.
func (w *worker) listen(ch <-chan *redis.Message) {
	for m := range ch {
		switch m.Channel {
		case w.q.ks.wakeChannel():
			// While every shard is paused, only Resume's hint wakes a
			// runner: an enqueue's would send it through a claim that
			// cannot take anything. Runners still look at PollInterval.
			if p, ok := strings.CutPrefix(m.Payload, "p"); ok {
				// A job of that priority was enqueued: read-ahead entries
				// of lower ones must not pass it over.
				if n, err := strconv.Atoi(p); err == nil {
					w.q.prios.Store(true)
					w.q.pool.DropBelow(n)
				}
			}
			if m.Payload == resumeHint || !w.q.paused.Load() {
				if w.gate != nil {
					w.gate.SetIdle(w.gi, time.Time{}) // a job came: the queue competes for runs again
				}
				w.poke()
			}
		case w.q.ks.cancelChannel():
			w.mu.Lock()
			for r := range w.running {
				if r.job.ID == m.Payload {
					w.checks.Go(func() { r.confirmCancel(w) })
				}
			}
			w.mu.Unlock()
		}
	}
}

// goRunner runs a runner on a goroutine of its own. A handler that calls
// runtime.Goexit (t.FailNow does) ends the runner's goroutine without
// returning; the runner then goes on in a new one, so Concurrency does not
// shrink for good.
func (w *worker) goRunner(ctx context.Context, runners *sync.WaitGroup, name string) {
	runners.Add(1)
	go func() {
		returned := false
		defer func() {
			if returned {
				w.runnerDone()
			} else {
				w.goRunner(ctx, runners, name) // added before this one is done: runners.Wait cannot return between
			}
			runners.Done()
		}()
		w.runner(ctx, name)
		returned = true
	}()
}

// poke wakes one idle runner, if any is waiting.
func (w *worker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// runner claims and runs jobs one at a time until ctx ends. Under a
// WorkQueues it holds a run of the shared gate from its claim until its
// job's outcome is recorded (a job claimed with the last completion
// included), and gives it back when it has no job.
func (w *worker) runner(ctx context.Context, name string) {
	errDelay := 10 * time.Millisecond
	var next *Job           // claimed with the last completion, not run yet
	var nextAsked time.Time // when that claim was asked for
	held := false           // a run of the gate
	release := func() {
		if held {
			w.gate.Release()
			held = false
		}
	}
	defer release() // also when a handler's runtime.Goexit ends this goroutine
	for {
		if next != nil {
			// execute gives it back unrun if shutdown has begun.
			j := next
			next, nextAsked = w.execute(ctx, j, nextAsked, name)
			if next == nil {
				release()
			}
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if w.ahead != nil {
			if a, ok := w.ahead.take(); ok {
				next, nextAsked = w.executeRun(ctx, a.r, a.asked, name)
				continue
			}
		}
		if w.gate != nil && !held {
			if !w.gate.Acquire(ctx, w.gi) {
				return // shutdown while waiting for a run
			}
			held = true
		}
		asked := time.Now() // the lease is measured from before the claim
		j, err := w.q.workClaim(ctx, name)
		switch {
		case err == nil:
			errDelay = 10 * time.Millisecond
			if w.gate != nil {
				w.gate.SetIdle(w.gi, time.Time{})
			}
			w.poke() // there may be more: let another idle runner look
			next, nextAsked = w.execute(ctx, j, asked, name)
			if next == nil {
				release()
			}
		case errors.Is(err, ErrNoJob):
			release()
			wait := w.o.PollInterval
			// Sleep until the next scheduled job is due, if that is sooner.
			// A job due now that the claim just missed (taken by another
			// worker a moment before) gets a short pause, not a busy loop.
			if d, ok, err := w.q.untilDue(ctx); err == nil && ok {
				wait = min(wait, max(5*time.Millisecond, d))
			}
			if w.gate != nil {
				// Until then its polls take only runs nobody busy wants.
				w.gate.SetIdle(w.gi, time.Now().Add(wait))
			}
			w.idle(ctx, wait)
		case ended(ctx):
			return // shutdown: the claim was cut short by it, not failed
		default:
			release()
			if w.gate != nil {
				// A queue whose claims fail holds no shared run while it
				// backs off: its runners poll as an idle queue's do.
				w.gate.SetIdle(w.gi, time.Now().Add(errDelay))
			}
			w.o.Logger.Error("jobkey: claim failed", "queue", w.q.name, "worker", name, "err", err)
			w.idle(ctx, errDelay)
			errDelay = min(2*errDelay, w.o.PollInterval)
		}
	}
}

// ended reports whether ctx has ended, or reached its deadline: a read
// bounded by that deadline (Redis's socket deadline, a batch's flush
// context) can fail with it a moment before ctx's own timer marks ctx
// done.
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// trimmer runs Queue.Trim every TrimInterval until ctx ends, starting at a
// random point of the interval.
func (w *worker) trimmer(ctx context.Context) {
	wait := rand.N(w.o.TrimInterval)
	for {
		if sleepCtx(ctx, wait) != nil {
			return
		}
		if n, err := w.q.Trim(ctx); err != nil && ctx.Err() == nil {
			w.o.Logger.Warn("jobkey: trim failed", "queue", w.q.name, "err", err)
		} else if n > 0 {
			w.o.Logger.Debug("jobkey: trimmed index entries of expired jobs", "queue", w.q.name, "removed", n)
		}
		wait = w.o.TrimInterval
	}
}

func (w *worker) idle(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-w.wake:
	case <-t.C:
	}
}

// execute runs the handler under a kept lease and records the outcome.
// ctx is Work's: when it has ended, shutdown began while the claim was in
// flight, and the job goes back unrun. A success is completed together
// with the claim of the runner's next job when one is due (see completeclaim.go); the
// job claimed so is returned, with when it was asked for.
func (w *worker) execute(ctx context.Context, j *Job, asked time.Time, name string) (next *Job, nextAsked time.Time) {
	return w.executeRun(ctx, w.start(j, asked), asked, name)
}

// executeRun is execute of a run already started: a job claimed ahead,
// whose lease the renewer kept while it waited. A success handed to the
// feeder leaves the run to it: the run stops once its completion is
// written.
func (w *worker) executeRun(ctx context.Context, r *run, asked time.Time, name string) (next *Job, nextAsked time.Time) {
	j := r.job
	handed := false
	defer func() {
		if !handed {
			w.stop(r)
		}
	}()
	if cause := context.Cause(r.ctx); cause != nil {
		// Claimed ahead, its run ended while it waited: canceled, its
		// lease lost or run out, or shutdown. Only a shutdown leaves the
		// job ours to give back.
		if errors.Is(cause, ErrShutdown) {
			w.record(r, w.q.Release)
		}
		return nil, time.Time{}
	}
	if ctx.Err() != nil || r.left() <= 0 {
		// Shutdown began while the claim was in flight, or the claim took
		// so long that its lease may be over by now: do not start a run
		// that another worker may be starting too. Give the job back; the
		// release is fenced, so it writes only if the lease is still ours.
		w.record(r, w.q.Release)
		return nil, time.Time{}
	}
	if pastDeadline(j) {
		// As asynq does, the handler is not run: the attempt fails.
		w.record(r, func(ctx context.Context, j *Job) (*Job, error) { return w.fail(ctx, j, deadlineError(j, nil)) })
		return nil, time.Time{}
	}
	hctx, timeout := r.ctx, cmp.Or(j.Timeout, w.o.Timeout)
	if timeout > 0 {
		var stop context.CancelFunc
		hctx, stop = context.WithTimeoutCause(r.ctx, timeout, ErrTimeout)
		defer stop()
	}
	hctx, stopDeadline := withDeadline(hctx, j, asked)
	defer stopDeadline()
	watch := w.watch(r, hctx)
	returned := false
	defer func() {
		if !returned {
			w.q.work.busy.Add(-1)
			// The handler called runtime.Goexit: it neither returned nor
			// panicked, and this goroutine is ending (goRunner starts the
			// runner again). The attempt fails, as after a panic, while the
			// lease is still kept (w.stop runs after this), unless the
			// lease is no longer ours to write under.
			watch.returned()
			switch cause := context.Cause(r.ctx); {
			case errors.Is(cause, ErrLeaseLost), errors.Is(cause, ErrJobCanceled), errors.Is(cause, ErrLeaseExpired):
			case errors.Is(cause, ErrShutdown):
				w.record(r, w.q.Release)
			default:
				w.record(r, func(ctx context.Context, j *Job) (*Job, error) { return w.fail(ctx, j, errHandlerGoexit) })
			}
		}
	}()
	w.q.work.busy.Add(1)
	result, err := w.call(hctx, j)
	w.q.work.busy.Add(-1)
	returned = true
	watch.returned()
	if own := r.own.Load(); own != nil {
		// The handler completed its job itself (CompleteTx): that is the
		// run's outcome, whatever it returned, and nothing is written.
		if err != nil {
			w.o.Logger.Warn("jobkey: the handler completed its job itself, then returned an error; its completion stands",
				"queue", w.q.name, "job", j.ID, "err", err)
		}
		w.recorded(r.job, own, nil)
		return nil, time.Time{}
	}
	cause := context.Cause(r.ctx)
	timedOut := err != nil && cause == nil && errors.Is(context.Cause(hctx), ErrTimeout)
	deadlined := err != nil && cause == nil && errors.Is(context.Cause(hctx), ErrDeadline)
	switch {
	case errors.Is(cause, ErrLeaseLost), errors.Is(cause, ErrJobCanceled):
		// Someone else owns the job's fate now: any write would be fenced off.
		if errors.Is(cause, ErrJobCanceled) {
			w.q.work.canceled.Add(1)
		}
	case err == nil:
		var unsure *Job // a claim whose EXEC's reply was lost
		if cause == nil && w.ahead != nil && w.ahead.handOff(r, result) {
			handed = true
			return nil, time.Time{}
		}
		if ctx.Err() == nil && cause == nil {
			var done bool
			if next, unsure, nextAsked, done = w.finish(r, result, name); done {
				return next, nextAsked
			}
		}
		if unsure != nil {
			// Once the completion is recorded (below), look for the claim.
			defer func() { next = w.findClaim(ctx, unsure, nextAsked) }()
		}
		// Even at shutdown, or when the lease could not be renewed: if the
		// lease still holds, the success stands; if not, fencing refuses it.
		w.recordSuccess(r, result)
	case errors.Is(cause, ErrLeaseExpired):
		// The job is claimed again once the lease runs out in Redis; a write
		// now would race that claim for nothing.
	case errors.Is(cause, ErrShutdown):
		w.record(r, w.q.Release)
	case deadlined:
		// An attempt like any failed one, as in asynq: retried under backoff.
		w.record(r, func(ctx context.Context, j *Job) (*Job, error) { return w.fail(ctx, j, deadlineError(j, err)) })
	case timedOut:
		// An attempt like any failed one: retried under backoff.
		w.record(r, func(ctx context.Context, j *Job) (*Job, error) {
			return w.fail(ctx, j, fmt.Errorf("timeout: the handler ran past its timeout of %v: %w", timeout, err))
		})
	default:
		w.record(r, func(ctx context.Context, j *Job) (*Job, error) { return w.fail(ctx, j, err) })
	}
	return next, nextAsked
}

// recordSuccess writes a run's success with retries (record). A success
// that cannot be stored as it is (a result too large, a broken index)
// fails the job for good with the reason, rather than leave it leased to
// nobody, to run again and again.
func (w *worker) recordSuccess(r *run, result []byte) {
	werr := w.record(r, func(ctx context.Context, j *Job) (*Job, error) { return w.q.Complete(ctx, j, result) })
	if werr != nil && final(werr) && !errors.Is(werr, ErrLeaseLost) && !errors.Is(werr, ErrNotFound) {
		w.record(r, func(ctx context.Context, j *Job) (*Job, error) {
			return w.fail(ctx, j, skipRetry(wrapf(werr, "the handler succeeded, but its outcome could not be recorded")))
		})
	}
}

// finish completes a success and claims the runner's next job in one
// transaction. done says the completion's fate is known (recorded, or
// lost for good); otherwise the caller records it the usual way, with
// retries. next, when set, is the runner's next job, claimed by this very
// transaction, whatever became of the completion.
func (w *worker) finish(r *run, result []byte, name string) (next, unsure *Job, asked time.Time, done bool) {
	if w.gate != nil && !w.gate.Keep(w.gi) {
		// Under a WorkQueues, the run this job frees goes to another
		// queue: completed alone, with no claim of this queue's next job.
		return nil, nil, time.Time{}, false
	}
	ctx, cancel := context.WithTimeout(w.writes, max(r.left(), time.Millisecond))
	defer cancel()
	asked = time.Now()
	r.writing.Store(true)
	out, err := w.q.completeAndClaim(ctx, r.current(), result, name)
	r.writing.Store(false)
	r.sent(err)
	switch {
	case err == nil:
		w.recorded(r.job, out.done, nil)
		return out.next, nil, asked, true
	case errors.Is(err, ErrLeaseLost), errors.Is(err, ErrNotFound):
		w.recorded(r.job, r.job, err)
		return out.next, nil, asked, true
	}
	// The completion is recorded the usual way, with retries (it failed
	// alone, or the whole transaction did); a claim that landed with it
	// stands, and runs next. A claim whose fate is unknown is looked for.
	return out.next, out.unsure, asked, false
}

// findClaim looks for a claim made by a complete-and-claim transaction whose EXEC's
// reply was lost: the job it claimed is the runner's if it is active under
// the lease token the transaction chose. The read is retried while that
// lease may still hold, so a slow or broken link does not leave the job
// under a lease nobody holds, spending an attempt it never ran. A job
// found too late to run is given back by execute (its lease is measured
// from asked).
//
// Every other way out gives the claim back before it returns, fenced on
// the token, so that a claim that did not land is not touched: Work's ctx
// ending (between reads, during one, or while the replicas are asked to
// confirm the claim) and the lease running out before the claim was found.
// Work waits for its runners, so no give-back outlives it.
func (w *worker) findClaim(ctx context.Context, unsure *Job, asked time.Time) *Job {
	deadline := asked.Add(leaseLeft(unsure))
	delay := 10 * time.Millisecond
	for ctx.Err() == nil && time.Now().Before(deadline) {
		rctx, cancel := context.WithDeadline(ctx, deadline)
		cur, err := w.q.Get(rctx, unsure.ID)
		cancel()
		switch {
		case err == nil && cur.State == StateActive && cur.LeaseToken == unsure.LeaseToken:
			if w.q.cfg.MinReplicas > 0 {
				// Found on the master, not confirmed by the replicas: as
				// any unconfirmed claim, handed over once a renewal is, or
				// given back.
				return w.q.confirmClaim(ctx, cur, asked, ErrNotReplicated)
			}
			return cur // execute gives it back if shutdown began meanwhile
		case err == nil, errors.Is(err, ErrNotFound), errors.Is(err, ErrCorrupt), errors.Is(err, ErrWrongType):
			return nil // the EXEC did not land, or the job moved on
		}
		_ = sleepCtx(ctx, min(delay, max(time.Until(deadline), 0))) // an end of ctx is seen by the loop
		delay = min(2*delay, time.Second)
	}
	if err := w.q.releaseUnrun(ctx, unsure, deadline); err != nil && !claimGone(err) {
		w.q.cfg.Logger.Warn("jobkey: could not give back a claim whose reply was lost; it is claimed again when its lease ends",
			"queue", w.q.name, "job", unsure.ID, "err", err)
	}
	return nil
}

// recorded logs a failed write, counts one that landed (j as stored, of
// the run that claimed claimed) in Queue.Metrics, and tells OnRecorded.
func (w *worker) recorded(claimed, j *Job, err error) {
	if err != nil {
		w.o.Logger.Error("jobkey: could not record job outcome", "queue", w.q.name, "job", j.ID, "err", err)
	} else {
		w.q.work.count(claimed, j)
	}
	if w.o.OnRecorded != nil {
		w.o.OnRecorded(j, err)
	}
}

// fail records a failed run under the retry policy of the handler, else
// WorkOpts.RetryPolicy, else Config.Backoff (retry.go).
func (w *worker) fail(ctx context.Context, j *Job, cause error) (*Job, error) {
	var policy RetryPolicy
	if r, ok := w.h.(Retrier); ok || w.o.RetryPolicy != nil {
		policy = func(j *Job, err error) RetryDecision {
			if ok {
				if d, mine := r.NextRetry(j, err); mine {
					return d
				}
			}
			if w.o.RetryPolicy != nil {
				return w.o.RetryPolicy(j, err)
			}
			return RetryDecision{Delay: w.q.cfg.Backoff(j.Attempt)}
		}
	}
	return w.q.fail(ctx, j, cause, policy)
}

// errHandlerGoexit fails the attempt of a handler that called
// runtime.Goexit.
var errHandlerGoexit = errors.New("the handler called runtime.Goexit: it neither returned nor panicked")

// call runs the handler, turning a panic into an error with its stack.
func (w *worker) call(ctx context.Context, j *Job) (result []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	// The handler gets its own copy, Meta included: what it changes never
	// reaches the job the worker writes back.
	c := cloneJob(j)
	c.Meta = cloneMeta(j.Meta)
	return w.h.Work(ctx, c)
}
