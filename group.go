package jobkey

import (
	"context"
	"slices"
	"sync"
)

// call is one caller's request waiting in a commitGroup.
type call[T, R any] struct {
	ctx  context.Context
	in   T
	out  R
	err  error
	done chan struct{} // closed when out and err are set
	lead chan struct{} // closed when this caller must flush batch
	// batch is what a caller made leader flushes; it starts with the caller.
	batch []*call[T, R]
}

// commitGroup lets concurrent callers share round trips ("group commit").
// A caller that finds fewer than inflight flushes running flushes at once
// (alone, when uncontended: it costs exactly what it would without the
// group). Callers arriving while inflight flushes run queue up, and the
// first of them flushes the whole queue as one batch when a flush ends. Each job in a batch
// is still read and decided under its own WATCH, and written in the one
// MULTI/EXEC; only the round trips are shared.
type commitGroup[T, R any] struct {
	max      int // largest batch
	inflight int // most flushes running at once (default 1)
	flush    func(ctx context.Context, calls []*call[T, R])

	mu      sync.Mutex
	running int
	queue   []*call[T, R]
}

// do runs in through the group and returns its own outcome. A caller whose
// ctx ends while it still waits in the queue leaves it and gets ctx's
// error; once its batch is being flushed, it waits for the outcome.
func (g *commitGroup[T, R]) do(ctx context.Context, in T) (R, error) {
	c := &call[T, R]{ctx: ctx, in: in, done: make(chan struct{}), lead: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, c)
	if g.running < max(g.inflight, 1) {
		g.running++
		batch := g.take()
		g.mu.Unlock()
		g.lead(ctx, batch)
		return c.out, c.err
	}
	g.mu.Unlock()
	select {
	case <-c.done:
		return c.out, c.err
	case <-c.lead:
		g.lead(ctx, c.batch)
		return c.out, c.err
	case <-ctx.Done():
	}
	g.mu.Lock()
	select {
	case <-c.lead: // made leader meanwhile: it must still lead
		g.mu.Unlock()
		g.lead(ctx, c.batch)
		return c.out, c.err
	default:
	}
	if i := slices.Index(g.queue, c); i >= 0 {
		g.queue = slices.Delete(g.queue, i, i+1)
		g.mu.Unlock()
		var zero R
		return zero, ctx.Err()
	}
	g.mu.Unlock()
	<-c.done // already in a batch that another caller flushes
	return c.out, c.err
}

// take removes the next batch from the head of the queue. g.mu is held.
func (g *commitGroup[T, R]) take() []*call[T, R] {
	n := min(len(g.queue), g.max)
	batch := slices.Clone(g.queue[:n])
	g.queue = slices.Delete(g.queue, 0, n)
	return batch
}

// lead flushes batch, answers its callers, then hands the next batch to the
// head of the queue, or gives up its flush slot when nobody waits.
func (g *commitGroup[T, R]) lead(ctx context.Context, batch []*call[T, R]) {
	g.flush(context.WithoutCancel(ctx), batch)
	for _, b := range batch {
		close(b.done)
	}
	g.mu.Lock()
	if len(g.queue) > 0 {
		next := g.queue[0]
		next.batch = g.take() // starts with next itself
		close(next.lead)
	} else {
		g.running--
	}
	g.mu.Unlock()
}

// live drops from a batch the callers that gave up before the flush began,
// answering them with their ctx's error, and returns the rest.
func live[T, R any](batch []*call[T, R]) []*call[T, R] {
	out := batch[:0:0]
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			continue
		}
		out = append(out, c)
	}
	return out
}
