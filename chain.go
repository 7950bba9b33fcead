package jobkey

import (
	"context"
	"fmt"
)

// MaxChainSteps bounds the steps of one chain. A step that ends without
// running (its condition failed) ends the next in the same EXEC, one round
// trip per step (cas.MaxMoreRounds bounds them), so a chain that fails at
// its first step is ended whole by that step's outcome.
const MaxChainSteps = 16

// ChainOpts are the options of EnqueueChain. A nil *ChainOpts means all
// defaults.
type ChainOpts struct {
	// Condition says when a step runs: once the step before it succeeded
	// (BatchAllSucceeded, the default), or once it finished, however
	// (BatchAllFinished).
	Condition BatchCondition
}

// EnqueueChain stores a chain of jobs, each of which starts only once the
// one before it has succeeded (or finished: opts.Condition), in one
// compare-and-set of two round trips. It returns the steps' job IDs.
//
// The first step is enqueued now. Each later step i is the callback of a
// batch whose one job is step i-1, and whose ID is step i's: it is written
// by the EXEC that writes step i-1's outcome, pending, or canceled when
// step i-1 did not succeed (its LastError says which batch). A canceled
// step counts as canceled in the batch of the step after it, in the same
// EXEC, so a chain whose first step fails is ended whole by that failure:
// it never hangs. Queue.Batch(ctx, ids[i]) shows step i's batch.
//
// All steps live in one shard (as a batch's jobs do): an ID of the
// caller's must be in the shard of the others (Queue.IDFor(ids[0], base)),
// and a generated one is drawn there. Steps after the first take no
// UniqueBy, IfExists, RunAt or Delay. 2 to MaxChainSteps steps.
func (q *Queue) EnqueueChain(ctx context.Context, steps []JobSpec, opts *ChainOpts) ([]string, error) {
	cond := BatchAllSucceeded
	if opts != nil && opts.Condition != 0 {
		cond = opts.Condition
	}
	if cond != BatchAllFinished && cond != BatchAllSucceeded {
		return nil, fmt.Errorf("%w: chain Condition is %d", ErrInvalid, cond)
	}
	if len(steps) < 2 || len(steps) > min(MaxChainSteps, q.cfg.MaxBatch) {
		return nil, fmt.Errorf("%w: a chain of %d steps, want 2..%d", ErrInvalid, len(steps), min(MaxChainSteps, q.cfg.MaxBatch))
	}
	cbs := make([]*Job, len(steps))
	shard := -1
	for i := 1; i < len(steps); i++ {
		given := steps[i].Opts != nil && steps[i].Opts.ID != ""
		cb, err := q.newCallback(ctx, steps[i], "")
		if err != nil {
			return nil, wrapf(err, "chain step %d", i)
		}
		if shard < 0 {
			shard = q.ks.shardOf(cb.ID)
		}
		if err := q.placeIn(cb, given, shard); err != nil {
			return nil, wrapf(err, "chain step %d", i)
		}
		cbs[i] = cb
	}
	first, err := q.newBatchJob(ctx, steps[0], shard, cbs[1].ID)
	if err != nil {
		return nil, wrapf(err, "chain step 0")
	}
	ids := make([]string, len(steps))
	ids[0] = first.job.ID
	seen := map[string]bool{ids[0]: true}
	for i := 1; i < len(steps); i++ {
		ids[i] = cbs[i].ID
		if seen[ids[i]] {
			return nil, fmt.Errorf("%w: chain step %d: ID %q is repeated in the chain", ErrInvalid, i, ids[i])
		}
		seen[ids[i]] = true
	}
	bs := make([]*Batch, 0, len(steps)-1)
	for i := 1; i < len(steps); i++ {
		if i+1 < len(steps) {
			cbs[i].Batch = ids[i+1]
		}
		b := &Batch{ID: ids[i], Queue: q.name, Total: 1, Pending: 1, Condition: cond, Callback: cbs[i]}
		if i >= 2 {
			b.After = ids[i-1]
		}
		bs = append(bs, b)
	}
	if _, err := q.createBatches(ctx, shard, []*enqueueIn{first}, bs); err != nil {
		return ids, err
	}
	return ids, nil
}

// placeIn puts j in shard: a generated ID is drawn again there; an ID of
// the caller's, or one its ConcurrencyKey placed, must be there already.
func (q *Queue) placeIn(j *Job, given bool, shard int) error {
	switch {
	case q.ks.shardOf(j.ID) == shard:
		return nil
	case j.ConcurrencyKey != "":
		return fmt.Errorf("%w: concurrency key %q is not in the shard of the other jobs (the queue has %d shards)", ErrInvalid, j.ConcurrencyKey, q.ks.shards)
	case given:
		return fmt.Errorf("%w: job ID %q is not in the shard of the other jobs (the queue has %d shards): use Queue.IDFor", ErrInvalid, j.ID, q.ks.shards)
	}
	for q.ks.shardOf(j.ID) != shard {
		j.ID = NewID()
	}
	return nil
}
