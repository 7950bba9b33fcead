package cas

import (
	"context"
	"errors"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Call is one caller's request waiting in a Group.
type Call[T, R any] struct {
	ctx  context.Context
	in   T
	out  R
	err  error
	once sync.Once
	done chan struct{} // closed when out and err are set
	// left is set once the caller was answered because its ctx ended.
	left atomic.Bool
	// orphan, when not nil, is given an answer that came after the caller
	// left: a claim made for it is given back. trail is the caller's (see
	// Trail): it counts the call until its flush is over, and the
	// give-back.
	orphan func(t *Trail, out R)
	trail  *Trail
}

// Finish answers the caller. The first answer stands; later ones are
// ignored, so a flush may answer a call early and again at its end. An
// answer that comes after the caller left goes to orphan.
func (c *Call[T, R]) Finish(out R, err error) {
	answered := false
	c.once.Do(func() {
		c.out, c.err = out, err
		if c.done != nil { // nil: made by NewAnsweredCalls
			close(c.done)
		}
		answered = true
	})
	if !answered && c.left.Load() && c.orphan != nil {
		c.orphan(c.trail, out)
	}
}

// Gone reports a caller whose ctx has ended, and answers it with ctx's
// error. A flush asks before each decision and leaves such calls out of
// the EXEC it prepares, so nothing is written for a caller that gave up.
func (c *Call[T, R]) Gone() bool {
	err := c.ctx.Err()
	if err == nil {
		return false
	}
	c.left.Store(true)
	var zero R
	c.Finish(zero, err)
	return true
}

// NewCall returns a call of in under ctx that no group made, for a flush
// run by hand.
func NewCall[T, R any](ctx context.Context, in T) *Call[T, R] {
	return &Call[T, R]{ctx: ctx, in: in, done: make(chan struct{})}
}

// NewAnsweredCalls returns calls of ins under ctx for a flush run by hand
// whose caller reads the answers only once every call has one: they share
// one allocation and have no channel, so Wait on one that was not answered
// yet returns its zero answer at once. Answer each (Finish: the first
// answer stands) before reading it.
func NewAnsweredCalls[T, R any](ctx context.Context, ins []T) []*Call[T, R] {
	calls := make([]Call[T, R], len(ins))
	out := make([]*Call[T, R], len(ins))
	for i, in := range ins {
		calls[i].ctx, calls[i].in = ctx, in
		out[i] = &calls[i]
	}
	return out
}

// In returns the call's input.
func (c *Call[T, R]) In() T { return c.in }

// Context returns the caller's context.
func (c *Call[T, R]) Context() context.Context { return c.ctx }

// Trail counts what a caller's calls leave running once they were
// answered: a call a flush still carries, whose answer may yet come after
// the caller left and start a give-back (Call.orphan), and that give-back.
// Work's calls carry its trail in their ctx, and Work waits for it before
// it returns, so that nothing it started outlives it. A nil *Trail counts
// nothing.
type Trail struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil while it is 0
}

type trailKey struct{}

// WithTrail returns ctx carrying t: the calls made under it count on t.
func WithTrail(ctx context.Context, t *Trail) context.Context {
	return context.WithValue(ctx, trailKey{}, t)
}

// TrailOf returns the trail ctx carries, or nil.
func TrailOf(ctx context.Context) *Trail {
	t, _ := ctx.Value(trailKey{}).(*Trail)
	return t
}

// Add counts one more thing running.
func (t *Trail) Add() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		t.idle = make(chan struct{})
	}
	t.n++
}

// Done counts one thing less.
func (t *Trail) Done() {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n--; t.n == 0 {
		close(t.idle)
		t.idle = nil
	}
}

// Wait returns once nothing is counted.
func (t *Trail) Wait() {
	t.mu.Lock()
	idle := t.idle
	t.mu.Unlock()
	if idle != nil {
		<-idle
	}
}

