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
// and WAIT in one plain pipeline (execPipe); unconfirmed is set when EXEC
// committed and fewer replicas than wanted confirmed it.
func (e *casEngine) execWait(ctx context.Context, conn *redis.Conn, route string, plan *casPlan, values [][]byte) (_ []redis.Cmder, unconfirmed, _ error) {
	var wait *redis.IntCmd
	start := time.Now()
	results, _, err := e.execPipe(ctx, conn, route, plan, values, func(p redis.Pipeliner) {
		e.m.commands.Add(1)
		wait = e.wait(ctx, p)
	})
	if err != nil {
		return results, nil, err
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
