package cas

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// A hand-over carries the next batch's round trip 1 behind this batch's
// EXEC, on the same pinned connection: a busy group-commit leader then
// pays one round trip per batch, not two.
//
// Just before a flush sends its EXEC, the engine asks the flush's
// succession for a successor: when calls are queued, the group takes them
// as the next batch and starts its flush on another leader goroutine (a
// parked one, group.go), which becomes the group's leader. That flush builds its first transaction as
// it always does and, instead of sending its WATCH and reads on a
// connection of its own, hands them over. The EXEC's pipeline carries them
// after the EXEC: Redis runs them once the EXEC has run, so the next batch
// reads committed state under its own WATCH, and its type checks still
// come before its MULTI. The connection then passes to the successor,
// whose decision and EXEC follow on it.
//
// The hand-over is only an arrangement of round trips, never of decisions:
//   - The successor's read is what a read of its own would have been, sent
//     after the EXEC on the connection the EXEC cleared (an EXEC clears
//     every WATCH, whether it committed or not).
//   - When the EXEC's pipeline fails on the wire, the successor reads
//     again on a connection of its own: nothing was decided on what it
//     queued. The connection, which may still watch the successor's keys,
//     is unwatched and not kept.
//   - A flush whose callers all gave up while its successor got ready
//     sends no EXEC; the successor reads on its own.
//   - A successor that does not reach a read within handoverWait, or
//     whose first transaction routes to another node, or that has nothing
//     to do, declines; the EXEC goes alone, and the successor reads as it
//     would have.
//   - A transaction that waits for replicas (Options.MinReplicas) hands
//     nothing over: its WAIT ends its pipeline.

// handoverWait bounds how long an EXEC waits for its successor's read. The
// successor usually reads within microseconds, and wakes the EXEC when it
// offers or declines; the bound only keeps a slow one from holding back
// the batch whose EXEC is ready (the runtime's timers may fire up to a
// millisecond late when the process is idle: a successor that slow is
// rare, and its EXEC goes alone either way).
const handoverWait = 500 * time.Microsecond

// succession is a flush's way to hand its connection on: pass is called
// by the engine before an EXEC, and starts the successor at most once per
// flush.
type succession struct {
	start func(*handover) bool // takes the next batch and starts its flush; false when none is queued
	// timer, when not nil, is the backstop of pass's wait, the leader's
	// own: reused, not made anew for each EXEC.
	timer *time.Timer
	mu    sync.Mutex
	done  bool // a successor was started: it leads the group now
}

type successionKey struct{}

// passed reports whether the flush started a successor.
func (s *succession) passed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.done
}

// pass starts a successor for a read on node, and returns its hand-over
// when the successor offered its read, else nil.
func (s *succession) pass(node *redis.Client) *handover {
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return nil
	}
	h := &handover{node: node, result: make(chan carriedResult, 1), decided: make(chan struct{})}
	if !s.start(h) {
		s.mu.Unlock()
		return nil
	}
	s.done = true
	s.mu.Unlock()
	// The successor offers or declines within microseconds, and wakes
	// this wait when it does: the EXEC waits parked, leaving the processor
	// to the successor, and the timer only bounds a slow one. It waited by
	// yielding the processor before, and that was most of the burn-down's
	// yields (runtime.gosched_m 18% of its samples, 3% parked).
	if !h.waiting() {
		return h.took()
	}
	t := s.timer
	if t == nil {
		t = time.NewTimer(handoverWait)
	} else {
		t.Reset(handoverWait)
	}
	select {
	case <-h.decided:
	case <-t.C:
	}
	t.Stop()
	return h.took()
}

// took closes h if its successor has not decided yet, and returns h when
// the successor offered its read, else nil.
func (h *handover) took() *handover {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state == handoverOpen {
		h.settle(handoverClosed)
	}
	if h.state != handoverOffered {
		return nil
	}
	return h
}

// hand-over states.
const (
	handoverOpen    = iota // the successor has not read yet
	handoverOffered        // the successor's read waits in queue for the EXEC
	handoverClosed         // the successor reads on its own
)

