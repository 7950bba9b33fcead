package jobkey

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jobkey/jobkey/internal/cas"
)

// Counting a batch's jobs. Every transition of a job is decided in Go and
// written by one EXEC (cas.go); every decision that changes a job's index
// goes through decider.move, which notes the moves of batch jobs that
// change their batch's counts. q.run then counts them here, in the same
// EXEC: it reads each such batch's value (and its callback's key) under
// WATCH, one round trip more, asked for by cas.NeedKeys, and writes the
// value back whole; when the last job finishes, the callback is written
// beside it. Because the count is a function of the job's own transition,
// a call made again after a lost reply, which finds its job already
// written and writes nothing, counts nothing again: each job is counted
// once per transition, and the callback is written once, by the EXEC that
// takes Pending to 0 while the batch has not fired.

// batchMove is a move of a batch job between the buckets its batch counts:
// pending (StatePending: pending or active), succeeded, failed, canceled.
type batchMove struct {
	shard    int
	batch    string
	id       string
	from, to State
	// depth counts the chain steps ended before this move in the same
	// EXEC, each written canceled by the batch before it (countBatches).
	depth int
	// until is the end of the lease of the job's last run, as the job is
	// written (lastrun.go): past the moment its handler returned for a
	// job canceled while it ran.
	until time.Time
}

// bucket is the count a job in state s is in.
func bucket(s State) State {
	if s.Finished() {
		return s
	}
	return StatePending
}

// batchMoveOf returns the move of old to new (nil: deleted) for the
// counts of old's batch, when it changes them. A job made (old nil) is
// counted by whoever made it: EnqueueBatch, or the batch that wrote it as
// its callback. A job deleted, or replaced by a job of no batch or of
// another, before it finished counts as canceled; deleted after, it stays
// counted as it finished.
func batchMoveOf(shard int, old, new *Job) (batchMove, bool) {
	if old == nil || old.Batch == "" {
		return batchMove{}, false
	}
	from := bucket(old.State)
	to := from
	switch {
	case new != nil && new.Batch == old.Batch:
		to = bucket(new.State)
	case from == StatePending:
		to = StateCanceled
	}
	if from == to {
		return batchMove{}, false
	}
	last := old
	if new != nil {
		last = new
	}
	return batchMove{shard: shard, batch: old.Batch, id: old.ID, from: from, to: to, until: last.LeaseUntil}, true
}

// batchBook is a batch's value within one decision.
type batchBook struct {
	key   string
	shard int
	b     *Batch
	dirty bool
}

// count adds by to the count of bucket s.
func (b *Batch) count(s State, by int) {
	switch s {
	case StatePending:
		b.Pending = max(0, b.Pending+by)
	case StateSucceeded:
		b.Succeeded = max(0, b.Succeeded+by)
	case StateFailed:
		b.Failed = max(0, b.Failed+by)
	case StateCanceled:
		b.Canceled = max(0, b.Canceled+by)
	}
}

