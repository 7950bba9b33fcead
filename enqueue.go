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
	// ErrJobExists and the stored job, or what IfExists says, so retrying
	// an enqueue whose outcome was unknown is safe (default: a new ULID, or
	// the ID UniqueBy derives).
	ID string
	// IfExists says what the enqueue does when a job exists under its ID,
	// by that job's state: refuse, keep it, or replace it (see IfExists;
	// default: IfExistsRefuse).
	IfExists IfExists
	// UniqueBy, when set, derives the job's ID from its type, its
	// arguments (or some of them) and a period, so that enqueues of the
	// same work share one ID (see UniqueBy). ID must then be empty
	// (default: none).
	UniqueBy *UniqueBy
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

	// typed says Payload is the msgpack of an Args: UniqueBy derives the
	// ID from its canonical encoding (UniqueArgsID).
	typed bool
}

// Enqueue stores a new pending job in two round trips. With opts.ID set and
// taken, it writes nothing and returns the stored job with an error that
// matches ErrJobExists, so an enqueue whose outcome was unknown can be
// retried with the same ID; opts.IfExists may keep the stored job instead,
// or replace it, in the same two round trips. A job too large for
// Config.MaxValueBytes is refused with ErrTooLarge before anything is
// written. CreatedAt, and RunAt when opts gives a Delay or nothing, are set
// by Redis's clock.
func (q *Queue) Enqueue(ctx context.Context, typ string, payload []byte, opts *EnqueueOpts) (*Job, error) {
	return q.enqueue(ctx, JobSpec{Type: typ, Payload: payload, Opts: opts})
}

// enqueue is Enqueue of one spec.
func (q *Queue) enqueue(ctx context.Context, spec JobSpec) (*Job, error) {
	in, err := q.newJob(ctx, spec)
	if err != nil {
		return nil, err
	}
	if q.enqueues != nil {
		return q.enqueues.Do(ctx, in)
	}
	return answer(in.job, q.enqueueJobs(ctx, []*enqueueIn{in}, nil)[0])
}

// answer is a single enqueue's outcome: the job written, or the stored job
// with ErrJobExists, or the stored job kept, or nil and the error.
func answer(j *Job, err error) (*Job, error) {
	if err == nil {
		return j, nil // before errors.As, whose targets escape
	}
	var je *JobExistsError
	var kept *keptError
	if errors.As(err, &kept) {
		return kept.job, nil
	}
	if errors.As(err, &je) {
		je.Index = 0 // the caller's own single-job enqueue
		return je.Job, err
	}
	if err != nil {
		return nil, err
	}
	return j, nil
}

// existingOr returns the stored job an ErrJobExists or a keep carries,
// else j.
func existingOr(j *Job, err error) *Job {
	if err == nil {
		return j
	}
	var je *JobExistsError
	var kept *keptError
	switch {
	case errors.As(err, &je):
		return je.Job
	case errors.As(err, &kept):
		return kept.job
	}
	return j
}

// jobErr is a job's error as a batch reports it: none for a job kept.
func jobErr(err error) error {
	var kept *keptError
	if errors.As(err, &kept) {
		return nil
	}
	return err
}

// EnqueueMany stores a batch of jobs, two round trips per transaction of at
// most Config.MaxBatch jobs (on a cluster, one transaction per shard). A
// bad job anywhere refuses the whole batch before anything is written.
//
// Otherwise jobs[i] is the i-th job: as written, or as stored when its ID
// was taken (or repeated earlier in the batch), or as it replaced the
// stored job (EnqueueOpts.IfExists). A job repeated in the batch with a
// policy other than IfExistsRefuse is decided after the others, in a
// transaction of its own, on the job then stored. When any job was not
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
		in, err := q.newJob(ctx, spec)
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
		errs[i] = jobErr(errs[i])
	}
	return jobs, batchErr(errs)
}

// enqueueIn is a validated job waiting to be written. Its times are set in
// the compare-and-set, by Redis's clock: CreatedAt is the time of the
// write, and RunAt that time plus delay, unless the caller fixed RunAt.
type enqueueIn struct {
	job      *Job
	delay    time.Duration
	fixed    bool
	runAt    time.Time // the caller's RunAt, when fixed
	ifExists IfExists
}

