package jobkey

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// call is one caller's request waiting in a commitGroup.
type call[T, R any] struct {
	ctx  context.Context
	in   T
	out  R
	err  error
	once sync.Once
	done chan struct{} // closed when out and err are set
	// left is set once the caller was answered because its ctx ended.
	left atomic.Bool
	// orphan, when not nil, is given an answer that came after the caller
	// left: a claim made for it is given back.
	orphan func(R)
}

// finish answers the caller. The first answer stands; later ones are
// ignored, so a flush may answer a call early and again at its end. An
// answer that comes after the caller left goes to orphan.
func (c *call[T, R]) finish(out R, err error) {
	answered := false
	c.once.Do(func() {
		c.out, c.err = out, err
		close(c.done)
		answered = true
	})
	if !answered && c.left.Load() && c.orphan != nil {
		c.orphan(out)
	}
}

// gone reports a caller whose ctx has ended, and answers it with ctx's
// error. A flush asks before each decision and leaves such calls out of
// the EXEC it prepares, so nothing is written for a caller that gave up.
func (c *call[T, R]) gone() bool {
	err := c.ctx.Err()
	if err == nil {
		return false
	}
	c.left.Store(true)
	var zero R
	c.finish(zero, err)
	return true
}

// errUnanswered is what a call gets if a flush forgot it: a bug.
var errUnanswered = errors.New("jobkey: internal error: a batched call got no answer")

// commitGroup lets concurrent callers share round trips ("group commit").
// A caller that finds no flush running starts one at once (alone, when
// uncontended: it costs what it would without the group). Callers arriving
// while a flush runs queue up, and the flush then takes the whole queue as
// its next batch. Each job in a batch is still read and decided under its
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
type commitGroup[T, R any] struct {
	max   int // largest batch
	flush func(ctx context.Context, calls []*call[T, R])
	// lanes is how many flushes may run at once (0 means 1): a caller that
	// finds fewer running starts one at once instead of queueing. Lanes
	// suit calls that never compete for a key, such as enqueues of fresh
	// IDs; for claims and finishes, which share the head of the queue,
	// more lanes cut batches and cause conflicts (measured: the burn-down
	// ran slower with 2 and 3 than with 1).
	lanes int
	// unknown, when not nil, is the error of a caller whose ctx ended
	// while its call was in flight; it must match ErrOutcomeUnknown and
	// err (see outcomeUnknown).
	unknown func(in T, err error) error
	// orphan, when not nil, takes a call's answer that came after its
	// caller left (see call.orphan).
	orphan func(R)

	mu      sync.Mutex
	running int // flushes running
	queue   []*call[T, R]
}

// do runs in through the group and returns its own outcome.
func (g *commitGroup[T, R]) do(ctx context.Context, in T) (R, error) { return g.run(ctx, in, false) }

// await is do for a caller that must learn what was written for it, as a
// Work slot must of its claim at shutdown, to give the job back before
// Work returns: once a flush has taken its call, it waits for the flush's
// answer rather than being answered when ctx ends. The flush still leaves
// the call out of every decision made after ctx ended.
func (g *commitGroup[T, R]) await(ctx context.Context, in T) (R, error) { return g.run(ctx, in, true) }

func (g *commitGroup[T, R]) run(ctx context.Context, in T, await bool) (R, error) {
	var zero R
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	c := &call[T, R]{ctx: ctx, in: in, done: make(chan struct{}), orphan: g.orphan}
	g.mu.Lock()
	g.queue = append(g.queue, c)
	if g.running < max(g.lanes, 1) {
		g.running++
		batch := g.take()
		g.mu.Unlock()
		// The flush runs on a goroutine of its own, so a leader whose ctx
		// ends can return while the flush goes on for the others.
		go g.lead(batch)
	} else {
		g.mu.Unlock()
	}
	select {
	case <-c.done:
		return c.out, c.err
	case <-ctx.Done():
	}
	g.mu.Lock()
	if i := slices.Index(g.queue, c); i >= 0 {
		g.queue = slices.Delete(g.queue, i, i+1)
		g.mu.Unlock()
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
	if g.unknown != nil {
		c.finish(zero, g.unknown(c.in, ctx.Err()))
	} else {
		c.finish(zero, outcomeUnknown("", "", ctx.Err()))
	}
	return c.out, c.err
}

// take removes the next batch from the head of the queue. g.mu is held.
func (g *commitGroup[T, R]) take() []*call[T, R] {
	n := min(len(g.queue), g.max)
	batch := slices.Clone(g.queue[:n])
	g.queue = slices.Delete(g.queue, 0, n)
	return batch
}

// lead flushes batches until the queue is empty.
func (g *commitGroup[T, R]) lead(batch []*call[T, R]) {
	var zero R
	// The leader keeps its connections from batch to batch while callers
	// keep coming, and lets them go when the group goes idle.
	conns, release := withConnCache(context.Background())
	defer release()
	for len(batch) > 0 {
		ctx, cancel := flushContext(batch)
		ctx = context.WithValue(ctx, connCacheKey{}, conns.Value(connCacheKey{}))
		g.flush(ctx, batch)
		cancel()
		for _, c := range batch {
			c.finish(zero, errUnanswered)
		}
		g.mu.Lock()
		batch = g.take()
		if len(batch) == 0 {
			g.running--
		}
		g.mu.Unlock()
	}
}

// flushContext is what a batch is flushed under: not canceled when one
// caller gives up, since the others still wait, but ended at the latest
// deadline among its callers, so a batch whose callers have all given up
// does not run on.
func flushContext[T, R any](batch []*call[T, R]) (context.Context, context.CancelFunc) {
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

// live answers the callers of a batch that gave up before the flush began
// and returns the rest.
func live[T, R any](batch []*call[T, R]) []*call[T, R] {
	out := batch[:0:0]
	for _, c := range batch {
		if !c.gone() {
			out = append(out, c)
		}
	}
	return out
}
