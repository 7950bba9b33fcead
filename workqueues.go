package jobkey

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jobkey/jobkey/internal/weighted"
)

// WeightedQueue is one queue of a WorkQueues, and its weight.
type WeightedQueue struct {
	Queue *Queue
	// Weight is the queue's share of the runners while the queues compete
	// for them: with weights 6, 3 and 1 and jobs in all three, about 60%,
	// 30% and 10% of the runs (1 to MaxQueueWeight).
	Weight int
}

// MaxQueueWeight bounds a WeightedQueue's Weight.
const MaxQueueWeight = 1_000_000

// WorkQueuesOpts configures a WorkQueues.
type WorkQueuesOpts struct {
	// WorkOpts are the options of every queue's Work. Concurrency is the
	// number of handlers that run at once across all the queues; Periodic
	// must be empty (list periodic jobs on a Work of their own queue).
	WorkOpts
	// StrictPriority makes a free runner always take from the queue of the
	// highest weight that has a job due, as asynq's StrictPriority does;
	// a queue of lower weight runs only while those above it have nothing
	// due. Otherwise runners are shared by weight.
	StrictPriority bool
}

// WorkQueues runs h over several queues with one pool of Concurrency
// runners, as asynq's Queues map and River's queue list do. A runner that
// becomes free takes from the queues by weight (or, with StrictPriority,
// from the heaviest one with a job due): a queue with nothing due lends
// its share to the others, so a busy queue alone can use every runner,
// and an idle one makes no claim beyond its runners' polls, which take
// only a runner no busy queue wants. Each queue keeps its own Config:
// pause, concurrency and rate limits per key, backoff, retention and
// MinReplicas.
//
// A runner holds its place in the pool from its claim until its job's
// outcome is recorded. While no other queue wants a runner, a runner
// completes its job and claims the same queue's next in one transaction,
// as Work does; when another queue wins the draw, it completes its job
// alone and the freed runner goes to that queue.
//
// It returns once every queue's Work has returned, with their errors
// joined, under the same shutdown rules as Work. Each queue's metrics
// (Queue.Metrics) count Concurrency runners, of which at most Concurrency
// are busy across all the queues together.
func WorkQueues(ctx context.Context, h Handler, queues []WeightedQueue, opts *WorkQueuesOpts) error {
	if h == nil {
		return fmt.Errorf("%w: WorkQueues with nil handler", ErrInvalid)
	}
	if len(queues) == 0 {
		return fmt.Errorf("%w: WorkQueues with no queue", ErrInvalid)
	}
	var o WorkQueuesOpts
	if opts != nil {
		o = *opts
	}
	if len(o.Periodic) > 0 {
		return fmt.Errorf("%w: WorkQueues with periodic jobs: list them on a Work of their own queue", ErrInvalid)
	}
	type queueName struct{ prefix, name string }
	seen := map[queueName]bool{}
	checked := make([]WorkOpts, len(queues))
	weights := make([]int, len(queues))
	for i, wq := range queues {
		if wq.Queue == nil {
			return fmt.Errorf("%w: WorkQueues: queue %d is nil", ErrInvalid, i)
		}
		if wq.Weight < 1 || wq.Weight > MaxQueueWeight {
			return fmt.Errorf("%w: WorkQueues: queue %q has weight %d, want 1..%d", ErrInvalid, wq.Queue.name, wq.Weight, MaxQueueWeight)
		}
		k := queueName{wq.Queue.cfg.Prefix, wq.Queue.name}
		if seen[k] {
			return fmt.Errorf("%w: WorkQueues: queue %q is listed twice", ErrInvalid, wq.Queue.name)
		}
		seen[k] = true
		wo, err := wq.Queue.workOpts(&o.WorkOpts)
		if err != nil {
			return err
		}
		checked[i], weights[i] = wo, wq.Weight
	}
	gate := weighted.New(checked[0].Concurrency, weights, o.StrictPriority)
	names := make([]string, len(queues))
	for i, wq := range queues {
		names[i] = wq.Queue.name
	}
	errs := make([]error, len(queues))
	var wg sync.WaitGroup
	for i, wq := range queues {
		wg.Go(func() {
			if err := wq.Queue.runWork(ctx, h, checked[i], gate, i, names); err != nil {
				errs[i] = fmt.Errorf("queue %q: %w", wq.Queue.name, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
