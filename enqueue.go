package jobkey

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jobkey/jobkey/internal/cas"
)

// MaxTypeLen bounds a job's Type.
const MaxTypeLen = 256

// EnqueueOpts are per-job options of Enqueue. A nil *EnqueueOpts means all
// defaults.
type EnqueueOpts struct {
	// ID is the caller's job ID. Enqueueing an ID that exists returns
	// ErrJobExists and the stored job, so retrying an enqueue whose outcome
	// was unknown is safe (default: a new ULID).
	ID string
	// RunAt is the earliest time the job may run (default: now).
	RunAt time.Time
	// Delay, when RunAt is zero, sets RunAt to now + Delay.
	Delay time.Duration
	// MaxAttempts overrides Config.MaxAttempts for this job.
	MaxAttempts int
	// Meta is stored as the job's Job.Meta: small string metadata, such as
	// the trace context the otel package's Inject writes. It is copied, and
	// refused with ErrInvalid beyond MaxMetaEntries entries, MaxMetaBytes
	// bytes or with an empty key (default: none).
	Meta map[string]string
	// Timeout bounds each run of the job (see Job.Timeout), rounded up to
	// whole milliseconds, at most MaxTimeout (default: WorkOpts.Timeout).
	Timeout time.Duration
	// Priority orders due jobs, 0 to MaxPriority, higher first (see
	// Job.Priority; default: 0).
	Priority int
	// ConcurrencyKey puts the job under a concurrency limit: at most the
	// key's limit of the queue's jobs with this key run at once, across
	// every worker and process (see Job.ConcurrencyKey,
	// Queue.SetConcurrencyLimit and Config.ConcurrencyLimit). On a queue of
	// several shards the job lives in its key's shard: an ID of the
	// caller's must be there too (Queue.IDFor makes one), and a generated
	// ID is drawn there (default: none).
	ConcurrencyKey string
	// Retention keeps the job this long once it has succeeded or been
	// canceled, in place of Config.Retention (see Job.Retention): 1s to
	// MaxRetention, rounded up to whole milliseconds (default: 0, the
	// queue's Config.Retention).
	Retention time.Duration
	// Deadline is an absolute time after which no run of the job may go on
	// (see Job.Deadline), judged against Redis's clock as RunAt is. It may
	// already be past: the job's attempts then fail without running, as in
	// asynq. Kept to the millisecond, within 1970..9999 (default: none).
	Deadline time.Time
}

// JobSpec describes one job to enqueue, as an element of an EnqueueMany
// batch. Its Opts carry the job's ID, times and Meta.
type JobSpec struct {
	Type    string       // what kind of work
	Payload []byte       // the arguments
	Opts    *EnqueueOpts // may be nil
}

// Enqueue stores a new pending job in two round trips. With opts.ID set and
// taken, it writes nothing and returns the stored job with an error that
// matches ErrJobExists, so an enqueue whose outcome was unknown can be
// retried with the same ID. A job too large for Config.MaxValueBytes is
// refused with ErrTooLarge before anything is written. CreatedAt, and RunAt
// when opts gives a Delay or nothing, are set by Redis's clock.
func (q *Queue) Enqueue(ctx context.Context, typ string, payload []byte, opts *EnqueueOpts) (*Job, error) {
	in, err := q.newJob(JobSpec{Type: typ, Payload: payload, Opts: opts})
	if err != nil {
		return nil, err
	}
	if q.enqueues != nil {
		return q.enqueues.Do(ctx, in)
	}
	return answer(in.job, q.enqueueJobs(ctx, []*enqueueIn{in}, nil)[0])
}

// answer is a single enqueue's outcome: the job written, or the stored job
// with ErrJobExists, or nil and the error.
func answer(j *Job, err error) (*Job, error) {
	var je *JobExistsError
	if errors.As(err, &je) {
		je.Index = 0 // the caller's own single-job enqueue
		return je.Job, err
	}
	if err != nil {
		return nil, err
	}
	return j, nil
}

// existingOr returns the stored job an ErrJobExists carries, else j.
func existingOr(j *Job, err error) *Job {
	var je *JobExistsError
	if errors.As(err, &je) {
		return je.Job
	}
	return j
}

// EnqueueMany stores a batch of jobs, two round trips per transaction of at
// most Config.MaxBatch jobs (on a cluster, one transaction per shard). A
// bad job anywhere refuses the whole batch before anything is written.
//
// Otherwise jobs[i] is the i-th job: as written, or as stored when its ID
// was taken (or repeated earlier in the batch). When any job was not
// written, err is a *BatchError whose Errs[i] says why for each job: a
// *JobExistsError, a value that cannot be read under its ID, or the
// failure of the transaction that carried it (which wrote none of its
// jobs, or, when the error says the outcome is unknown, may have written
// all of them). Jobs of transactions that committed have a nil entry.
func (q *Queue) EnqueueMany(ctx context.Context, batch []JobSpec) ([]*Job, error) {
	if len(batch) == 0 {
		return nil, nil
	}
	ins := make([]*enqueueIn, len(batch))
	for i, spec := range batch {
		in, err := q.newJob(spec)
		if err != nil {
			if len(batch) > 1 {
				err = wrapf(err, "batch job %d", i)
			}
			return nil, err
		}
		ins[i] = in
	}
	errs := q.enqueueJobs(ctx, ins, nil)
	jobs := make([]*Job, len(ins))
	for i, in := range ins {
		jobs[i] = existingOr(in.job, errs[i])
	}
	return jobs, batchErr(errs)
}

