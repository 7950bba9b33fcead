package jobkey

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// MaxTypeLen bounds a job's Type.
const MaxTypeLen = 256

// JobExistsError reports an enqueued ID that was already taken. Job is the
// stored job; nothing was written for it.
type JobExistsError struct {
	Index int  // position in the EnqueueMany batch (0 for Enqueue)
	Job   *Job // the job already stored under the ID
}

func (e *JobExistsError) Error() string {
	return fmt.Sprintf("jobkey: job %q already exists (state %s)", e.Job.ID, e.Job.State)
}

// Is makes errors.Is(err, ErrJobExists) hold.
func (e *JobExistsError) Is(target error) bool { return target == ErrJobExists }

// Enqueue stores a new pending job in two round trips. With opts.ID set and
// taken, it writes nothing and returns the stored job with an error that
// matches ErrJobExists, so an enqueue whose outcome was unknown can be
// retried with the same ID. A job too large for Config.MaxValueBytes is
// refused with ErrTooLarge before anything is written.
func (q *Queue) Enqueue(ctx context.Context, typ string, payload []byte, opts *EnqueueOpts) (*Job, error) {
	j, err := q.newJob(NewJob{Type: typ, Payload: payload, Opts: opts}, q.now())
	if err != nil {
		return nil, err
	}
	if q.enqueues != nil {
		return q.enqueues.do(ctx, j)
	}
	errs, err := q.enqueueJobs(ctx, []*Job{j})
	if err != nil {
		return nil, err
	}
	return existingOr(j, errs[0]), errs[0]
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
// most Config.MaxBatch jobs (on a cluster, one transaction per shard).
// Every job of a transaction is written, or none is. Jobs whose ID was
// taken are returned as stored, each with a *JobExistsError joined into err;
// the others are written. A bad job anywhere refuses the whole batch before
// anything is written.
func (q *Queue) EnqueueMany(ctx context.Context, batch []NewJob) ([]*Job, error) {
	if len(batch) == 0 {
		return nil, nil
	}
	now := q.now()
	jobs := make([]*Job, len(batch))
	for i, nj := range batch {
		j, err := q.newJob(nj, now)
		if err != nil {
			if len(batch) > 1 {
				err = fmt.Errorf("jobkey: batch job %d: %w", i, err)
			}
			return nil, err
		}
		jobs[i] = j
	}
	errs, err := q.enqueueJobs(ctx, jobs)
	if err != nil {
		return nil, err
	}
	for i := range jobs {
		jobs[i] = existingOr(jobs[i], errs[i])
	}
	return jobs, errors.Join(errs...)
}

// enqueueJobs writes validated jobs. errs[i] is jobs[i]'s own refusal (a
// taken ID); err is a failure of a whole transaction.
func (q *Queue) enqueueJobs(ctx context.Context, jobs []*Job) (errs []error, err error) {
	errs = make([]error, len(jobs))
	for _, group := range q.groups(jobs) {
		for start := 0; start < len(group); start += q.cfg.MaxBatch {
			if err := q.enqueueTxn(ctx, jobs, group[start:min(len(group), start+q.cfg.MaxBatch)], errs); err != nil {
				return nil, err
			}
		}
	}
	return errs, nil
}

// flushEnqueues writes a group-commit batch of Enqueue calls.
func (q *Queue) flushEnqueues(ctx context.Context, batch []*call[*Job, *Job]) {
	batch = live(batch)
	jobs := make([]*Job, len(batch))
	for i, c := range batch {
		jobs[i] = c.in
	}
	errs, err := q.enqueueJobs(ctx, jobs)
	if err != nil && len(batch) > 1 && refusedWhole(err) {
		// Nothing was written; let each call find its own outcome, so one
		// job's broken shard does not fail the others.
		for _, c := range batch {
			e, err := q.enqueueJobs(ctx, []*Job{c.in})
			c.out, c.err = answer(c.in, e, err)
		}
		return
	}
	for i, c := range batch {
		if err != nil {
			c.err = err
			continue
		}
		var je *JobExistsError
		if errors.As(errs[i], &je) {
			je.Index = 0 // the caller's own single-job enqueue
		}
		c.out, c.err = existingOr(c.in, errs[i]), errs[i]
	}
}

func answer(j *Job, errs []error, err error) (*Job, error) {
	if err != nil {
		return nil, err
	}
	return existingOr(j, errs[0]), errs[0]
}

// refusedWhole reports an error that refused a whole transaction before
// EXEC, so nothing of it was written.
func refusedWhole(err error) bool {
	return errors.Is(err, ErrWrongType) || errors.Is(err, ErrCorrupt) || errors.Is(err, ErrUnsupportedFormat) ||
		errors.Is(err, ErrTooLarge) || errors.Is(err, ErrConflict)
}

func (q *Queue) newJob(nj NewJob, now time.Time) (*Job, error) {
	if nj.Type == "" || len(nj.Type) > MaxTypeLen {
		return nil, fmt.Errorf("jobkey: job type must be 1..%d bytes, got %d", MaxTypeLen, len(nj.Type))
	}
	o := nj.Opts
	if o == nil {
		o = &EnqueueOpts{}
	}
	j := &Job{
		ID: o.ID, Queue: q.name, Type: nj.Type, Payload: nj.Payload, State: StatePending,
		MaxAttempts: q.cfg.MaxAttempts, RunAt: now, CreatedAt: now, UpdatedAt: now,
	}
	if j.ID == "" {
		j.ID = NewID()
	} else if err := validID(j.ID); err != nil {
		return nil, err
	}
	switch {
	case o.MaxAttempts < 0:
		return nil, fmt.Errorf("jobkey: MaxAttempts is %d, want >= 0", o.MaxAttempts)
	case o.MaxAttempts > 0:
		j.MaxAttempts = o.MaxAttempts
	}
	switch {
	case o.Delay < 0:
		return nil, fmt.Errorf("jobkey: Delay is %v, want >= 0", o.Delay)
	case !o.RunAt.IsZero():
		j.RunAt = o.RunAt.UTC().Truncate(time.Millisecond)
	case o.Delay > 0:
		j.RunAt = now.Add(o.Delay)
	}
	if n := encodedSize(j); n > q.cfg.MaxValueBytes {
		return nil, fmt.Errorf("%w: job %q would be %d bytes, limit %d", ErrTooLarge, j.ID, n, q.cfg.MaxValueBytes)
	}
	return j, nil
}

// txnKeys returns the job keys and shards of jobs[idx...], and type checks
// of the predicted indexes of every shard they touch.
func (q *Queue) txnKeys(jobs []*Job, idx []int, predict ...string) (keys []string, shards []int, checks []typeCheck) {
	keys, shards = make([]string, len(idx)), make([]int, len(idx))
	seen := map[int]bool{}
	for k, i := range idx {
		keys[k], shards[k] = q.ks.jobKeyOf(jobs[i].ID)
		if !seen[shards[k]] {
			seen[shards[k]] = true
			checks = append(checks, q.checksFor(shards[k], predict...)...)
		}
	}
	return keys, shards, checks
}

// groups splits job positions into the sets one transaction may carry: all
// of them on a single Redis, one set per shard on a cluster (a transaction
// must stay in one hash slot there).
func (q *Queue) groups(jobs []*Job) [][]int {
	if _, cluster := q.rdb.(*redis.ClusterClient); !cluster {
		all := make([]int, len(jobs))
		for i := range all {
			all[i] = i
		}
		return [][]int{all}
	}
	byShard := map[int][]int{}
	var order []int
	for i, j := range jobs {
		s := q.ks.shardOf(j.ID)
		if _, ok := byShard[s]; !ok {
			order = append(order, s)
		}
		byShard[s] = append(byShard[s], i)
	}
	out := make([][]int, len(order))
	for i, s := range order {
		out[i] = byShard[s]
	}
	return out
}

// enqueueTxn writes jobs[idx...] in one compare-and-set. A taken ID (or
// one repeated within the batch) is left alone and reported in errs.
func (q *Queue) enqueueTxn(ctx context.Context, jobs []*Job, idx []int, errs []error) error {
	keys, shards, checks := q.txnKeys(jobs, idx, idxReady)
	_, _, err := q.cas.run(ctx, &casTxn{keys: keys, checks: checks, decide: func(r *casRead) (*casPlan, error) {
		plan := &casPlan{}
		var ip indexPlan
		taken := map[string]int{}
		for k, i := range idx {
			errs[i] = nil
			if r.errs[k] != nil {
				return nil, fmt.Errorf("jobkey: enqueue %q: %w", jobs[i].ID, r.errs[k])
			}
			if cur := r.jobs[k]; cur != nil {
				errs[i] = &JobExistsError{Index: i, Job: cur}
				continue
			}
			if first, dup := taken[keys[k]]; dup {
				errs[i] = &JobExistsError{Index: i, Job: jobs[first]}
				continue
			}
			taken[keys[k]] = i
			plan.writes = append(plan.writes, casWrite{key: keys[k], job: jobs[i]})
			q.move(&ip, shards[k], jobs[i].ID, nil, jobs[i], "")
		}
		plan.steps, plan.checks = ip.steps(), ip.checks
		if len(plan.writes) > 0 {
			// A hint for idle workers, published by the same EXEC. Delayed
			// jobs publish it too, so a sleeping worker learns the earlier
			// time it must wake at.
			plan.steps = append(plan.steps, []any{"publish", q.ks.wakeChannel(), "1"})
		}
		return plan, nil
	}})
	return err
}