// errUnanswered is what a call gets if a flush forgot it: a bug.
var errUnanswered = errors.New("jobkey: internal error: a batched call got no answer")

// Group lets concurrent callers share round trips ("group commit").
// A caller that finds no flush running starts one at once (alone, when
// uncontended: it costs what it would without the group). Callers arriving
// while a flush runs queue up, and the flush then takes the whole queue as
// its next batch. Under load the leader first waits a bounded time (fill)
// for the queue to hold as many calls as there were callers in the group
// during its flush: the callers it just answered are usually on their way
// back, and a batch that leaves without them splits the callers into
// groups that take turns, each paying a batch's fixed cost. Each job in a batch is still read and decided under its
// own WATCH, and written in the one MULTI/EXEC; only the round trips are
// shared.
//
// Deadlines: a caller whose ctx ends while it waits in the queue leaves it
// and gets ctx's error: nothing was sent for it, nor will be. One whose
// ctx ends once a flush has taken its call is answered at once, with an
// error that matches both ErrOutcomeUnknown and ctx's error: the EXEC that
// carries it may be on the wire, and Redis may be too slow to say. The
// flush goes on for the others and leaves the call out of its next
// decision; a job claimed for it by an EXEC that was already sent is given
// back (orphan).
type Group[T, R any] struct {
	Max   int // largest batch
	Flush func(ctx context.Context, calls []*Call[T, R])
	// Lanes is how many flushes may run at once (0 means 1). A second
	// lane opens only when the one running is saturated: a caller that
	// finds a full batch (max) already queued starts a flush at once
	// instead of queueing behind it. Lanes suit calls that never compete
	// for a key, such as enqueues of fresh IDs; for claims and finishes,
	// which share the head of the queue, more lanes cut batches and cause
	// conflicts (measured: the burn-down ran slower with 2 and 3 than
	// with 1).
	Lanes int
	// Fill is how long a leader, between batches, may wait for its next
	// batch to fill (0: it takes what is queued at once). It waits parked
	// until a caller comes, then by yielding the processor, so the callers
	// it just answered can run (fill). A group whose waits mostly gather
	// no caller, its callers busy elsewhere, stops waiting (fillScore).
	Fill time.Duration
	// HandOver lets the next batch's round trip 1 be carried behind this
	// batch's EXEC when calls are queued (handover.go). It suits a group whose callers
	// come back at once, as Work's slots do to finish and claim; closed-loop
	// enqueuers measured fewer calls per batch with it, and more CPU per job.
	HandOver bool
	// hist counts the batches flushed by size.
	hist batchHist
	// Unknown, when not nil, is the error of a caller whose ctx ended
	// while its call was in flight; it must match ErrOutcomeUnknown and
	// err (see OutcomeUnknown).
	Unknown func(in T, err error) error
	// Orphan, when not nil, takes a call's answer that came after its
	// caller left (see Call.orphan), with the caller's trail.
	Orphan func(t *Trail, out R)

	// inside counts the callers in run now; peak is the most there were
	// since the last flush began (under mu).
	inside atomic.Int32
	peak   int
	// fillScore says whether next's waits pay (under mu): a wait that
	// gathered a call (one that came after the first, which would have
	// gone at once) raises it to at least 1, filled or not; one that ended
	// short with callers queued and gathered no one takes 1, within
	// ±fillScoreMax. While it is below 0, next takes what is queued at
	// once; once it has done so fillProbe times (skipped counts them), the
	// next batch waits anyway, to learn whether waiting pays again, and
	// one that gathers makes the group wait again at once. Lifecycle's
	// callers go from enqueue to claim to complete, and the callers a
	// leader waits for are in the other groups: 60% of its waits timed out
	// with callers queued and 15% filled, where enqueue's filled 97%.
	fillScore, skipped int

	mu      sync.Mutex
	running int // flushes running
	queue   []*Call[T, R]
	// idle holds the parked leaders, the last parked on top; waiting, the
	// leaders waiting for their next batch to fill (fill).
	idle, waiting []*leader[T, R]
	// leaders counts the leader goroutines alive; started, those ever
	// started.
	leaders atomic.Int32
	started atomic.Int64
}