// enqueueIn is a validated job waiting to be written. Its times are set in
// the compare-and-set, by Redis's clock: CreatedAt is the time of the
// write, and RunAt that time plus delay, unless the caller fixed RunAt.
type enqueueIn struct {
	job   *Job
	delay time.Duration
	fixed bool
}

// enqueueJobs writes validated jobs, one transaction per set of txnSets,
// and returns each job's own outcome. gone(i), when not nil, says that the
// caller of job i gave up: it is left out of the next decision.
func (q *Queue) enqueueJobs(ctx context.Context, ins []*enqueueIn, gone func(i int) bool) []error {
	errs := make([]error, len(ins))
	first := make(map[string]int, len(ins))
	var todo, repeats []int
	for i, in := range ins {
		if _, ok := first[in.job.ID]; ok {
			repeats = append(repeats, i)
			continue
		}
		first[in.job.ID] = i
		todo = append(todo, i)
	}
	q.eachTxn(ctx, true, todo, func(i int) string { return ins[i].job.ID },
		func(set []int) error { return q.enqueueTxn(ctx, ins, set, errs, gone) },
		func(set []int, err error) {
			for _, i := range set {
				if errs[i] != errLeftOut {
					errs[i] = err
				}
			}
		})
	// An ID repeated in the batch shares the fate of its first occurrence,
	// as if enqueued just after it; if the first one's caller gave up, the
	// repeat is tried on its own.
	var again []int
	for _, i := range repeats {
		f := first[ins[i].job.ID]
		var je *JobExistsError
		switch {
		case errs[f] == errLeftOut:
			again = append(again, i)
		case errs[f] == nil:
			errs[i] = &JobExistsError{Index: i, Job: cloneJob(ins[f].job)}
		case errors.As(errs[f], &je):
			errs[i] = &JobExistsError{Index: i, Job: je.Job}
		default:
			errs[i] = errs[f]
		}
	}
	if len(again) > 0 {
		sub := make([]*enqueueIn, len(again))
		for k, i := range again {
			sub[k] = ins[i]
		}
		var subGone func(int) bool
		if gone != nil {
			subGone = func(k int) bool { return gone(again[k]) }
		}
		for k, err := range q.enqueueJobs(ctx, sub, subGone) {
			var je *JobExistsError
			if errors.As(err, &je) {
				je.Index = again[k]
			}
			errs[again[k]] = err
		}
	}
	return errs
}

// flushEnqueues writes a group-commit batch of Enqueue calls. Calls whose
// transaction was refused whole (nothing of it written) are tried again
// one by one, so one job's broken shard does not fail the others; calls in
// transactions that committed keep their outcome.
func (q *Queue) flushEnqueues(ctx context.Context, batch []*cas.Call[*enqueueIn, *Job]) {
	batch = cas.Live(batch)
	ins := make([]*enqueueIn, len(batch))
	for i, c := range batch {
		ins[i] = c.In()
	}
	errs := q.enqueueJobs(ctx, ins, func(i int) bool { return batch[i].Gone() })
	for i, c := range batch {
		if len(batch) > 1 && refusedWhole(errs[i]) {
			alone := func(int) bool { return c.Gone() }
			c.Finish(answer(c.In().job, q.enqueueJobs(ctx, []*enqueueIn{c.In()}, alone)[0]))
			continue
		}
		c.Finish(answer(c.In().job, errs[i]))
	}
}

