package jobkey

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// A batch is a set of jobs and one callback job that is enqueued once all
// of them have finished (docs/design.md, section 16). Its value, one key
// beside its jobs in their shard, counts them: pending, succeeded, failed,
// canceled. The EXEC that writes a job's final outcome also writes the
// count, and when it is the last, the callback, so the callback is
// enqueued exactly once: never early, never twice, never not at all.

// BatchCondition says when a batch's callback runs.
type BatchCondition uint8

// The conditions of a batch. Their values are stored and never renumbered.
const (
	// BatchAllFinished runs the callback once every job of the batch has
	// finished, however (the default of EnqueueBatch).
	BatchAllFinished BatchCondition = 1
	// BatchAllSucceeded runs the callback only if every job succeeded;
	// otherwise the callback is written canceled, its LastError naming the
	// counts, when the last job finishes (the default of EnqueueChain).
	BatchAllSucceeded BatchCondition = 2
)

// BatchFired says whether and how a batch's callback was written.
type BatchFired uint8

// How a batch fired. Their values are stored and never renumbered.
const (
	BatchNotFired BatchFired = 0 // jobs are still pending or active
	// BatchFiredEnqueued: the callback was enqueued, pending.
	BatchFiredEnqueued BatchFired = 1
	// BatchFiredCanceled: the condition failed (BatchAllSucceeded with a
	// job failed or canceled); the callback was written canceled.
	BatchFiredCanceled BatchFired = 2
	// BatchFiredTaken: a job already held the callback's ID (written
	// outside the batch); it was left as it was, and nothing was written.
	BatchFiredTaken BatchFired = 3
)

// String returns the fired state's lower-case name.
func (f BatchFired) String() string {
	switch f {
	case BatchNotFired:
		return "waiting"
	case BatchFiredEnqueued:
		return "enqueued"
	case BatchFiredCanceled:
		return "canceled"
	case BatchFiredTaken:
		return "taken"
	}
	return fmt.Sprintf("fired(%d)", uint8(f))
}

// Batch is a batch's stored value.
type Batch struct {
	ID    string // the batch's ID, which is also its callback job's ID
	Queue string
	// Total is the number of jobs the batch was made with.
	Total int
	// Pending counts the jobs not finished yet (pending or active, or, in
	// a chain, the one job still to be written by the step before);
	// Succeeded, Failed and Canceled count the finished ones by outcome.
	// A job deleted before it finished counts as canceled; one retried
	// after it finished counts as pending again.
	Pending, Succeeded, Failed, Canceled int
	Condition                            BatchCondition
	// Callback is the job enqueued under the batch's ID when the batch
	// fires: its type, payload and options (State, times and Rev are set
	// then). Until then its RunAt, when set, is the latest end of the
	// lease of a run of a job counted finished while that run may have
	// gone on (canceled while it ran): the callback is not due before it.
	Callback *Job
	Fired    BatchFired
	FiredAt  time.Time // when it fired, by Redis's clock
	// CreatedAt is when the batch was made, by Redis's clock.
	CreatedAt time.Time
	// After, in a chain, is the batch whose callback is this batch's one
	// job: until that one fires, the job is pending here but not written.
	After string
	Rev   uint64 // revision, bumped by every write

	future futureFields
}

// Done reports whether every job of the batch has finished.
func (b *Batch) Done() bool { return b.Pending == 0 }

// BatchOpts are the options of EnqueueBatch. A nil *BatchOpts means all
// defaults.
type BatchOpts struct {
	// ID is the batch's ID, which is also its callback's job ID. Enqueueing
	// a batch whose ID is taken writes nothing and returns the stored batch
	// with ErrBatchExists, so a call whose outcome was unknown can be made
	// again (default: the callback's Opts.ID, else a new ULID).
	ID string
	// Condition says when the callback runs (default: BatchAllFinished).
	Condition BatchCondition
}

// ErrBatchExists reports an EnqueueBatch or EnqueueChain whose batch ID is
// taken: the stored batch is returned beside it, and nothing was written.
var ErrBatchExists = errors.New("jobkey: batch already exists")

// ErrBatchNotFound reports that no batch exists under the given ID (it
// was never made, or its value expired after it fired).
var ErrBatchNotFound = errors.New("jobkey: batch not found")