// countBatches counts p's batch moves in their batches' values, within p,
// and writes each batch's callback when its last job finishes. A batch
// whose value or callback key has not been read yet is asked for with
// cas.NeedKeys: the engine reads it and decides again. A callback written
// canceled (its condition failed) that is itself a job of another batch,
// a chain's next step, is counted there in turn, in the same EXEC.
//
// A batch whose value is gone (it expired after it fired, or was deleted
// outside jobkey) is not counted; one that cannot be read is left as it
// is, logged, and not counted: the job's own transition still goes ahead.
func (q *Queue) countBatches(r *casRead, p *casPlan) error {
	moves := p.batch
	open := map[string]*batchBook{}
	var order []*batchBook
	var need []string
	var ip indexPlan
	top := -1
	for i := 0; i < len(moves); i++ {
		m := moves[i]
		shard := q.ks.shardOf(m.batch)
		if m.depth >= MaxChainSteps {
			// No chain of EnqueueChain ends this many steps: these batch
			// values were written outside jobkey, perhaps in a ring. The
			// job's own transition goes ahead; this step is not counted.
			q.cfg.Logger.Error("jobkey: a chain ends more steps in one transaction than MaxChainSteps: this one is not counted",
				"queue", q.name, "batch", m.batch, "job", m.id)
			continue
		}
		if shard != m.shard {
			// A stored job's batch is in its own shard: this value was
			// written outside jobkey. Counting it would change a batch
			// that does not hold it (on a cluster, in another slot).
			q.cfg.Logger.Error("jobkey: a job names a batch outside its shard: its outcome is not counted",
				"queue", q.name, "batch", m.batch, "job", m.id)
			continue
		}
		key, cbKey := q.ks.batchKey(shard, m.batch), q.ks.jobKey(shard, m.batch)
		bk, ok := open[key]
		if !ok {
			raw, read := r.aux[key]
			if _, cbRead := r.aux[cbKey]; !read || !cbRead {
				need = append(need, key, cbKey)
				continue
			}
			bk = &batchBook{key: key, shard: shard}
			open[key] = bk
			if !raw.Missing {
				b, err := readBatch(key, raw)
				if err != nil {
					q.cfg.Logger.Error("jobkey: a batch value cannot be read: the job's outcome is not counted in it",
						"queue", q.name, "batch", m.batch, "job", m.id, "err", err)
				} else {
					bk.b = b
					order = append(order, bk)
				}
			}
		}
		b := bk.b
		if b == nil {
			continue
		}
		b.count(m.from, -1)
		b.count(m.to, 1)
		bk.dirty = true
		if m.until.After(r.now) && m.until.After(b.Callback.RunAt) {
			// A run of a job it counts finished may go on until then (it
			// was canceled while it ran): the callback is not due before,
			// kept in its RunAt until the batch fires.
			b.Callback.RunAt = m.until
		}
		if b.Fired != BatchNotFired || b.Pending > 0 {
			continue
		}
		cb, ok := q.fire(b, r, p, cbKey)
		if !ok {
			if next := b.Callback.Batch; next != "" {
				// A chain's next step whose ID a job outside the chain
				// took: it will never be written, so the batch after
				// counts it canceled now, or the chain would wait for it
				// for ever.
				moves = append(moves, batchMove{shard: shard, batch: next, id: b.ID, from: StatePending, to: StateCanceled, depth: m.depth + 1})
			}
			continue
		}
		p.writes = append(p.writes, q.write(cbKey, cb))
		p.fired++
		q.move(&ip, shard, cb.ID, nil, cb, "")
		if cb.State == StatePending {
			top = max(top, cb.Priority)
		}
		if cb.Batch != "" && cb.State.Finished() {
			// A chain's next step, ended before it was written: its own
			// batch counts it now.
			moves = append(moves, batchMove{shard: shard, batch: cb.Batch, id: cb.ID, from: StatePending, to: cb.State, depth: m.depth + 1})
		}
	}
	if len(need) > 0 {
		return &cas.NeedKeys{Keys: need}
	}
	for _, bk := range order {
		if !bk.dirty {
			continue
		}
		bk.b.Rev++
		v, err := encodeBatch(bk.b)
		if err != nil {
			return err
		}
		w := auxWrite{key: bk.key, val: v}
		if bk.b.Fired != BatchNotFired {
			// Kept as long as a finished job is, then it goes.
			w.ttl = max(q.cfg.Retention, q.cfg.FailedRetention)
		}
		p.aux = append(p.aux, w)
	}
	p.steps = append(p.steps, ip.steps()...)
	p.checks = append(p.checks, ip.checks...)
	p.raised = max(p.raised, ip.raised)
	// The callbacks written are transitions too: each has its event
	// (events.go) in this EXEC when its shard's events are on.
	p.moves = append(p.moves, ip.moves...)
	if top >= 0 {
		p.steps = append(p.steps, []any{"publish", q.ks.wakeChannel(), wakeHint(top)})
	}
	return nil
}