// Do runs in through the group and returns its own outcome.
func (g *Group[T, R]) Do(ctx context.Context, in T) (R, error) { return g.run(ctx, in, false) }

// Await is Do for a caller that must learn what was written for it, as a
// Work runner must of its claim at shutdown, to give the job back before
// Work returns: once a flush has taken its call, it waits for the flush's
// answer rather than being answered when ctx ends. The flush still leaves
// the call out of every decision made after ctx ended.
func (g *Group[T, R]) Await(ctx context.Context, in T) (R, error) { return g.run(ctx, in, true) }

func (g *Group[T, R]) run(ctx context.Context, in T, await bool) (R, error) {
	var zero R
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	c := &Call[T, R]{ctx: ctx, in: in, done: make(chan struct{}), orphan: g.Orphan}
	if g.Orphan != nil {
		// Its answer may start a give-back after the caller left: the
		// caller's trail counts the call until its flush is over.
		c.trail = TrailOf(ctx)
		c.trail.Add()
	}
	g.inside.Add(1)
	defer g.inside.Add(-1)
	g.mu.Lock()
	g.queue = append(g.queue, c)
	g.peak = max(g.peak, int(g.inside.Load()))
	if g.running == 0 || (g.running < g.Lanes && len(g.queue) > g.Max) {
		g.running++
		// The flush runs on a leader goroutine, not the caller's, so a
		// caller whose ctx ends can return while the flush goes on for the
		// others.
		g.start(g.take(), nil)
	}
	if len(g.waiting) > 0 {
		g.wakeFilled()
	}
	g.mu.Unlock()
	select {
	case <-c.done:
		return c.out, c.err
	case <-ctx.Done():
	}
	g.mu.Lock()
	if i := slices.Index(g.queue, c); i >= 0 {
		g.queue = slices.Delete(g.queue, i, i+1)
		g.mu.Unlock()
		c.trail.Done()
		return zero, ctx.Err() // never sent
	}
	g.mu.Unlock()
	if await {
		<-c.done
		return c.out, c.err
	}
	// Taken by a flush, whose EXEC may be on the wire and may take as long
	// as Redis stalls (go-redis cuts a read short at a deadline only with
	// ContextTimeoutEnabled): the caller is answered now, unless the flush
	// answered first.
	c.left.Store(true)
	if g.Unknown != nil {
		c.Finish(zero, g.Unknown(c.in, ctx.Err()))
	} else {
		c.Finish(zero, OutcomeUnknown("", "", ctx.Err()))
	}
	return c.out, c.err
}

// take removes the next batch from the head of the queue. g.mu is held.
func (g *Group[T, R]) take() []*Call[T, R] {
	n := min(len(g.queue), g.Max)
	batch := slices.Clone(g.queue[:n])
	g.queue = slices.Delete(g.queue, 0, n)
	return batch
}

// leader is a goroutine that leads a group's flushes. Between its runs it
// parks, and the group hands a parked leader its next run (start) rather
// than starting a goroutine per batch: a new goroutine grows its stack
// anew down go-redis's write path, and under a hand-over every batch has
// a new leader (runtime.copystack took 3 to 8% of the burn-down's samples;
// none with parked leaders). A parked leader that gets no run within
// leaderLinger exits, so an idle group leaves no goroutine behind; it
// holds no connection while parked (leadFrom lets them go). Its wake and
// timer serve one wait at a time: its own, or, during its flush, the
// successor's start (succeed, then succession.pass), which the flush runs
// once, and before it ends.
type leader[T, R any] struct {
	runs  chan leaderRun[T, R] // buffered 1: its next run, sent by start
	wake  chan struct{}        // buffered 1: its batch filled (wakeFilled)
	want  int                  // the queue length it waits for, under g.mu
	timer *time.Timer          // the backstop of its waits, reused
	cache connCache
}

