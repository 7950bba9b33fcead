package jobkey

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Handler runs jobs for Work. It returns the job's result, or an error to
// fail the attempt. Its ctx is canceled when the lease is lost, the job is
// canceled, or shutdown's grace period runs out.
type Handler interface {
	Work(ctx context.Context, j *Job) ([]byte, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, j *Job) ([]byte, error)

// Work calls f.
func (f HandlerFunc) Work(ctx context.Context, j *Job) ([]byte, error) { return f(ctx, j) }

// ErrSkipRetry, wrapped into a handler's error, fails the job for good
// whatever attempts it has left.
var ErrSkipRetry = errors.New("jobkey: do not retry")

// Causes of a handler's context being canceled, for context.Cause.
var (
	// ErrJobCanceled is the cause when the job was canceled while running.
	ErrJobCanceled = errors.New("jobkey: job canceled")
	// ErrShutdown is the cause when shutdown's grace period ran out; the job
	// is released back to pending without spending its attempt.
	ErrShutdown = errors.New("jobkey: worker shutting down")
)

// WorkOpts configure Work. A nil *WorkOpts means all defaults.
type WorkOpts struct {
	// Concurrency is how many handlers run at once (default: 10).
	Concurrency int
	// Name identifies this worker in LeaseOwner; each handler slot appends
	// "/<n>" (default: "<hostname>-<pid>-<random>").
	Name string
	// PollInterval is the longest an idle worker waits before looking for
	// due jobs again when no wake-up hint arrives (default: 1s).
	PollInterval time.Duration
	// ShutdownGrace is how long in-flight handlers may run on after ctx ends
	// before their contexts are canceled and their jobs released (default: 10s).
	ShutdownGrace time.Duration
	// CompleteBatch is the most completions one transaction records. Slots
	// hand finished jobs to a completer and go on claiming; it writes what
	// has piled up with CompleteMany (default: 32; 1 completes one by one).
	CompleteBatch int
	// Logger receives errors Work cannot return (default: slog.Default()).
	Logger *slog.Logger
	// OnRecorded, when set, is called once for every job whose outcome the
	// worker wrote or tried to write: with the job as stored after Complete,
	// Fail or Release, or with the claimed copy and the error that stopped
	// the write. It is called from Work's goroutines and must not block
	// (default: none).
	OnRecorded func(j *Job, err error)
}

// Work claims and runs jobs with h until ctx ends, then shuts down
// gracefully: it stops claiming, lets in-flight handlers finish within
// ShutdownGrace, then cancels the rest and releases their jobs. It returns
// nil after a graceful shutdown.
//
// While a handler runs, its lease is renewed every Lease/3. Idle workers do
// not busy-poll: they wait for the wake-up hint every enqueue publishes in
// its EXEC, for the next scheduled job's time, or for PollInterval.
func (q *Queue) Work(ctx context.Context, h Handler, opts *WorkOpts) error {
	if h == nil {
		return errors.New("jobkey: Work with nil handler")
	}
	o := WorkOpts{}
	if opts != nil {
		o = *opts
	}
	o.Concurrency = cmp.Or(o.Concurrency, 10)
	o.PollInterval = cmp.Or(o.PollInterval, time.Second)
	o.ShutdownGrace = cmp.Or(o.ShutdownGrace, 10*time.Second)
	o.CompleteBatch = cmp.Or(o.CompleteBatch, 32)
	if o.Name == "" {
		host, _ := os.Hostname()
		o.Name = fmt.Sprintf("%s-%d-%s", cmp.Or(host, "worker"), os.Getpid(), NewID()[20:])
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Concurrency < 1 || o.PollInterval <= 0 || o.ShutdownGrace < 0 || o.CompleteBatch < 1 || o.CompleteBatch > q.cfg.MaxBatch {
		return fmt.Errorf("jobkey: bad WorkOpts: Concurrency %d, PollInterval %v, ShutdownGrace %v, CompleteBatch %d (at most Config.MaxBatch)",
			o.Concurrency, o.PollInterval, o.ShutdownGrace, o.CompleteBatch)
	}
	if err := validOwner(o.Name + "/" + strconv.Itoa(o.Concurrency)); err != nil {
		return err
	}

	w := &worker{q: q, h: h, o: o, wake: make(chan struct{}, o.Concurrency), running: map[string]*run{},
		completions: make(chan completion, o.Concurrency)}
	// Handlers outlive ctx by the grace period, so they hang off a context
	// that ctx's end does not cancel.
	w.base = context.WithoutCancel(ctx)
	sub := q.rdb.Subscribe(ctx, q.ks.wakeChannel(), q.ks.cancelChannel())
	defer sub.Close()
	go w.listen(sub.Channel())
	completerDone := make(chan struct{})
	go func() { defer close(completerDone); w.completer() }()
	defer func() { close(w.completions); <-completerDone }()

	var slots sync.WaitGroup
	for i := range o.Concurrency {
		slots.Go(func() { w.slot(ctx, o.Name+"/"+strconv.Itoa(i)) })
	}
	<-ctx.Done()
	// Stop claiming happened by itself (slots watch ctx). Now the grace.
	finished := make(chan struct{})
	go func() { slots.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(o.ShutdownGrace):
		w.cancelAll(ErrShutdown)
		<-finished
	}
	return nil
}

type run struct {
	job    *Job
	cancel context.CancelCauseFunc
}

type worker struct {
	q    *Queue
	h    Handler
	o    WorkOpts
	base context.Context
	wake chan struct{}

	completions chan completion

	mu      sync.Mutex
	running map[string]*run // by job ID
}

type completion struct {
	job    *Job
	result []byte
}

// completer records successes in batches: it takes one, then whatever else
// is already waiting, up to CompleteBatch, and writes them in one
// transaction. Nothing waits for a batch to fill.
func (w *worker) completer() {
	for c := range w.completions {
		jobs, results := []*Job{c.job}, [][]byte{c.result}
	more:
		for len(jobs) < w.o.CompleteBatch {
			select {
			case c, ok := <-w.completions:
				if !ok {
					break more
				}
				jobs, results = append(jobs, c.job), append(results, c.result)
			default:
				break more
			}
		}
		ctx, cancel := context.WithTimeout(w.base, max(w.q.cfg.Lease, 5*time.Second))
		done, errs, err := w.q.CompleteMany(ctx, jobs, results)
		cancel()
		for i, j := range jobs {
			if err != nil {
				w.recorded(j, err)
			} else if errs[i] != nil {
				w.recorded(j, errs[i])
			} else {
				w.recorded(done[i], nil)
			}
		}
	}
}

// listen turns pub/sub messages into wake-ups and cancellations.
func (w *worker) listen(ch <-chan *redis.Message) {
	for m := range ch {
		switch m.Channel {
		case w.q.ks.wakeChannel():
			w.poke()
		case w.q.ks.cancelChannel():
			w.mu.Lock()
			if r := w.running[m.Payload]; r != nil {
				r.cancel(ErrJobCanceled)
			}
			w.mu.Unlock()
		}
	}
}

// poke wakes one idle slot, if any is waiting.
func (w *worker) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *worker) cancelAll(cause error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.running {
		r.cancel(cause)
	}
}

// slot claims and runs jobs one at a time until ctx ends.
func (w *worker) slot(ctx context.Context, name string) {
	errDelay := 10 * time.Millisecond
	for ctx.Err() == nil {
		j, err := w.q.Claim(ctx, name)
		var next time.Time
		if errors.Is(err, ErrNoJob) {
			// When the next scheduled job is due, so the idle wait ends then.
			next, _ = w.q.nextDue(ctx)
		}
		switch {
		case err == nil:
			errDelay = 10 * time.Millisecond
			w.poke() // there may be more: let another idle slot look
			w.execute(j)
		case errors.Is(err, ErrNoJob):
			wait := w.o.PollInterval
			if !next.IsZero() {
				wait = min(wait, max(time.Millisecond, next.Sub(w.q.now())))
			}
			w.idle(ctx, wait)
		case ctx.Err() != nil:
			return
		default:
			w.o.Logger.Error("jobkey: claim failed", "queue", w.q.name, "worker", name, "err", err)
			w.idle(ctx, errDelay)
			errDelay = min(2*errDelay, w.o.PollInterval)
		}
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

// execute runs the handler under a renewed lease and records the outcome.
func (w *worker) execute(j *Job) {
	jctx, cancel := context.WithCancelCause(w.base)
	defer cancel(nil)
	w.mu.Lock()
	w.running[j.ID] = &run{job: j, cancel: cancel}
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.running, j.ID)
		w.mu.Unlock()
	}()

	hbDone := make(chan struct{})
	go func() { defer close(hbDone); w.heartbeat(jctx, cancel, j) }()
	result, err := w.call(jctx, j)
	cause := context.Cause(jctx)
	cancel(nil) // stops the heartbeat
	<-hbDone

	// The outcome is written even while Work shuts down.
	wctx, wcancel := context.WithTimeout(w.base, max(w.q.cfg.Lease, 5*time.Second))
	defer wcancel()
	var stored *Job
	var werr error
	switch {
	case errors.Is(cause, ErrLeaseLost), errors.Is(cause, ErrJobCanceled):
		return // someone else owns the job's fate now; any write would be fenced off
	case errors.Is(cause, ErrShutdown):
		stored, werr = w.q.Release(wctx, j)
	case err == nil:
		w.completions <- completion{j, result}
		return // the completer records it
	default:
		stored, werr = w.q.Fail(wctx, j, err)
	}
	if werr != nil {
		stored = j
	}
	w.recorded(stored, werr)
}

// recorded logs a failed write and tells OnRecorded.
func (w *worker) recorded(j *Job, err error) {
	if err != nil {
		w.o.Logger.Error("jobkey: could not record job outcome", "queue", w.q.name, "job", j.ID, "err", err)
	}
	if w.o.OnRecorded != nil {
		w.o.OnRecorded(j, err)
	}
}

// call runs the handler, turning a panic into an error with its stack.
func (w *worker) call(ctx context.Context, j *Job) (result []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	return w.h.Work(ctx, cloneJob(j))
}

// heartbeat renews the lease every Lease/3 until ctx ends, and cancels the
// handler when the lease is lost (reclaimed, canceled or finished).
func (w *worker) heartbeat(ctx context.Context, cancel context.CancelCauseFunc, j *Job) {
	t := time.NewTicker(w.q.cfg.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := w.q.Extend(ctx, j)
		switch {
		case err == nil, ctx.Err() != nil:
		case errors.Is(err, ErrLeaseLost):
			var ll *LeaseLostError
			if errors.As(err, &ll) && ll.Now.State == StateCanceled {
				cancel(ErrJobCanceled)
			} else {
				cancel(err)
			}
			return
		default:
			// Redis unreachable: keep trying; if the lease runs out meanwhile,
			// fencing stops this worker's writes.
			w.o.Logger.Warn("jobkey: lease renewal failed", "queue", w.q.name, "job", j.ID, "err", err)
		}
	}
}
