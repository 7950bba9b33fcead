package jobkey

import (
	"strconv"
	"time"
)

// entry is where a job value says its ID belongs: one index and a score.
// Every job is in exactly one index, so an entry is a pure function of the
// value (DESIGN.md rule 1) and nothing stored can disagree with a count.
type entry struct {
	index string // idxReady, idxLeased, idxSucceeded, idxFailed or idxCanceled
	score int64  // unix ms
}

func derive(j *Job) entry {
	switch j.State {
	case StatePending:
		return entry{idxReady, toMillis(j.RunAt)}
	case StateActive:
		return entry{idxLeased, toMillis(j.LeaseUntil)}
	case StateSucceeded:
		return entry{idxSucceeded, toMillis(j.UpdatedAt)}
	case StateFailed:
		return entry{idxFailed, toMillis(j.UpdatedAt)}
	case StateCanceled:
		return entry{idxCanceled, toMillis(j.UpdatedAt)}
	}
	return entry{}
}

// indexPlan collects the index writes of one transaction and the keys whose
// type must be checked before it runs.
type indexPlan struct {
	steps  [][]any
	checks []typeCheck
	seen   map[string]bool // keys already added to checks
}

func (p *indexPlan) check(key string) {
	if p.seen == nil {
		p.seen = map[string]bool{}
	}
	if !p.seen[key] {
		p.seen[key] = true
		p.checks = append(p.checks, typeCheck{key: key, want: "zset"})
	}
}

// move adds the index writes that take job id from what old says (nil: no
// value before) to what new says (nil: no value after), writing only what
// really changes. hint names an index the caller found id in; when it is
// not where old says, the index was changed outside jobkey, so the hint is
// removed and the right entry written whatever old said (rule 3).
func (q *Queue) move(p *indexPlan, shard int, id string, old, new *Job, hint string) {
	var from, to entry
	if old != nil {
		from = derive(old)
	}
	if new != nil {
		to = derive(new)
	}
	tampered := hint != "" && hint != from.index
	if from.index != "" && from.index != to.index {
		q.zrem(p, shard, from.index, id)
	}
	if tampered && hint != to.index && hint != from.index {
		q.zrem(p, shard, hint, id)
	}
	if to.index != "" && (to != from || tampered) {
		key := q.ks.index(shard, to.index)
		p.check(key)
		p.steps = append(p.steps, []any{"zadd", key, to.score, id})
		if to.index != from.index && new.State.Finished() {
			// Entries of finished jobs whose keys have expired are trimmed
			// here, by the transaction that adds one: no sweeper runs.
			cutoff := toMillis(q.now().Add(-q.retention(new.State)))
			p.steps = append(p.steps, []any{"zremrangebyscore", key, "-inf", "(" + strconv.FormatInt(cutoff, 10)})
		}
	}
}

func (q *Queue) zrem(p *indexPlan, shard int, index, id string) {
	key := q.ks.index(shard, index)
	p.check(key)
	p.steps = append(p.steps, []any{"zrem", key, id})
}

// retention is how long a finished job's key lives.
func (q *Queue) retention(s State) time.Duration {
	if s == StateFailed {
		return q.cfg.FailedRetention
	}
	return q.cfg.Retention
}

// write returns the casWrite storing j, with the retention expiry a
// finished job gets in the same EXEC that finishes it.
func (q *Queue) write(key string, j *Job) casWrite {
	w := casWrite{key: key, job: j}
	if j.State.Finished() {
		w.ttl = q.retention(j.State)
	}
	return w
}