// leaderRun is the work start hands a leader: a batch, and the hand-over
// that may carry its first read.
type leaderRun[T, R any] struct {
	batch []*Call[T, R]
	in    *handover
}

// leaderLinger is how long a parked leader waits for a run before it
// exits: thousands of batches under load, and short against anything
// that waits for an idle group's goroutines to end.
const leaderLinger = 100 * time.Millisecond

// start runs batch, whose first read in may carry, on the leader parked
// last, or on a new one when none is parked. g.mu is held.
func (g *Group[T, R]) start(batch []*Call[T, R], in *handover) {
	r := leaderRun[T, R]{batch: batch, in: in}
	if n := len(g.idle); n > 0 {
		l := g.idle[n-1]
		g.idle[n-1] = nil
		g.idle = g.idle[:n-1]
		l.runs <- r // never blocks: a leader is parked only with its buffer empty
		return
	}
	l := &leader[T, R]{runs: make(chan leaderRun[T, R], 1), wake: make(chan struct{}, 1), timer: time.NewTimer(leaderLinger)}
	l.timer.Stop()
	g.leaders.Add(1)
	g.started.Add(1)
	go g.lead(l, r)
}

// lead runs l: run after run, parking between them, until it lingered
// idle for leaderLinger.
func (g *Group[T, R]) lead(l *leader[T, R], r leaderRun[T, R]) {
	defer g.leaders.Add(-1)
	for {
		g.leadFrom(l, r.batch, r.in)
		var ok bool
		if r, ok = g.park(l); !ok {
			return
		}
	}
}

// park waits for l's next run, and reports false when none came within
// leaderLinger: l has left the idle leaders and must exit.
func (g *Group[T, R]) park(l *leader[T, R]) (leaderRun[T, R], bool) {
	g.mu.Lock()
	g.idle = append(g.idle, l)
	g.mu.Unlock()
	l.timer.Reset(leaderLinger)
	select {
	case r := <-l.runs:
		l.timer.Stop()
		return r, true
	case <-l.timer.C:
	}
	g.mu.Lock()
	if i := slices.Index(g.idle, l); i >= 0 {
		g.idle = slices.Delete(g.idle, i, i+1)
		g.mu.Unlock()
		return leaderRun[T, R]{}, false
	}
	g.mu.Unlock()
	// start took it off the idle leaders as its timer fired: the run was
	// sent under g.mu.
	return <-l.runs, true
}

// leadFrom flushes batches until the queue is empty. in, when not nil, is
// the hand-over of a leader this one took over from, whose EXEC may carry
// its first read (handover.go). Leadership passes on the same way: a flush
// that started a successor ends its leader's run, and the successor goes
// on.
func (g *Group[T, R]) leadFrom(l *leader[T, R], batch []*Call[T, R], in *handover) {
	var zero R
	// The leader keeps its connections from batch to batch while callers
	// keep coming, and lets them go when the group goes idle, or when
	// leadership passed on: a parked leader keeps none out of the pool.
	cache := &l.cache
	defer cache.release()
	for len(batch) > 0 {
		g.hist.add(len(batch))
		g.mu.Lock()
		g.peak = int(g.inside.Load())
		g.mu.Unlock()
		ctx, cancel := flushContext(batch)
		ctx = context.WithValue(ctx, connCacheKey{}, cache)
		if in != nil {
			ctx = context.WithValue(ctx, handoverKey{}, in)
		}
		var out *succession
		if g.HandOver {
			inflight := len(batch)
			out = &succession{start: func(h *handover) bool { return g.succeed(l, h, inflight) }, timer: l.timer}
			ctx = context.WithValue(ctx, successionKey{}, out)
		}
		g.Flush(ctx, batch)
		cancel()
		if in != nil {
			in.decline() // a flush that never read lets the EXEC before it go alone
			in = nil
		}
		for _, c := range batch {
			c.Finish(zero, errUnanswered)
			c.trail.Done() // the flush is over: no answer comes after this
		}
		if out != nil && out.passed() {
			return // the successor leads the group now
		}
		batch = g.next(l)
	}
}

