package jobkey

import "slices"

// entry is where a job value says its ID belongs: one index and a score.
// Every job is in exactly one index, so an entry is a pure function of the
// value (docs/design.md, rule 1) and nothing stored can disagree with a count.
type entry struct {
	index string // idxReady, idxLeased, idxSucceeded, idxFailed or idxCanceled
	score int64  // unix ms
}

func derive(j *Job) entry {
	switch j.State {
	case StatePending:
		return entry{readyIndex(j.Priority), toMillis(j.RunAt)}
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
// type must be checked before it runs. Writes to one key are merged into
// one command (ZREM key m1 m2 ..., ZADD key s1 m1 s2 m2 ...), so a batch of
// n jobs costs a few index commands, not n of each.
type indexPlan struct {
	checks []typeCheck
	keys   []indexWrites // in first-use order; a transaction touches a few
	extra  [][]any       // other steps, after the index writes
}

// indexWrites are the writes to one index key: the command prefixes are
// built in as the first elements, so steps hands them over as they are.
type indexWrites struct {
	key  string
	rems []any // "zrem", key, members...
	adds []any // "zadd", key, score, member, ...
}

func (p *indexPlan) use(key string) *indexWrites {
	for i := range p.keys {
		if p.keys[i].key == key {
			return &p.keys[i]
		}
	}
	p.keys = append(p.keys, indexWrites{key: key})
	p.checks = append(p.checks, typeCheck{key: key, want: "zset"})
	return &p.keys[len(p.keys)-1]
}

func (p *indexPlan) zrem(key, id string) {
	w := p.use(key)
	if w.rems == nil {
		w.rems = []any{"zrem", key}
	}
	w.rems = append(w.rems, id)
}

func (p *indexPlan) zadd(key string, score int64, id string) {
	w := p.use(key)
	if w.adds == nil {
		w.adds = []any{"zadd", key}
	}
	w.adds = append(w.adds, score, id)
}

// rescore sets id's score in key to score, replacing an addition of id to
// key the plan already holds.
func (p *indexPlan) rescore(key string, score int64, id string) {
	w := p.use(key)
	for i := 3; i < len(w.adds); i += 2 {
		if w.adds[i] == id {
			w.adds[i-1] = score
			return
		}
	}
	p.zadd(key, score, id)
}

// flag sets a string key to "1" in the transaction (once), its type
// checked before MULTI.
func (p *indexPlan) flag(key string) {
	if slices.ContainsFunc(p.checks, func(c typeCheck) bool { return c.key == key }) {
		return
	}
	p.checks = append(p.checks, typeCheck{key: key, want: "string"})
	p.extra = append(p.extra, []any{"set", key, "1"})
}

// steps returns the merged commands: removals, then additions.
// No ID is both removed from and added to one key in a plan, so the order
// between them does not matter.
func (p *indexPlan) steps() [][]any {
	out := make([][]any, 0, 2*len(p.keys)+len(p.extra))
	for _, w := range p.keys {
		if w.rems != nil {
			out = append(out, w.rems)
		}
	}
	for _, w := range p.keys {
		if w.adds != nil {
			out = append(out, w.adds)
		}
	}
	return append(out, p.extra...)
}

// move adds the index writes that take job id from what old says (nil: no
// value before) to what new says (nil: no value after), writing only what
// really changes. hint names an index the caller found id in; when it is
// not where old says, the index was changed outside jobkey, so the hint is
// removed and the right entry written whatever old said (rule 3).
func (q *Queue) move(p *indexPlan, shard int, id string, old, new *Job, hint string) {
	var from, to entry
	if old != nil {
		from = q.entryOf(old)
	}
	if new != nil {
		to = q.entryOf(new)
		if new.State == StatePending && new.Priority > 0 {
			// The due entries read ahead may hold lower priorities than
			// this job: they must not go before it. Readers that do not
			// know the queue uses priorities learn it from the flag.
			q.pool.dropBelow(new.Priority)
			q.prios.Store(true)
			p.flag(q.ks.index(shard, prioFlag))
		}
	}
	tampered := hint != "" && hint != from.index
	if from.index != "" && from.index != to.index {
		p.zrem(q.ks.index(shard, from.index), id)
	}
	if tampered && hint != to.index && hint != from.index {
		p.zrem(q.ks.index(shard, hint), id)
	}
	if to.index != "" && (to != from || tampered) {
		p.zadd(q.ks.index(shard, to.index), to.score, id)
	}
}

// write returns the casWrite storing j, with the retention expiry a
// finished job gets in the same EXEC that finishes it. j.UpdatedAt is the
// transaction's time. A job canceled while it ran keeps its key, and so its
// ID, at least until that run's lease ends, however short the retention
// (lastrun.go).
func (q *Queue) write(key string, j *Job) casWrite {
	w := casWrite{key: key, job: j}
	if j.State.Finished() {
		w.ttl = max(q.retention(j), lastRunLeft(j, j.UpdatedAt))
	}
	return w
}
