package jobkey

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// With Config.MinReplicas set, every transaction that writes ends its
// round trip with WAIT: MULTI, the writes, EXEC, then WAIT MinReplicas
// ReplicaTimeout, all in one pipeline, so waiting costs no round trip of
// its own. A call that answers from a write it recognises as its own (a
// retried Complete, an Enqueue that finds its job) makes a small write of
// its own before its WAIT: from Redis 7.2 on, and on Valkey, WAIT counts
// only the offset of the connection's own last propagated write, so a bare
// WAIT on a connection that wrote nothing would confirm nothing.

// ErrNotReplicated reports a write that Redis applied on the master but
// that fewer than Config.MinReplicas replicas confirmed within
// Config.ReplicaTimeout: it is not yet safe from a failover. The error is
// a *ReplicationError. Calling again with the same job (the same ID) is
// safe: an Enqueue gets ErrJobExists, and a Complete, Fail or Release
// recognises its own write; either then waits for the replicas again.
var ErrNotReplicated = errors.New("jobkey: write not confirmed by enough replicas")

// ReplicationError is the detail behind ErrNotReplicated: the write was
// applied on the master, and Acked of the Want replicas confirmed it
// within Timeout. It is not yet safe: a failover before the replicas catch
// up may lose it. Call again with the same ID.
type ReplicationError struct {
	Key     string        // a key of the transaction (its routing key)
	Acked   int           // replicas that confirmed in time
	Want    int           // Config.MinReplicas
	Timeout time.Duration // Config.ReplicaTimeout
	Err     error         // why WAIT gave no count (a broken link, an ACL without +wait), or nil
}

func (e *ReplicationError) Error() string {
	msg := fmt.Sprintf("jobkey: write to %s applied on the master, but confirmed by %d of %d replicas within %v: not yet safe from a failover; call again with the same ID",
		e.Key, e.Acked, e.Want, e.Timeout)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrNotReplicated) hold.
func (e *ReplicationError) Is(target error) bool { return target == ErrNotReplicated }

// Unwrap returns Err.
func (e *ReplicationError) Unwrap() error { return e.Err }

// durability is what a write waits for before it is answered. Redis 7.2's
// WAITAOF would add a local fsync level beside replicas (WAITAOF numlocal
// numreplicas timeout), sent in the same place as WAIT is now.
type durability struct {
	replicas int           // Config.MinReplicas; 0: no wait
	timeout  time.Duration // Config.ReplicaTimeout
}

func (d durability) on() bool { return d.replicas > 0 }

// execWait is exec when writes wait for replicas: MULTI, the writes, EXEC
// and WAIT in one plain pipeline, since go-redis's transaction pipeline
// ends at EXEC. Its replies are handed back as a transaction pipeline's
// would be, one *redis.Cmd per step; unconfirmed is set when EXEC
// committed and fewer replicas than wanted confirmed it.
func (e *casEngine) execWait(ctx context.Context, conn *redis.Conn, route string, plan *casPlan, values [][]byte) (_ []redis.Cmder, unconfirmed, _ error) {
	args := make([][]any, 0, len(plan.writes)+len(plan.aux)+len(plan.steps))
	for i, w := range plan.writes {
		args = append(args, setArgs(w.key, values[i], w.ttl))
	}
	for _, w := range plan.aux {
		if w.val == nil {
			args = append(args, []any{"del", w.key})
		} else {
			args = append(args, setArgs(w.key, w.val, w.ttl))
		}
	}
	args = append(args, plan.steps...)
	e.m.roundTrips.Add(1)
	e.m.commands.Add(int64(3 + len(args)))
	queued := make([]*redis.Cmd, len(args))
	var exec *redis.Cmd
	var wait *redis.IntCmd
	start := time.Now()
	sent, perr := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "multi")
		for i, a := range args {
			queued[i] = p.Do(ctx, a...)
		}
		exec = p.Do(ctx, "exec")
		wait = e.wait(ctx, p)
		return nil
	})
	results := make([]redis.Cmder, len(args))
	cmds := make([]*redis.Cmd, len(args))
	for i, a := range args {
		cmds[i] = redis.NewCmd(ctx, a...)
		results[i] = cmds[i]
	}
	if err := unanswered(sent, perr); err != nil {
		return results, nil, err // nothing was sent, and nothing answered
	}
	xerr := exec.Err()
	switch {
	case xerr == nil:
	case errors.Is(xerr, redis.Nil):
		// EXEC found a watched key changed and wrote nothing.
		for _, c := range cmds {
			c.SetErr(redis.TxFailedErr)
		}
		return results, nil, redis.TxFailedErr
	case isRedisErr(xerr):
		// EXECABORT: a step was refused as it was queued (a slot that
		// moved, a command the ACL denies); nothing was written.
		for i, c := range cmds {
			if qerr := queued[i].Err(); qerr != nil {
				c.SetErr(qerr)
			} else {
				c.SetErr(xerr)
			}
		}
		return results, nil, xerr
	default:
		// No reply to EXEC: it may or may not have run.
		for _, c := range cmds {
			c.SetErr(xerr)
		}
		return results, nil, xerr
	}
	replies, _ := exec.Val().([]any)
	if len(replies) != len(cmds) {
		return results, nil, fmt.Errorf("jobkey: exec %s: %d replies to %d steps", route, len(replies), len(cmds))
	}
	var first error
	for i, v := range replies {
		if rerr, ok := v.(redis.Error); ok {
			cmds[i].SetErr(rerr)
			if first == nil {
				first = rerr
			}
			continue
		}
		cmds[i].SetVal(v)
	}
	if first != nil {
		return results, nil, first // a StepError: some steps applied, some not
	}
	return results, e.replicated(ctx, conn, route, wait, start), nil
}

