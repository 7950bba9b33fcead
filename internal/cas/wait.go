package cas

import (
	"context"
	"fmt"
	"time"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// With Options.MinReplicas set, every transaction that writes ends its
// round trip with WAIT: MULTI, the writes, EXEC, then WAIT MinReplicas
// ReplicaTimeout, all in one pipeline, so waiting costs no round trip of
// its own. A call that answers from a write it recognised as its own
// (Plan.Confirm) makes a small write of its own before its WAIT: from
// Redis 7.2 on, and on Valkey, WAIT counts only the offset of the
// connection's own last propagated write, so a bare WAIT on a connection
// that wrote nothing would confirm nothing. Redis 7.2's WAITAOF would add
// a local fsync level beside replicas, sent in the same place.

// waits reports whether writes wait for replicas.
func (e *Engine) waits() bool { return e.opts.MinReplicas > 0 }

// execWait is exec when writes wait for replicas: MULTI, the writes, EXEC
// and WAIT in one plain pipeline (execPipe); unconfirmed is set when EXEC
// committed and fewer replicas than wanted confirmed it.
func (e *Engine) execWait(ctx context.Context, conn *redis.Conn, route string, plan *Plan) (_ []Result, unconfirmed, _ error) {
	var wait *redis.IntCmd
	start := time.Now()
	results, _, _, err := e.execPipe(ctx, conn, route, plan, func(p redis.Pipeliner) {
		e.c.commands.Add(1)
		wait = e.wait(ctx, p)
	})
	if err != nil {
		return results, nil, err
	}
	return results, e.replicated(ctx, conn, route, wait, start), nil
}

// confirm is the round trip of a call that answers from a write it
// recognised as its own, instead of the UNWATCH of a decision that writes
// nothing: UNWATCH, a small write of the connection's own (Options.SyncKey,
// which expires by itself), and WAIT. It reports whether the connection
// answered.
func (e *Engine) confirm(ctx context.Context, conn *redis.Conn, route string) (healthy bool, _ error) {
	e.c.unwatches.Add(1)
	e.c.roundTrips.Add(1)
	e.c.commands.Add(3)
	var unwatch *redis.Cmd
	var set *redis.StatusCmd
	var wait *redis.IntCmd
	sent := time.Now()
	_, _ = conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		unwatch = p.Do(ctx, "unwatch")
		set = p.Set(ctx, e.opts.SyncKey(route), "1", time.Minute)
		wait = e.wait(ctx, p)
		return nil
	})
	healthy = unwatch.Err() == nil && (wait.Err() == nil || reply.IsRedisErr(wait.Err()))
	if err := set.Err(); err != nil {
		return healthy, &ReplicationError{Key: route, Want: e.opts.MinReplicas, Timeout: e.opts.ReplicaTimeout,
			Err: fmt.Errorf("write of its own before WAIT: %w", err)}
	}
	return healthy, e.replicated(ctx, conn, route, wait, sent)
}

// wait queues WAIT on p, for as long as the pipeline's read deadline
// allows (firstWait).
func (e *Engine) wait(ctx context.Context, p redis.Pipeliner) *redis.IntCmd {
	cmd := redis.NewIntCmd(ctx, "wait", e.opts.MinReplicas, max(e.firstWait().Milliseconds(), 1))
	_ = p.Process(ctx, cmd)
	return cmd
}

// firstWait is how long the WAIT in a write's pipeline waits: all of
// ReplicaTimeout, or half the client's ReadTimeout when that is shorter.
// go-redis reads a whole pipeline under one deadline, ReadTimeout, so a
// longer WAIT there would end in an i/o timeout; what is left of
// ReplicaTimeout is waited for by a WAIT of its own (replicated), which
// go-redis gives a read deadline of its timeout and more, as it does every
// blocking command. A write whose replicas answer within firstWait, the
// usual case, costs no round trip more.
func (e *Engine) firstWait() time.Duration {
	rt := e.readTimeout
	if rt <= 0 {
		return e.opts.ReplicaTimeout // no read deadline
	}
	return max(min(e.opts.ReplicaTimeout, rt/2), time.Millisecond)
}

// replicated turns the reply of the WAIT sent at start into nil, or the
// *ReplicationError of a write fewer replicas than wanted confirmed within
// ReplicaTimeout; when that WAIT was cut short to fit the pipeline's read
// deadline, a WAIT of its own on conn waits for the rest.
func (e *Engine) replicated(ctx context.Context, conn *redis.Conn, route string, wait *redis.IntCmd, start time.Time) error {
	want := e.opts.MinReplicas
	n, err := wait.Result()
	if left := e.opts.ReplicaTimeout - time.Since(start); err == nil && n < int64(want) && e.firstWait() < e.opts.ReplicaTimeout && left > 0 {
		e.c.roundTrips.Add(1)
		e.c.commands.Add(1)
		n, err = conn.Wait(ctx, want, max(left, time.Millisecond)).Result()
	}
	if err == nil && n >= int64(want) {
		return nil
	}
	return &ReplicationError{Key: route, Acked: int(n), Want: want, Timeout: e.opts.ReplicaTimeout, Err: err}
}