// EnqueueBatch stores jobs and a batch that enqueues callback once all of
// them have finished (opts.Condition), in one compare-and-set of two round
// trips: the batch and every job are written together, or nothing is.
//
// The batch's jobs live in one shard, the shard of its ID, beside the
// batch's value, so that the transaction that finishes any of them can
// count it there (on a cluster: one hash slot, one master; see
// docs/design.md, section 16). A job ID of the caller's must be in that
// shard (Queue.IDFor(batchID, base) makes one); a generated one is drawn
// there. A job's ConcurrencyKey must hash to that shard too.
//
// callback is enqueued under the batch's ID: its Opts.ID must be empty or
// that ID; UniqueBy, IfExists, RunAt and Delay are refused. At most
// Config.MaxBatch jobs; a taken job ID, or the batch's own taken by a job,
// refuses the whole batch with a *JobExistsError naming it.
//
// It returns the batch as written and its jobs' IDs, jobs[i]'s at i. A
// batch whose ID is taken returns the stored batch with ErrBatchExists and
// no IDs: the stored batch's jobs may not be these.
func (q *Queue) EnqueueBatch(ctx context.Context, jobs []JobSpec, callback JobSpec, opts *BatchOpts) (*Batch, []string, error) {
	o := BatchOpts{}
	if opts != nil {
		o = *opts
	}
	switch o.Condition {
	case 0:
		o.Condition = BatchAllFinished
	case BatchAllFinished, BatchAllSucceeded:
	default:
		return nil, nil, fmt.Errorf("%w: batch Condition is %d", ErrInvalid, o.Condition)
	}
	if len(jobs) == 0 || len(jobs) > q.cfg.MaxBatch {
		return nil, nil, fmt.Errorf("%w: a batch of %d jobs, want 1..%d (Config.MaxBatch)", ErrInvalid, len(jobs), q.cfg.MaxBatch)
	}
	cb, err := q.newCallback(ctx, callback, o.ID)
	if err != nil {
		return nil, nil, err
	}
	shard := q.ks.shardOf(cb.ID)
	ins := make([]*enqueueIn, len(jobs))
	seen := map[string]bool{cb.ID: true}
	for i, spec := range jobs {
		in, err := q.newBatchJob(ctx, spec, shard, cb.ID)
		if err != nil {
			return nil, nil, wrapf(err, "batch job %d", i)
		}
		if seen[in.job.ID] {
			return nil, nil, fmt.Errorf("%w: batch job %d: ID %q is repeated in the batch, or is the batch's", ErrInvalid, i, in.job.ID)
		}
		seen[in.job.ID] = true
		ins[i] = in
	}
	b := &Batch{ID: cb.ID, Queue: q.name, Total: len(jobs), Pending: len(jobs), Condition: o.Condition, Callback: cb}
	out, err := q.createBatches(ctx, shard, ins, []*Batch{b})
	if err != nil {
		return out, nil, err
	}
	ids := make([]string, len(ins))
	for i, in := range ins {
		ids[i] = in.job.ID
	}
	return out, ids, nil
}

// newCallback validates a batch's callback, with the batch's ID: id, else
// the callback's own Opts.ID, else a new one (in the shard of its
// ConcurrencyKey).
func (q *Queue) newCallback(ctx context.Context, spec JobSpec, id string) (*Job, error) {
	o := EnqueueOpts{}
	if spec.Opts != nil {
		o = *spec.Opts
	}
	switch {
	case o.ID != "" && id != "" && o.ID != id:
		return nil, fmt.Errorf("%w: the callback's ID %q is not the batch's %q", ErrInvalid, o.ID, id)
	case o.UniqueBy != nil, o.IfExists != IfExistsRefuse, !o.RunAt.IsZero(), o.Delay != 0:
		return nil, fmt.Errorf("%w: a batch's callback takes no UniqueBy, IfExists, RunAt or Delay", ErrInvalid)
	}
	if id != "" {
		o.ID = id
	}
	spec.Opts = &o
	in, err := q.newJob(ctx, spec)
	if err != nil {
		return nil, wrapf(err, "batch callback")
	}
	j := in.job
	j.CreatedAt, j.UpdatedAt, j.RunAt = time.Time{}, time.Time{}, time.Time{}
	return j, nil
}

// newBatchJob validates one job of a batch whose jobs live in shard.
func (q *Queue) newBatchJob(ctx context.Context, spec JobSpec, shard int, batch string) (*enqueueIn, error) {
	given := spec.Opts != nil && (spec.Opts.ID != "" || spec.Opts.UniqueBy != nil)
	if spec.Opts != nil && spec.Opts.IfExists != IfExistsRefuse {
		return nil, fmt.Errorf("%w: a batch's job takes no IfExists: a taken ID refuses the batch", ErrInvalid)
	}
	in, err := q.newJob(ctx, spec)
	if err != nil {
		return nil, err
	}
	j := in.job
	switch {
	case q.ks.shardOf(j.ID) == shard:
	case j.ConcurrencyKey != "":
		return nil, fmt.Errorf("%w: concurrency key %q is not in the shard of batch %q (the queue has %d shards)", ErrInvalid, j.ConcurrencyKey, batch, q.ks.shards)
	case given:
		return nil, fmt.Errorf("%w: job ID %q is not in the shard of batch %q (the queue has %d shards): use Queue.IDFor(batchID, id)", ErrInvalid, j.ID, batch, q.ks.shards)
	default:
		for q.ks.shardOf(j.ID) != shard {
			j.ID = NewID()
		}
	}
	j.Batch = batch
	return in, nil
}

