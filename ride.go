package jobkey

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A ride carries the next batch's round trip 1 behind this batch's EXEC,
// on the same pinned connection: a busy group-commit leader then pays one
// round trip per batch, not two.
//
// Just before a flush sends its EXEC, the engine asks the flush's relay
// for a successor: when calls are queued, the group takes them as the next
// batch and starts its flush on a goroutine of its own, which becomes the
// group's leader. That flush builds its first transaction as it always
// does and, instead of sending its WATCH and reads on a connection of its
// own, hands them to the ride. The EXEC's pipeline carries them after the
// EXEC: Redis runs them once the EXEC has run, so the next batch reads
// committed state under its own WATCH, and its type checks still come
// before its MULTI. The connection then passes to the successor, whose
// decision and EXEC follow on it.
//
// The ride is only an arrangement of round trips, never of decisions:
//   - The successor's read is what a read of its own would have been, sent
//     after the EXEC on the connection the EXEC cleared (an EXEC clears
//     every WATCH, whether it committed or not).
//   - When the EXEC's pipeline fails on the wire, the successor reads
//     again on a connection of its own: nothing was decided on what it
//     queued. The connection, which may still watch the successor's keys,
//     is unwatched and not kept.
//   - A flush whose callers all gave up while its successor got ready
//     sends no EXEC; the successor reads on its own.
//   - A successor that does not reach a read within rideWait, or whose
//     first transaction routes to another node, or that has nothing to do,
//     declines; the EXEC goes alone, and the successor reads as it would
//     have.
//   - A transaction that waits for replicas (Config.MinReplicas) carries
//     no ride: its WAIT ends its pipeline.

// rideWait bounds how long an EXEC waits for its successor's read. The
// successor is started on the leader's processor and usually reads within
// microseconds; the bound only keeps a slow one from holding back the
// batch whose EXEC is ready.
const rideWait = 500 * time.Microsecond

// relay is a flush's way to hand its connection on: pass is called by the
// engine before an EXEC, and starts the successor at most once per flush.
type relay struct {
	start func(*ride) bool // takes the next batch and starts its flush; false when none is queued
	mu    sync.Mutex
	done  bool // a successor was started: it leads the group now
}

type relayKey struct{}

// passed reports whether the flush started a successor.
func (o *relay) passed() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.done
}

// pass starts a successor for a read on node, and returns its ride when
// the successor offered its read, else nil.
func (o *relay) pass(node *redis.Client) *ride {
	o.mu.Lock()
	if o.done {
		o.mu.Unlock()
		return nil
	}
	r := &ride{node: node, result: make(chan rideResult, 1)}
	if !o.start(r) {
		o.mu.Unlock()
		return nil
	}
	o.done = true
	o.mu.Unlock()
	// The successor usually runs at once on this processor and offers
	// within microseconds: yielding costs less than a timer.
	deadline := time.Now().Add(rideWait)
	for r.waiting() && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == rideOpen {
		r.close()
	}
	if r.state != rideOffered {
		return nil
	}
	return r
}

// ride states.
const (
	rideOpen    = iota // the successor has not read yet
	rideOffered        // the successor's read waits in queue for the EXEC
	rideClosed         // the successor reads on its own
)

// ride is one hand-over from a flush to its successor.
type ride struct {
	node  *redis.Client // the connection's node: a read routed elsewhere declines
	mu    sync.Mutex
	state int
	// queue appends the successor's round trip 1 to the EXEC's pipeline.
	queue func(ctx context.Context, p redis.Pipeliner)
	// result is sent exactly once when the successor offered.
	result chan rideResult
}

type rideKey struct{}

// rideResult is what the successor gets of the EXEC's pipeline. conn is
// nil when the pipeline failed on the wire: the successor reads afresh.
type rideResult struct {
	conn       *redis.Conn
	cmds       []redis.Cmder // the successor's own commands
	err        error         // the first error among cmds
	sent, recv time.Time     // by the local clock
}

func (r *ride) close() { r.state = rideClosed }