// fire marks b fired at r.now and returns its callback as written at
// cbKey: pending, or canceled when b's condition failed. A key that holds
// anything already, or that p writes a job to (an enqueue under the
// batch's ID in the EXEC that ends its last job), is left alone
// (BatchFiredTaken): a job key is never overwritten.
func (q *Queue) fire(b *Batch, r *casRead, p *casPlan, cbKey string) (*Job, bool) {
	b.FiredAt = r.now
	if raw := r.aux[cbKey]; !raw.Missing || slices.ContainsFunc(p.writes, func(w casWrite) bool { return w.key == cbKey }) {
		b.Fired = BatchFiredTaken
		q.cfg.Logger.Warn("jobkey: a batch's callback ID is taken: the callback was not enqueued",
			"queue", q.name, "batch", b.ID)
		return nil, false
	}
	b.Fired = BatchFiredEnqueued
	canceled := b.Condition == BatchAllSucceeded && b.Failed+b.Canceled > 0
	if canceled {
		b.Fired = BatchFiredCanceled
	}
	return q.firedCallback(b, r.now, canceled), true
}

// firedCallback returns b's callback as b writes it when it fires at now:
// pending, due at now or once the last run of a job it counted may have
// ended (its RunAt until then), or canceled with a LastError that names
// b's counts.
func (q *Queue) firedCallback(b *Batch, now time.Time, canceled bool) *Job {
	cb := cloneJob(b.Callback)
	cb.ID, cb.Queue, cb.State = b.ID, q.name, StatePending
	cb.CreatedAt, cb.UpdatedAt, cb.RunAt = now, now, maxTime(now, b.Callback.RunAt)
	cb.Rev = 0
	if canceled {
		cb.State = StateCanceled
		cb.LastError = fmt.Sprintf("batch %q did not all succeed: %d succeeded, %d failed, %d canceled", b.ID, b.Succeeded, b.Failed, b.Canceled)
	}
	return cb
}

// fitsValues refuses, with ErrTooLarge, a batch whose value or whose
// callback as it fires could grow past MaxValueBytes as its jobs are
// counted (each count at its largest, Total; its revision too; fired, and
// the callback canceled with a LastError naming the counts): the value
// could not be read again, or the callback not written by the EXEC that
// ends the batch's last job, which would then fail for ever.
func (q *Queue) fitsValues(b *Batch, now time.Time) error {
	worst := *b
	worst.Callback = cloneJob(b.Callback)
	worst.Callback.RunAt = now
	worst.Pending, worst.Succeeded, worst.Failed, worst.Canceled = b.Total, b.Total, b.Total, b.Total
	worst.Rev, worst.FiredAt, worst.Fired = math.MaxUint64, now, BatchFiredCanceled
	v, err := encodeBatch(&worst)
	if err != nil {
		return err
	}
	if len(v) > MaxValueBytes {
		return fmt.Errorf("%w: batch %q could grow to %d bytes, limit %d", ErrTooLarge, b.ID, len(v), MaxValueBytes)
	}
	if n := encodedSize(q.firedCallback(&worst, now, true)); n > MaxValueBytes {
		return fmt.Errorf("%w: batch %q: its callback would be %d bytes once it fires, limit %d", ErrTooLarge, b.ID, n, MaxValueBytes)
	}
	return nil
}

// batchPredict names, for writes that finish jobs for sure (predict holds
// idxSucceeded: Complete, and Work's completions), the batch values and
// callback keys the callers' copies name, to be read in round trip 1
// rather than in one more: a fenced write knows its job's batch before it
// reads the job, as it knows its concurrency key. A copy whose batch is
// not in its own shard names nothing (a stored job's batch always is); the
// stored value decides all the same.
func (q *Queue) batchPredict(jobs []*Job, predict []string) []string {
	if !slices.Contains(predict, idxSucceeded) {
		return nil
	}
	var out []string
	for _, j := range jobs {
		if j == nil || j.Batch == "" || validID(j.Batch) != nil || q.ks.shardOf(j.Batch) != q.ks.shardOf(j.ID) {
			continue
		}
		s := q.ks.shardOf(j.Batch)
		if k := q.ks.batchKey(s, j.Batch); !slices.Contains(out, k) {
			out = append(out, k, q.ks.jobKey(s, j.Batch))
		}
	}
	return out
}
