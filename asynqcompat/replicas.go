package asynqcompat

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/redis/go-redis/v9"
)

// A move writes to two places that may sit on two masters of a cluster:
// the jobkey queue's keys, through jobkey (which waits for the queue's
// Config.MinReplicas), and the asynq queue's keys with the migration's
// state beside them, in the run's own transactions. Each of those
// transactions ends its round trip with WAIT, sent after EXEC in the same
// pipeline on the connection that ran it, and so on the node that applied
// it. A move takes its next step, in either system, only once the step
// before is confirmed: a failover can then lose only the last step, whole
// (its EXEC writes the step and the asynq keys together), and the state a
// rerun reads agrees with asynq's keys on the promoted replica.

// ErrNotReplicated is jobkey's ErrNotReplicated: a write applied on the
// master that fewer replicas than wanted confirmed in time. A migration
// stops at such a write with a *ReplicationError; errors.Is(err,
// ErrNotReplicated) holds for it and for jobkey's own *ReplicationError
// alike.
var ErrNotReplicated = jobkey.ErrNotReplicated

// ReplicationError is what a migration (Migrate, MigrateToAsynq) returns
// when one of its writes to asynq's keys, its state or its claim of the
// jobkey queue was applied on the master, but fewer than MinReplicas
// replicas confirmed it within ReplicaTimeout. The run stopped there,
// before any step that depends on it. Rerun the migration once the
// replicas are back: it reads its state and goes on from the write if the
// master kept it, or from the step before if a failover lost it.
type ReplicationError struct {
	Queue   string        // the asynq queue
	Task    string        // the task (job) ID whose move made the write; "" for the queue's own (pause, resume, claim)
	Write   string        // what was written, e.g. "delete the waiting asynq task"
	Key     string        // a key of the write: its master is the node that applied it
	Acked   int           // replicas that confirmed in time
	Want    int           // MinReplicas
	Timeout time.Duration // ReplicaTimeout
	Err     error         // why WAIT gave no count (a broken link, an ACL without +wait), or nil
}

func (e *ReplicationError) Error() string {
	what := e.Write
	if e.Task != "" {
		what = fmt.Sprintf("%s for task %q", e.Write, e.Task)
	}
	msg := fmt.Sprintf("asynqcompat: %s (asynq queue %q) was applied on the master of key %q only: %d of %d replicas confirmed it within %v, so a failover may still lose it; the migration stopped there: rerun it once the replicas are back",
		what, e.Queue, e.Key, e.Acked, e.Want, e.Timeout)
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrNotReplicated) hold.
func (e *ReplicationError) Is(target error) bool { return target == ErrNotReplicated }

// Unwrap returns Err.
func (e *ReplicationError) Unwrap() error { return e.Err }

// durability is what each of a run's own writes waits for.
type durability struct {
	replicas    int           // 0: no wait
	timeout     time.Duration // ReplicaTimeout
	readTimeout time.Duration // the client's ReadTimeout; 0 or less: none
}

// maxMinReplicas bounds MinReplicas, as jobkey bounds Config.MinReplicas.
const maxMinReplicas = 64

// durabilityOf resolves a run's MinReplicas and ReplicaTimeout: 0 takes the
// jobkey queue's own, a negative MinReplicas waits for none.
func durabilityOf(rdb redis.UniversalClient, q *jobkey.Queue, replicas int, timeout time.Duration) (durability, error) {
	cfg := q.Config()
	switch {
	case replicas == 0:
		replicas = cfg.MinReplicas
	case replicas < 0:
		replicas = 0
	case replicas > maxMinReplicas:
		return durability{}, fmt.Errorf("MinReplicas is %d, want at most %d", replicas, maxMinReplicas)
	}
	switch {
	case timeout == 0:
		timeout = cfg.ReplicaTimeout
	case timeout < time.Millisecond || timeout > time.Minute:
		return durability{}, fmt.Errorf("ReplicaTimeout is %v, want 1ms..1m", timeout)
	}
	d := durability{replicas: replicas, timeout: timeout}
	switch c := rdb.(type) {
	case *redis.Client:
		d.readTimeout = c.Options().ReadTimeout
	case *redis.ClusterClient:
		d.readTimeout = c.Options().ReadTimeout
	}
	return d, nil
}

func (d durability) on() bool { return d.replicas > 0 }

// firstWait is how long the WAIT in a write's pipeline waits: all of the
// timeout, or half the client's ReadTimeout when that is shorter, since
// go-redis reads a whole pipeline under one ReadTimeout; a WAIT of its own
// (which go-redis gives a read deadline past its timeout) waits for the
// rest.
func (d durability) firstWait() time.Duration {
	if d.readTimeout <= 0 {
		return d.timeout
	}
	return max(min(d.timeout, d.readTimeout/2), time.Millisecond)
}

// writeLabel names a write for its *ReplicationError.
type writeLabel struct {
	queue, task, write string
}

// exec runs MULTI, writes and EXEC on tx's connection and, when d is on,
// WAIT in the same round trip: the WAIT goes to the node that applied the
// EXEC. It returns redis.TxFailedErr when a watched key changed (nothing
// was written), and a *ReplicationError when fewer replicas than wanted
// confirmed the EXEC in time. key is a key of the transaction, for the
// error.
func (d durability) exec(ctx context.Context, tx *redis.Tx, key string, label writeLabel, writes [][]any) error {
	var exec, wait *redis.Cmd
	start := time.Now()
	_, _ = tx.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "multi")
		for _, w := range writes {
			p.Do(ctx, w...)
		}
		exec = p.Do(ctx, "exec")
		if d.on() {
			wait = p.Do(ctx, "wait", d.replicas, max(d.firstWait().Milliseconds(), 1))
		}
		return nil
	})
	switch err := exec.Err(); {
	case errors.Is(err, redis.Nil):
		return redis.TxFailedErr
	case err != nil:
		// EXECABORT (a write refused as it was queued: nothing was
		// written), or no reply: the EXEC may or may not have run.
		return err
	}
	replies, _ := exec.Val().([]any)
	if len(replies) != len(writes) {
		return fmt.Errorf("asynqcompat: EXEC on %s: %d replies to %d writes", key, len(replies), len(writes))
	}
	for _, v := range replies {
		if rerr, ok := v.(redis.Error); ok {
			return rerr
		}
	}
	if !d.on() {
		return nil
	}
	n, err := wait.Int64()
	if left := d.timeout - time.Since(start); err == nil && n < int64(d.replicas) && d.firstWait() < d.timeout && left > 0 {
		n, err = tx.Wait(ctx, d.replicas, max(left, time.Millisecond)).Result()
	}
	if err == nil && n >= int64(d.replicas) {
		return nil
	}
	return &ReplicationError{Queue: label.queue, Task: label.task, Write: label.write, Key: key,
		Acked: int(n), Want: d.replicas, Timeout: d.timeout, Err: err}
}

// write applies writes in one transaction on the node of key, under WATCH
// of key, and waits as exec does; a change to key in between sends it
// again.
func (d durability) write(ctx context.Context, rdb redis.UniversalClient, key string, label writeLabel, writes [][]any) error {
	for range 50 {
		err := rdb.Watch(ctx, func(tx *redis.Tx) error {
			return d.exec(ctx, tx, key, label, writes)
		}, key)
		if !errors.Is(err, redis.TxFailedErr) {
			return err
		}
	}
	return fmt.Errorf("asynqcompat: write %s: too many concurrent changes", key)
}