// succeed takes the calls queued now as the next batch and starts its
// flush on another leader, whose first read may be carried by h; it
// reports false when none is queued. inflight is the size of the batch
// whose EXEC is about to go: the callers outside it are usually on their
// way, and a successor that leaves without them splits the callers into
// groups that take turns, so it first waits up to successorFill for them
// (fill), as next does for Fill. The new leader takes over this one's
// place among the flushes running. l is the leader calling.
func (g *Group[T, R]) succeed(l *leader[T, R], h *handover, inflight int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.fill(l, min(g.peak-inflight, g.Max), successorFill, true)
	batch := g.take()
	if len(batch) == 0 {
		return false
	}
	g.start(batch, h)
	return true
}

// successorFill bounds how long an EXEC waits for its successor's batch
// to fill (succeed).
const successorFill = 50 * time.Microsecond

// fillScoreMax bounds fillScore, so a group whose waits stop gathering
// callers stops waiting within fillScoreMax+1 of them; fillProbe is how
// many batches a group that stopped waiting takes at once before one
// waits anyway.
const (
	fillScoreMax = 8
	fillProbe    = 8
)

// next takes l's next batch, and leaves the group when there is none.
// While the group's waits pay (fillScore), or to probe whether they pay
// again, it first waits up to Fill for the queue to hold as many calls as
// there were callers during the last flush; otherwise it takes what is
// queued at once.
func (g *Group[T, R]) next(l *leader[T, R]) []*Call[T, R] {
	g.mu.Lock()
	defer g.mu.Unlock()
	if want := min(g.peak, g.Max); g.Fill > 0 && len(g.queue) < want {
		if g.fillScore >= 0 || g.skipped >= fillProbe {
			g.skipped = 0
			// The first call to come to an empty queue would have gone
			// at once (it starts a flush of its own when no leader
			// waits): a wait gathers the calls that come after it.
			before := max(len(g.queue), 1)
			queued, filled := g.fill(l, want, g.Fill, false)
			switch {
			case len(g.queue) > before:
				// It gathered callers, whose calls share this batch's
				// round trips: waiting pays, filled or not.
				g.fillScore = min(max(g.fillScore, 0)+1, fillScoreMax)
			case queued && !filled:
				// It held its queued callers and gathered no one. (A
				// wait for one call, on an empty queue, held no one.)
				g.fillScore = max(g.fillScore-1, -fillScoreMax)
			}
		} else if len(g.queue) > 0 {
			g.skipped++ // a batch taken at once
		}
	}
	batch := g.take()
	if len(batch) == 0 {
		g.running--
	}
	return batch
}

// fill waits until the queue holds want calls, or for d at most. held
// says callers wait on l's flush meanwhile (succeed: the batch whose EXEC
// the wait holds back). g.mu is held, and is again when it returns.
//
// While no call is queued and none is held, nobody waits on l: it parks,
// and the first caller to come wakes it (wakeFilled). Once a caller waits,
// l yields the processor until its batch fills, as the callers it waits
// for usually come within microseconds, and the wait's end must come on
// time: the runtime's timers fire late when the process is otherwise idle
// (a 50 µs timer took 1.1 ms on Linux, its netpoller sleeping whole
// milliseconds), and a parked wait whose callers do not come then held a
// queued caller 1.1 ms where yielding holds it 50 µs (p99 70 µs against
// 1.1 ms, BenchmarkGroupFillWhileACallerStaysAway). In the burn-down the
// callers outside the batch are mostly queued already when succeed looks,
// and the yields left are few: its yielding was the hand-over's, which
// parks (succession.pass).
//
// It reports whether a call was queued when the wait ended, and whether
// the queue then held want.
func (g *Group[T, R]) fill(l *leader[T, R], want int, d time.Duration, held bool) (queued, filled bool) {
	deadline := time.Now().Add(d)
	for len(g.queue) < want {
		now := time.Now()
		if !now.Before(deadline) {
			return len(g.queue) > 0, false
		}
		if len(g.queue) == 0 && !held {
			g.parkFill(l, 1, deadline.Sub(now))
			continue
		}
		g.mu.Unlock()
		runtime.Gosched()
		g.mu.Lock()
	}
	return len(g.queue) > 0, true
}

