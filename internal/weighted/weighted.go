// Package weighted shares a fixed number of runs among several queues by
// weight, as asynq's Queues map does: the run a finished job frees goes to
// a queue that wants one, drawn at random in proportion to the weights of
// the queues that want one, or, strict, to the one of highest weight. A
// queue that wants no run costs nothing, and one alone may take every run.
//
// A queue whose last claim found nothing is idle until its next job may be
// due, or a wake-up hint says a job came: while idle, its runners' polls
// take only a run nobody busy wants, and never make a busy queue's runner
// give its run up.
package weighted

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// Gate hands out n runs among queues 0..len(weights)-1.
type Gate struct {
	mu      sync.Mutex
	free    int
	weights []int
	strict  bool
	waiting []int           // runners of each queue waiting for a run
	granted []int           // runs handed to each queue's waiters, not yet taken
	grants  []chan struct{} // one token per grant
	idle    []time.Time     // until when each queue is idle
}

// New returns a gate of n runs over queues of the given weights (each at
// least 1).
func New(n int, weights []int, strict bool) *Gate {
	g := &Gate{free: n, weights: weights, strict: strict, waiting: make([]int, len(weights)),
		granted: make([]int, len(weights)), grants: make([]chan struct{}, len(weights)), idle: make([]time.Time, len(weights))}
	for i := range g.grants {
		g.grants[i] = make(chan struct{}, n)
	}
	return g
}

// Acquire takes a run for a runner of queue i, waiting until one is
// handed to it; false when ctx ended first.
func (g *Gate) Acquire(ctx context.Context, i int) bool {
	g.mu.Lock()
	if g.free > 0 && g.wanting(-1) == 0 {
		g.free--
		g.mu.Unlock()
		return true
	}
	g.waiting[i]++
	g.mu.Unlock()
	select {
	case <-g.grants[i]:
		g.mu.Lock()
		g.waiting[i]--
		g.granted[i]--
		g.mu.Unlock()
		return true
	case <-ctx.Done():
		g.mu.Lock()
		defer g.mu.Unlock()
		g.waiting[i]--
		if g.granted[i] > g.waiting[i] {
			// A run was handed to queue i for a waiter that no longer
			// waits: its token is in the channel (sent under mu); pass it on.
			<-g.grants[i]
			g.granted[i]--
			g.give()
		}
		return false
	}
}

// Release gives back a run a runner of some queue held.
func (g *Gate) Release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.give()
}

// Keep says whether a runner of queue i that just finished a job may
// keep its run for the queue's next job, as a fused complete-and-claim
// does: yes unless a runner of another queue that is not idle waits, and
// the draw by weight goes to that queue.
func (g *Gate) Keep(i int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.wantingBusy(i) == 0 {
		return true
	}
	return g.pick(i, true) == i
}

// SetIdle marks queue i idle until until (its claim found nothing, and
// no job of it is due before then), or busy with a zero until (a claim
// took a job, or a wake-up hint came).
func (g *Gate) SetIdle(i int, until time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.idle[i] = until
}

func (g *Gate) isIdle(q int, now time.Time) bool { return now.Before(g.idle[q]) }

// give hands a free run to the queue drawn among those whose runners
// wait, busy ones first; with none waiting, the run is free. Under mu.
func (g *Gate) give() {
	q := -1
	if g.wantingBusy(-1) > 0 {
		q = g.pick(-1, true)
	} else if g.wanting(-1) > 0 {
		q = g.pick(-1, false)
	}
	if q < 0 {
		g.free++
		return
	}
	g.granted[q]++
	g.grants[q] <- struct{}{}
}

// wanting counts the waiters with no run handed to them yet, of every
// queue but except.
func (g *Gate) wanting(except int) int {
	n := 0
	for q := range g.waiting {
		if q != except {
			n += g.waiting[q] - g.granted[q]
		}
	}
	return n
}

// wantingBusy is wanting, of the queues that are not idle.
func (g *Gate) wantingBusy(except int) int {
	n, now := 0, time.Now()
	for q := range g.waiting {
		if q != except && !g.isIdle(q, now) {
			n += g.waiting[q] - g.granted[q]
		}
	}
	return n
}

// pick draws a queue among those with waiters not yet handed a run (only
// busy ones when busyOnly), and also, when self >= 0, queue self: by
// weight, or the heaviest when strict. -1 when there is none.
func (g *Gate) pick(self int, busyOnly bool) int {
	best, total, now := -1, 0, time.Now()
	var cands []int
	for q := range g.waiting {
		if q != self && (g.waiting[q]-g.granted[q] <= 0 || busyOnly && g.isIdle(q, now)) {
			continue
		}
		cands = append(cands, q)
		total += g.weights[q]
		if best < 0 || g.weights[q] > g.weights[best] {
			best = q
		}
	}
	if best < 0 || g.strict {
		return best
	}
	r := rand.N(total)
	for _, q := range cands {
		if r < g.weights[q] {
			return q
		}
		r -= g.weights[q]
	}
	return best
}