// createBatches writes the jobs ins and the batches bs, all in shard, in
// one compare-and-set: none of the jobs' keys, nor the batches' callback
// keys, may exist. A batch that exists already is returned with
// ErrBatchExists: the call was made before (perhaps by this caller, whose
// reply was lost), and nothing is written. It returns bs[0] as written.
func (q *Queue) createBatches(ctx context.Context, shard int, ins []*enqueueIn, bs []*Batch) (*Batch, error) {
	if err := q.check(ctx, true); err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(ins)+len(bs))
	for _, in := range ins {
		keys = append(keys, q.ks.jobKey(shard, in.job.ID))
	}
	for _, b := range bs {
		keys = append(keys, q.ks.jobKey(shard, b.ID))
	}
	aux := make([]string, len(bs))
	for i, b := range bs {
		aux[i] = q.ks.batchKey(shard, b.ID)
	}
	predict := []string{idxBatches}
	for _, in := range ins {
		if ix := readyIndex(in.job.Priority); !containsStr(predict, ix) {
			predict = append(predict, ix)
		}
	}
	var out, existing *Batch
	_, _, err := q.run(ctx, &casTxn{keys: keys, aux: aux, checks: q.checksFor(shard, predict...), decide: func(r *casRead) (*casPlan, error) {
		out, existing = nil, nil
		for i, k := range aux {
			raw := r.aux[k]
			if raw.Missing {
				continue
			}
			stored, err := readBatch(k, raw)
			if err != nil {
				return nil, err
			}
			if i == 0 {
				// Perhaps this very call, made again after a lost reply:
				// answered as if just made (waited for with MinReplicas).
				existing = stored
				return &casPlan{confirm: true}, nil
			}
			return nil, fmt.Errorf("%w: batch %q of the chain", ErrBatchExists, stored.ID)
		}
		for k := range keys {
			if r.errs[k] != nil {
				return nil, r.errs[k]
			}
			if cur := r.jobs[k]; cur != nil {
				return nil, &JobExistsError{Index: min(k, len(ins)), Job: cur}
			}
		}
		plan := &casPlan{}
		var ip indexPlan
		top := 0
		for k, in := range ins {
			j := in.job
			j.CreatedAt, j.UpdatedAt, j.RunAt = r.now, r.now, in.runAt
			if !in.fixed {
				j.RunAt = r.now.Add(in.delay)
			}
			plan.writes = append(plan.writes, casWrite{key: keys[k], job: j})
			q.move(&ip, shard, j.ID, nil, j, "")
			top = max(top, j.Priority)
		}
		for i, b := range bs {
			b.CreatedAt, b.Rev = r.now, 1
			v, err := encodeBatch(b)
			if err != nil {
				return nil, err
			}
			if err := q.fitsValues(b, r.now); err != nil {
				return nil, err
			}
			plan.aux = append(plan.aux, auxWrite{key: aux[i], val: v})
			ip.zadd(q.ks.index(shard, idxBatches), toMillis(r.now), b.ID)
		}
		plan.index(&ip)
		plan.steps = append(plan.steps, []any{"publish", q.ks.wakeChannel(), wakeHint(top)})
		out = bs[0]
		return plan, nil
	}})
	switch {
	case existing != nil && err == nil:
		return existing, &BatchExistsError{Batch: existing}
	case err != nil:
		return nil, err
	}
	return out, nil
}

// BatchExistsError reports a batch whose ID is taken, with the stored
// batch. It matches ErrBatchExists.
type BatchExistsError struct {
	Batch *Batch
}

func (e *BatchExistsError) Error() string {
	return fmt.Sprintf("jobkey: batch %q already exists", e.Batch.ID)
}

// Is makes errors.Is(err, ErrBatchExists) hold.
func (e *BatchExistsError) Is(target error) bool { return target == ErrBatchExists }

// readBatch decodes the batch value raw, read at key.
func readBatch(key string, raw rawRead) (*Batch, error) {
	switch {
	case raw.Missing:
		return nil, fmt.Errorf("%w: %q", ErrBatchNotFound, key)
	case raw.Err != nil:
		return nil, &WrongTypeError{Key: key, Want: "string", Got: "non-string"}
	}
	b, err := decodeBatch(raw.S)
	if err != nil {
		return nil, keyed(err, key)
	}
	return b, nil
}

// Batch returns the batch with the given ID: its counts, its callback,
// and whether it fired. One round trip.
func (q *Queue) Batch(ctx context.Context, id string) (*Batch, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	if err := q.check(ctx, false); err != nil {
		return nil, err
	}
	key := q.ks.batchKey(q.ks.shardOf(id), id)
	s, err := q.rdb.Get(ctx, key).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, fmt.Errorf("%w: %q in queue %q", ErrBatchNotFound, id, q.name)
	case err != nil && reply.IsWrongType(err):
		return nil, &WrongTypeError{Key: key, Want: "string", Got: "non-string"}
	case err != nil:
		return nil, fmt.Errorf("jobkey: get batch %q: %w", id, err)
	}
	b, err := decodeBatch(s)
	if err != nil {
		return nil, keyed(err, key)
	}
	return b, nil
}

func containsStr(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}