// parkFill parks l until the queue holds want calls or d has passed.
// g.mu is held, and is again when it returns.
func (g *Group[T, R]) parkFill(l *leader[T, R], want int, d time.Duration) {
	l.want = want
	g.waiting = append(g.waiting, l)
	g.mu.Unlock()
	l.timer.Reset(d)
	select {
	case <-l.wake:
	case <-l.timer.C:
	}
	l.timer.Stop()
	g.mu.Lock()
	if i := slices.Index(g.waiting, l); i >= 0 {
		g.waiting = slices.Delete(g.waiting, i, i+1)
	}
	select {
	case <-l.wake: // sent as the timer fired
	default:
	}
}

// wakeFilled wakes the leaders waiting in fill whose batch the queue now
// fills. g.mu is held.
func (g *Group[T, R]) wakeFilled() {
	for i := 0; i < len(g.waiting); {
		l := g.waiting[i]
		if len(g.queue) < l.want {
			i++
			continue
		}
		g.waiting = slices.Delete(g.waiting, i, i+1)
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// flushContext is what a batch is flushed under: not canceled when one
// caller gives up, since the others still wait, but ended at the latest
// deadline among its callers, so a batch whose callers have all given up
// does not run on.
func flushContext[T, R any](batch []*Call[T, R]) (context.Context, context.CancelFunc) {
	base := context.WithoutCancel(batch[0].ctx)
	var latest time.Time
	for _, c := range batch {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.WithCancel(base)
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(base, latest)
}

// Live answers the callers of a batch that gave up before the flush began
// and returns the rest.
func Live[T, R any](batch []*Call[T, R]) []*Call[T, R] {
	out := batch[:0:0]
	for _, c := range batch {
		if !c.Gone() {
			out = append(out, c)
		}
	}
	return out
}

// batchHist counts a group's flushes by how many calls they carried.
type batchHist struct {
	flushes, calls atomic.Int64
	buckets        [SizeBuckets]atomic.Int64
}

// SizeBuckets covers batches of 1 to 4096 calls (Config.MaxBatch's most).
const SizeBuckets = 13

func (h *batchHist) add(n int) {
	h.flushes.Add(1)
	h.calls.Add(int64(n))
	h.buckets[min(bits.Len(uint(n-1)), SizeBuckets-1)].Add(1)
}

// Sizes is a histogram of a group's flushes: how many ran, how many calls
// they carried, and Buckets[i] those of more than 2^(i-1) and at most 2^i
// calls (Buckets[0]: one call).
type Sizes struct {
	Flushes, Calls int64
	Buckets        [SizeBuckets]int64
}

// Sizes returns a copy of the group's histogram.
func (g *Group[T, R]) Sizes() Sizes {
	h := &g.hist
	var s Sizes
	s.Flushes, s.Calls = h.flushes.Load(), h.calls.Load()
	for i := range h.buckets {
		s.Buckets[i] = h.buckets[i].Load()
	}
	return s
}

// State returns how many flushes run and how many calls wait.
func (g *Group[T, R]) State() (running, queued int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.running, len(g.queue)
}

// Wait waits for the call's answer (see NewAnsweredCalls for calls with
// no channel).
func (c *Call[T, R]) Wait() (R, error) {
	if c.done != nil {
		<-c.done
	}
	return c.out, c.err
}

// Count adds a batch of n calls that the caller flushed itself (with
// NewCall) to the group's histogram.
func (g *Group[T, R]) Count(n int) { g.hist.add(n) }