func (q *Queue) newJob(spec JobSpec) (*enqueueIn, error) {
	if spec.Type == "" || len(spec.Type) > MaxTypeLen {
		return nil, fmt.Errorf("%w: job type must be 1..%d bytes, got %d", ErrInvalid, MaxTypeLen, len(spec.Type))
	}
	o := spec.Opts
	if o == nil {
		o = &EnqueueOpts{}
	}
	// Provisional times, of the size the real ones will have, so the size
	// check below is exact.
	now := q.clock.Guess()
	j := &Job{
		ID: o.ID, Queue: q.name, Type: spec.Type, Payload: spec.Payload, State: StatePending,
		MaxAttempts: q.cfg.MaxAttempts, RunAt: now, CreatedAt: now, UpdatedAt: now,
		Meta: cloneMeta(o.Meta),
	}
	in := &enqueueIn{job: j, delay: o.Delay}
	if j.ID == "" {
		j.ID = NewID()
	} else if err := validID(j.ID); err != nil {
		return nil, err
	}
	switch {
	case o.MaxAttempts < 0 || o.MaxAttempts > MaxAttemptsLimit:
		return nil, fmt.Errorf("%w: MaxAttempts is %d, want 0..%d", ErrInvalid, o.MaxAttempts, MaxAttemptsLimit)
	case o.MaxAttempts > 0:
		j.MaxAttempts = o.MaxAttempts
	}
	if err := validMeta(j.Meta); err != nil {
		return nil, err
	}
	timeout, err := validTimeout(o.Timeout)
	if err != nil {
		return nil, err
	}
	j.Timeout = timeout
	if j.Retention, err = validRetention(o.Retention); err != nil {
		return nil, err
	}
	if j.Deadline, err = validDeadline(o.Deadline); err != nil {
		return nil, err
	}
	if err := validPriority(o.Priority); err != nil {
		return nil, err
	}
	j.Priority = o.Priority
	if o.ConcurrencyKey != "" {
		if err := validConcurrencyKey(o.ConcurrencyKey); err != nil {
			return nil, err
		}
		j.ConcurrencyKey = o.ConcurrencyKey
		// The job lives in its key's shard, beside its key's value.
		if want := q.ks.shardOf(j.ConcurrencyKey); q.ks.shardOf(j.ID) != want {
			if o.ID != "" {
				return nil, fmt.Errorf("%w: job ID %q is not in the shard of concurrency key %q (the queue has %d shards): use Queue.IDFor(key, id)",
					ErrInvalid, j.ID, j.ConcurrencyKey, q.ks.shards)
			}
			for q.ks.shardOf(j.ID) != want {
				j.ID = NewID()
			}
		}
	}
	switch {
	case o.Delay < 0:
		return nil, fmt.Errorf("%w: Delay is %v, want >= 0", ErrInvalid, o.Delay)
	case !o.RunAt.IsZero():
		if err := validTime("RunAt", o.RunAt); err != nil {
			return nil, err
		}
		j.RunAt, in.fixed = o.RunAt.UTC().Truncate(time.Millisecond), true
	}
	if n := encodedSize(j); n > q.cfg.MaxValueBytes {
		return nil, fmt.Errorf("%w: job %q would be %d bytes, limit %d", ErrTooLarge, j.ID, n, q.cfg.MaxValueBytes)
	}
	return in, nil
}

// wakeHint is the wake-up message of an enqueue whose highest priority is
// top: "1", or "p<top>" above priority 0, which also tells workers to drop
// the due entries they read ahead (duePool), so that the job is not
// passed over for lower priorities read before it came.
func wakeHint(top int) string {
	if top == 0 {
		return "1"
	}
	return "p" + strconv.Itoa(top)
}

// enqueueTxn writes ins[set...] in one compare-and-set. A taken ID, or one
// whose value cannot be read, is left alone and reported in errs.
func (q *Queue) enqueueTxn(ctx context.Context, ins []*enqueueIn, set []int, errs []error, gone func(int) bool) error {
	ids := make([]string, len(set))
	for k, i := range set {
		ids[k] = ins[i].job.ID
	}
	var predict []string // the ready indexes of the jobs' priorities
	top := 0
	for _, i := range set {
		if ix := readyIndex(ins[i].job.Priority); !slices.Contains(predict, ix) {
			predict = append(predict, ix)
		}
		top = max(top, ins[i].job.Priority)
	}
	keys, shards, checks := q.txnKeys(ids, predict...)
	_, _, err := q.run(ctx, &casTxn{keys: keys, checks: checks, decide: func(r *casRead) (*casPlan, error) {
		plan := &casPlan{}
		var ip indexPlan
		for k, i := range set {
			errs[i] = nil
			in := ins[i]
			switch {
			case gone != nil && gone(i):
				errs[i] = errLeftOut
			case r.errs[k] != nil:
				errs[i] = wrapf(r.errs[k], "enqueue %q", in.job.ID)
			case r.jobs[k] != nil:
				// Perhaps this very enqueue, retried: waited for as if just made.
				errs[i] = &JobExistsError{Index: i, Job: r.jobs[k]}
				plan.confirm = true
			default:
				j := in.job
				j.CreatedAt, j.UpdatedAt = r.now, r.now
				if !in.fixed {
					j.RunAt = r.now.Add(in.delay)
				}
				plan.writes = append(plan.writes, casWrite{key: keys[k], job: j})
				q.move(&ip, shards[k], j.ID, nil, j, "")
			}
		}
		plan.index(&ip)
		if len(plan.writes) > 0 {
			// A hint for idle workers, published by the same EXEC. Delayed
			// jobs publish it too, so a sleeping worker learns the earlier
			// time it must wake at.
			plan.steps = append(plan.steps, []any{"publish", q.ks.wakeChannel(), wakeHint(top)})
		}
		return plan, nil
	}})
	return err
}