// handover is one hand-over from a flush to its successor.
type handover struct {
	node  *redis.Client // the connection's node: a read routed elsewhere declines
	mu    sync.Mutex
	state int
	// decided is closed when state leaves handoverOpen (settle): it wakes
	// the EXEC waiting in pass.
	decided chan struct{}
	// queue appends the successor's round trip 1 to the EXEC's pipeline.
	queue func(ctx context.Context, p redis.Pipeliner)
	// result is sent exactly once when the successor offered.
	result chan carriedResult
}

type handoverKey struct{}

// carriedResult is what the successor gets of the EXEC's pipeline. conn is
// nil when the pipeline failed on the wire: the successor reads afresh.
type carriedResult struct {
	conn       *redis.Conn
	cmds       []redis.Cmder // the successor's own commands
	err        error         // the first error among cmds
	sent, recv time.Time     // by the local clock
}

// settle moves h from handoverOpen to state. h.mu is held.
func (h *handover) settle(state int) {
	h.state = state
	if h.decided != nil {
		close(h.decided)
	}
}

// waiting reports a hand-over its successor has neither offered nor
// declined.
func (h *handover) waiting() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state == handoverOpen
}

// offer hands the successor's read to the EXEC waiting on node, or
// declines when the hand-over is gone or routes elsewhere.
func (h *handover) offer(node *redis.Client, queue func(context.Context, redis.Pipeliner)) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state != handoverOpen {
		return false
	}
	if node != h.node {
		h.settle(handoverClosed)
		return false
	}
	h.queue = queue
	h.settle(handoverOffered)
	return true
}

// decline closes a hand-over its successor did not take (its flush ended
// without a read).
func (h *handover) decline() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state == handoverOpen {
		h.settle(handoverClosed)
	}
}

// carried offers rr, the first read of a successor's flush, to the EXEC
// before it, and waits for that EXEC's pipeline. offered is false when the
// read was not carried; the result's conn is nil when it was carried on a
// pipeline that failed. Either way, the attempt then reads on its own.
func (e *Engine) carried(ctx context.Context, node *redis.Client, rr *readRound) (_ carriedResult, offered bool) {
	h, _ := ctx.Value(handoverKey{}).(*handover)
	if h == nil || !h.offer(node, rr.queue) {
		return carriedResult{}, false
	}
	// The EXEC's pipeline always answers (its read deadline bounds it), and
	// the connection must not be left behind: the wait ignores ctx.
	return <-h.result, true
}

// execCarrying is exec carrying h, the successor's round trip 1, after
// the EXEC; it hands h its replies, and the connection when the pipeline
// answered in full. handed reports the connection went to the successor:
// the attempt must not touch it again.
func (e *Engine) execCarrying(ctx context.Context, node *redis.Client, conn *redis.Conn, route string, plan *Plan, h *handover) (_ []Result, handed bool, _ error) {
	sent := e.opts.Clock.Local()
	results, tail, whole, err := e.execPipe(ctx, conn, route, plan, func(p redis.Pipeliner) {
		h.queue(ctx, p)
	})
	res := carriedResult{sent: sent, recv: e.opts.Clock.Local()}
	if whole && len(tail) > 0 {
		res.conn, res.cmds, res.err = conn, tail, firstErr(tail)
		forget(ctx, node, conn)
	}
	h.result <- res
	return results, res.conn != nil, err
}

// answered reports a pipeline whose every command got a reply: no error,
// or an error that Redis replied with. The connection is then in step.
func answered(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) && !reply.IsRedisErr(err) {
			return false
		}
	}
	return len(cmds) > 0
}

// handOut asks ctx's succession for a successor whose read can be carried
// behind this EXEC on node: nil when there is none, or when the EXEC must
// end its pipeline (a WAIT for replicas).
func (e *Engine) handOut(ctx context.Context, node *redis.Client) *handover {
	if e.waits() {
		return nil
	}
	s, _ := ctx.Value(successionKey{}).(*succession)
	if s == nil {
		return nil
	}
	return s.pass(node)
}