// enqueueJobs writes validated jobs, one transaction per set of txnSets,
// and returns each job's own outcome. gone(i), when not nil, says that the
// caller of job i gave up: it is left out of the next decision.
func (q *Queue) enqueueJobs(ctx context.Context, ins []*enqueueIn, gone func(i int) bool) []error {
	errs := make([]error, len(ins))
	first := make(map[string]int, len(ins))
	var todo, repeats []int
	var again []int
	for i, in := range ins {
		if _, ok := first[in.job.ID]; ok && in.ifExists != IfExistsRefuse {
			// Decided on the job stored once the others are written.
			again = append(again, i)
			continue
		}
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
		case jobErr(errs[f]) == nil: // the first kept the stored job
			errs[i] = &JobExistsError{Index: i, Job: existingOr(nil, errs[f])}
		default:
			errs[i] = errs[f]
		}
	}
	if len(again) > 0 {
		slices.Sort(again)
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

func (q *Queue) newJob(ctx context.Context, spec JobSpec) (*enqueueIn, error) {
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
	in := &enqueueIn{job: j, delay: o.Delay, ifExists: o.IfExists}
	if o.IfExists > IfExistsReplace {
		return nil, fmt.Errorf("%w: IfExists is %d, not a policy", ErrInvalid, o.IfExists)
	}
	switch {
	case o.UniqueBy != nil && o.ID != "":
		return nil, fmt.Errorf("%w: EnqueueOpts sets both ID and UniqueBy", ErrInvalid)
	case o.UniqueBy != nil:
		var err error
		if j.ID, err = q.uniqueID(ctx, spec, o.UniqueBy); err != nil {
			return nil, err
		}
	case j.ID == "":
		j.ID = NewID()
	default:
		if err := validID(j.ID); err != nil {
			return nil, err
		}
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
			if o.UniqueBy != nil {
				if j.ID, err = q.IDFor(j.ConcurrencyKey, j.ID); err != nil {
					return nil, err
				}
			} else if o.ID != "" {
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
		in.runAt = j.RunAt
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
	replaces := false
	for _, i := range set {
		if ix := readyIndex(ins[i].job.Priority); !slices.Contains(predict, ix) {
			predict = append(predict, ix)
		}
		top = max(top, ins[i].job.Priority)
		replaces = replaces || ins[i].ifExists.replaces()
	}
	if replaces {
		// A replaced job leaves the index of its state: checked with the
		// others in round trip 1.
		predict = append(predict, idxSucceeded, idxFailed, idxCanceled)
	}
	keys, shards, checks := q.txnKeys(ids, predict...)
	var aux []string
	var follow func(r *casRead) []string
	if replaces {
		// A pending keyed job may be listed in its key's value as waiting:
		// the value of the key the caller gives is read in round trip 1, as
		// a fenced write reads its copy's; a stored job of another key has
		// its value read once the job is, as Update reads it.
		may := make([]*Job, len(set))
		for k, i := range set {
			if ins[i].ifExists.replaces() {
				may[k] = ins[i].job
			}
		}
		aux = q.slotKeys(may, shards, nil)
		follow = func(r *casRead) []string {
			may := make([]*Job, len(set))
			for k, i := range set {
				if cur := r.jobs[k]; cur != nil && cur.State == StatePending && ins[i].ifExists.on(cur.State) == conflictReplace {
					may[k] = cur
				}
			}
			return q.slotKeys(may, shards, nil)
		}
	}
	_, _, err := q.run(ctx, &casTxn{keys: keys, checks: checks, aux: aux, follow: follow, decide: func(r *casRead) (*casPlan, error) {
		plan := &casPlan{writes: make([]casWrite, 0, len(keys))}
		ip := indexPlan{moves: make([]stateChange, 0, len(keys))}
		b := q.newSlotBook(r)
		for k, i := range set {
			errs[i] = nil
			in := ins[i]
			cur := r.jobs[k]
			switch {
			case gone != nil && gone(i):
				errs[i] = errLeftOut
			case r.errs[k] != nil:
				errs[i] = wrapf(r.errs[k], "enqueue %q", in.job.ID)
			case cur != nil && in.ifExists.on(cur.State) == conflictKeep:
				errs[i] = &keptError{job: cur}
				plan.confirm = true
			case cur != nil && in.ifExists.on(cur.State) == conflictReplace:
				j := replacing(in, cur, r.now)
				if cur.State == StatePending && cur.ConcurrencyKey != "" {
					// Its listing as waiting goes: a claim that finds the
					// key full lists the new job again.
					b.unlist(b.entry(shards[k], cur), cur.ID)
				}
				plan.writes = append(plan.writes, casWrite{key: keys[k], job: j})
				q.move(&ip, shards[k], j.ID, cur, j, "")
				if cur.State == StatePending && cur.ConcurrencyKey != "" {
					// A claim that found its key full moved its entry past
					// its RunAt (park), which the stored value does not
					// say: move writes nothing when the new job's entry
					// equals the one the stored job derives (same RunAt
					// and priority). Unlisted, the job is due at its RunAt,
					// as a new one is; a claim lists it again if its key
					// is still full.
					to := q.entryOf(j)
					ip.rescore(q.ks.index(shards[k], to.index), to.score, j.ID)
				}
			case cur != nil:
				// Perhaps this very enqueue, retried: waited for as if just made.
				errs[i] = &JobExistsError{Index: i, Job: cur}
				plan.confirm = true
			default:
				j := in.job
				j.CreatedAt, j.UpdatedAt, j.RunAt = r.now, r.now, in.runAt
				if !in.fixed {
					j.RunAt = r.now.Add(in.delay)
				}
				// A decision made again after a replace keeps nothing of it.
				j.LeaseOwner, j.LeaseUntil, j.LeaseToken, j.future = "", time.Time{}, 0, futureFields{}
				plan.writes = append(plan.writes, casWrite{key: keys[k], job: j})
				q.move(&ip, shards[k], j.ID, nil, j, "")
			}
		}
		b.finish(plan, &ip)
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