// waiting reports a ride its successor has neither offered nor declined.
func (r *ride) waiting() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state == rideOpen
}

// offer hands the successor's read to the EXEC waiting on node, or
// declines when the ride is gone or routes elsewhere.
func (r *ride) offer(node *redis.Client, queue func(context.Context, redis.Pipeliner)) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state != rideOpen {
		return false
	}
	if node != r.node {
		r.close()
		return false
	}
	r.queue = queue
	r.state = rideOffered
	return true
}

// decline closes a ride its successor did not take (its flush ended
// without a read).
func (r *ride) decline() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.state == rideOpen {
		r.close()
	}
}

// rideIn offers rr, the first read of a successor's flush, to the EXEC
// before it, and waits for that EXEC's pipeline. offered is false when the
// read did not ride; the result's conn is nil when it rode on a pipeline
// that failed. Either way, the attempt then reads on its own.
func (e *casEngine) rideIn(ctx context.Context, node *redis.Client, rr *readRound) (_ rideResult, offered bool) {
	r, _ := ctx.Value(rideKey{}).(*ride)
	if r == nil || !r.offer(node, rr.queue) {
		return rideResult{}, false
	}
	// The EXEC's pipeline always answers (its read deadline bounds it), and
	// the connection must not be left behind: the wait ignores ctx.
	return <-r.result, true
}

// execRide is exec carrying r, the successor's round trip 1, after the
// EXEC; it hands r its replies, and the connection when the pipeline
// answered in full. handed reports the connection went to the successor:
// the attempt must not touch it again.
func (e *casEngine) execRide(ctx context.Context, node *redis.Client, conn *redis.Conn, route string, plan *casPlan, values [][]byte, r *ride) (_ []redis.Cmder, handed bool, _ error) {
	var n int
	sent := e.clock.Local()
	results, all, err := e.execPipe(ctx, conn, route, plan, values, func(p redis.Pipeliner) {
		n = p.Len()
		r.queue(ctx, p)
	})
	if unanswered(all, err) != nil {
		all = nil // nothing was sent: no command's result is a reply
	}
	res := rideResult{sent: sent, recv: e.clock.Local()}
	if answered(all) && len(all) >= n {
		res.conn, res.cmds = conn, all[n:]
		for _, c := range res.cmds {
			if c.Err() != nil {
				res.err = c.Err()
				break
			}
		}
		e.forget(ctx, node, conn)
	}
	r.result <- res
	return results, res.conn != nil, err
}

// answered reports a pipeline whose every command got a reply: no error,
// or an error that Redis replied with. The connection is then in step.
func answered(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) && !isRedisErr(err) {
			return false
		}
	}
	return len(cmds) > 0
}

// forget takes conn out of ctx's cache without closing it: it is another
// flush's now.
func (e *casEngine) forget(ctx context.Context, node *redis.Client, conn *redis.Conn) {
	if c, _ := ctx.Value(connCacheKey{}).(*connCache); c != nil && c.conns[node] == conn {
		delete(c.conns, node)
	}
}

// adopt puts conn, handed over by a ride, in ctx's cache, so the flush's
// later transactions on node go on using it.
func (e *casEngine) adopt(ctx context.Context, node *redis.Client, conn *redis.Conn) {
	c, _ := ctx.Value(connCacheKey{}).(*connCache)
	if c == nil {
		return
	}
	if _, ok := c.conns[node]; ok {
		return
	}
	if c.conns == nil {
		c.conns = map[*redis.Client]*redis.Conn{}
	}
	c.conns[node] = conn
}

// rideOut asks ctx's relay for a successor whose read can ride this EXEC
// on node: nil when there is none, or when the EXEC must end its pipeline
// (a WAIT for replicas).
func (e *casEngine) rideOut(ctx context.Context, node *redis.Client) *ride {
	if e.dur.on() {
		return nil
	}
	o, _ := ctx.Value(relayKey{}).(*relay)
	if o == nil {
		return nil
	}
	return o.pass(node)
}