// confirm is the round trip of a call that answers from a write it
// recognised as its own, instead of the UNWATCH of a decision that writes
// nothing: UNWATCH, a small write of the connection's own (a key beside
// route, in its slot, that expires by itself), and WAIT. It reports
// whether the connection answered.
func (e *casEngine) confirm(ctx context.Context, conn *redis.Conn, route string) (healthy bool, _ error) {
	e.m.unwatches.Add(1)
	e.m.roundTrips.Add(1)
	e.m.commands.Add(3)
	var unwatch *redis.Cmd
	var set *redis.StatusCmd
	var wait *redis.IntCmd
	sent := time.Now()
	_, _ = conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		unwatch = p.Do(ctx, "unwatch")
		set = p.Set(ctx, syncKey(route), "1", time.Minute)
		wait = e.wait(ctx, p)
		return nil
	})
	healthy = unwatch.Err() == nil && (wait.Err() == nil || isRedisErr(wait.Err()))
	if err := set.Err(); err != nil {
		return healthy, &ReplicationError{Key: route, Want: e.dur.replicas, Timeout: e.dur.timeout,
			Err: fmt.Errorf("write of its own before WAIT: %w", err)}
	}
	return healthy, e.replicated(ctx, conn, route, wait, sent)
}

// wait queues WAIT on p, for as long as the pipeline's read deadline
// allows (firstWait).
func (e *casEngine) wait(ctx context.Context, p redis.Pipeliner) *redis.IntCmd {
	cmd := redis.NewIntCmd(ctx, "wait", e.dur.replicas, max(e.firstWait().Milliseconds(), 1))
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
func (e *casEngine) firstWait() time.Duration {
	rt := e.readTimeout
	if rt <= 0 {
		return e.dur.timeout // no read deadline
	}
	return max(min(e.dur.timeout, rt/2), time.Millisecond)
}

// replicated turns the reply of the WAIT sent at start into nil, or the
// *ReplicationError of a write fewer replicas than wanted confirmed within
// ReplicaTimeout; when that WAIT was cut short to fit the pipeline's read
// deadline, a WAIT of its own on conn waits for the rest.
func (e *casEngine) replicated(ctx context.Context, conn *redis.Conn, route string, wait *redis.IntCmd, start time.Time) error {
	n, err := wait.Result()
	if left := e.dur.timeout - time.Since(start); err == nil && n < int64(e.dur.replicas) && e.firstWait() < e.dur.timeout && left > 0 {
		e.m.roundTrips.Add(1)
		e.m.commands.Add(1)
		n, err = conn.Wait(ctx, e.dur.replicas, max(left, time.Millisecond)).Result()
	}
	if err == nil && n >= int64(e.dur.replicas) {
		return nil
	}
	return &ReplicationError{Key: route, Acked: int(n), Want: e.dur.replicas, Timeout: e.dur.timeout, Err: err}
}

// setArgs is SET key val, with PX ttl when ttl > 0.
func setArgs(key string, val []byte, ttl time.Duration) []any {
	if ttl > 0 {
		return []any{"set", key, val, "px", max(ttl.Milliseconds(), 1)}
	}
	return []any{"set", key, val}
}

// readTimeoutOf returns the ReadTimeout of rdb's connections: 0 or less
// means none.
func readTimeoutOf(rdb redis.UniversalClient) time.Duration {
	switch c := rdb.(type) {
	case *redis.Client:
		return c.Options().ReadTimeout
	case *redis.ClusterClient:
		return c.Options().ReadTimeout
	}
	return 0
}
