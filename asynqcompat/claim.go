package asynqcompat

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/redis/go-redis/v9"
)

// A migration's lock and state are per asynq queue, but its moves hold
// jobs of a jobkey queue too: a run from asynq queue A into jobkey queue Q
// holds jobkey copies in Q at the year 9999, and so does a run from Q back
// to asynq queue B. Each run finishes the moves of its own state, and a
// held job is recognized by its hold, not by its owner; so two asynq
// queues must never have moves under way with one jobkey queue at once.
// A claim key per jobkey queue says which asynq queue's migrations may
// have moves in it: a run takes it after its lock, keeps it while its
// state lists moves with the jobkey queue (after a crash, too), and
// releases it when it ends with none.

// ErrJobkeyQueueBusy is what a migration returns when a migration through
// another asynq queue runs with the same jobkey queue, or stopped with
// moves in it unfinished. The error is a *JobkeyQueueBusyError.
var ErrJobkeyQueueBusy = errors.New("asynqcompat: the jobkey queue has a migration through another asynq queue")

// JobkeyQueueBusyError names the jobkey queue and the asynq queue whose
// migrations hold it. errors.Is(err, ErrJobkeyQueueBusy) is true.
type JobkeyQueueBusyError struct {
	JobkeyQueue string
	AsynqQueue  string // the asynq queue of the migration that holds it
	// Unfinished says that no migration of AsynqQueue runs, but its state
	// lists moves with the jobkey queue, left by a run that stopped: rerun
	// that migration (either direction, the same two queues) to finish
	// them.
	Unfinished bool
}

func (e *JobkeyQueueBusyError) Error() string {
	if e.Unfinished {
		return fmt.Sprintf("asynqcompat: jobkey queue %q has unfinished moves of a stopped migration with asynq queue %q (key %q): rerun that migration first, to finish them",
			e.JobkeyQueue, e.AsynqQueue, stateKey(e.AsynqQueue))
	}
	return fmt.Sprintf("asynqcompat: a migration with asynq queue %q is running on jobkey queue %q: wait for it (or rerun with a wait)", e.AsynqQueue, e.JobkeyQueue)
}

// Is makes errors.Is(err, ErrJobkeyQueueBusy) true.
func (e *JobkeyQueueBusyError) Is(target error) bool { return target == ErrJobkeyQueueBusy }

// claimKey is the Redis key of a jobkey queue's migration claim: its value
// is the asynq queue whose migrations may have moves in the jobkey queue.
func claimKey(q *jobkey.Queue) string {
	k := q.Keys("x").Job
	prefix := k[:max(strings.Index(k, ":{"), 0)]
	return "asynqcompat:jobkey:{" + prefix + "/" + q.Name() + "}:migration"
}

// claimQueue takes the claim of the jobkey queue q for the asynq queue
// whose lock this run holds, waiting up to wait for a running migration
// through another asynq queue to end. A claim held by an asynq queue with
// no migration running and no move with q in its state is stale, and is
// taken over. The claim's write waits for dur's replicas: one a failover
// lost would let another migration claim q while this one runs.
func claimQueue(ctx context.Context, rdb redis.UniversalClient, q *jobkey.Queue, queue string, wait time.Duration, dur durability) error {
	ck := claimKey(q)
	deadline := time.Now().Add(wait)
	for {
		var busy *JobkeyQueueBusyError
		err := rdb.Watch(ctx, func(tx *redis.Tx) error {
			cur, err := tx.Get(ctx, ck).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
			if cur != "" && cur != queue {
				if busy, err = holds(ctx, rdb, cur, q); err != nil || busy != nil {
					return err
				}
			}
			// Always written, even when unchanged: a run through another
			// asynq queue that read the claim before this fails its EXEC
			// and reads it again.
			return dur.exec(ctx, tx, ck, writeLabel{queue: queue, write: fmt.Sprintf("claim jobkey queue %q", q.Name())},
				[][]any{{"set", ck, queue}})
		}, ck)
		switch {
		case errors.Is(err, redis.TxFailedErr):
			continue
		case err != nil:
			return fmt.Errorf("asynqcompat: claim jobkey queue %q: %w", q.Name(), err)
		case busy == nil:
			return nil
		case !time.Now().Before(deadline):
			return busy
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("asynqcompat: wait for jobkey queue %q: %w", q.Name(), context.Cause(ctx))
		case <-time.After(min(100*time.Millisecond, time.Until(deadline))):
		}
	}
}

// holds says whether the migrations of asynq queue other still hold the
// jobkey queue q: one runs (its lock is held), or its state lists a move
// with q (or cannot be read).
func holds(ctx context.Context, rdb redis.UniversalClient, other string, q *jobkey.Queue) (*JobkeyQueueBusyError, error) {
	n, err := rdb.Exists(ctx, lockKey(other)).Result()
	if err != nil {
		return nil, err
	}
	if n > 0 {
		return &JobkeyQueueBusyError{JobkeyQueue: q.Name(), AsynqQueue: other}, nil
	}
	raw, err := rdb.Get(ctx, stateKey(other)).Result()
	st, err := decodeState(other, raw, err)
	if errors.Is(err, ErrStateUnreadable) {
		return &JobkeyQueueBusyError{JobkeyQueue: q.Name(), AsynqQueue: other, Unfinished: true}, nil
	}
	if err != nil {
		return nil, err
	}
	for _, rec := range st.Moves {
		if rec.JobkeyQueue == q.Name() {
			return &JobkeyQueueBusyError{JobkeyQueue: q.Name(), AsynqQueue: other, Unfinished: true}, nil
		}
	}
	return nil, nil
}

// unclaimQueue releases the claim of q by asynq queue queue, when its
// state lists no move with q any more.
func unclaimQueue(ctx context.Context, s *stateStore, q *jobkey.Queue) error {
	ck := claimKey(q)
	st, err := s.read(ctx)
	if err != nil {
		return err
	}
	for _, rec := range st.Moves {
		if rec.JobkeyQueue == q.Name() {
			return nil
		}
	}
	err = s.rdb.Watch(ctx, func(tx *redis.Tx) error {
		cur, err := tx.Get(ctx, ck).Result()
		if errors.Is(err, redis.Nil) || (err == nil && cur != s.queue) {
			return nil
		}
		if err != nil {
			return err
		}
		return s.dur.exec(ctx, tx, ck, writeLabel{queue: s.queue, write: fmt.Sprintf("release the claim of jobkey queue %q", q.Name())},
			[][]any{{"del", ck}})
	}, ck)
	if errors.Is(err, redis.TxFailedErr) {
		return nil // taken over meanwhile: no longer this run's
	}
	return err
}
