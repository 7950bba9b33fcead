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
//
// The writes are gathered in one list and turned into commands at the end
// (steps), whose arguments all share one allocation of their exact size: a
// batch's index writes cost a handful of allocations, not a few per job.
type indexPlan struct {
	checks []typeCheck
	keys   []indexKey // in first-use order; a transaction touches a few
	ops    []indexOp  // every ZREM and ZADD member, in the order made
	extra  [][]any    // other steps, after the index writes
	// raised is the highest priority above 0 of a job the plan makes
	// pending (0: none).
	raised int
	// batch lists the moves of batch jobs that change their batch's
	// counts (batchMoveOf), for the transaction to count (batch.go).
	batch []batchMove
	// moves lists the transitions the plan makes, for the event stream
	// (events.go): every move that changes a job's state, or starts a run.
	moves []stateChange
	score struct { // the last score boxed: a batch's jobs share "now"
		v   int64
		box any
	}
}

// indexKey is one index key the plan writes, boxed once for every
// command that names it, and how many members it removes and adds.
type indexKey struct {
	key        string
	box        any
	rems, adds int
}

// indexOp removes member from, or adds it with score to, keys[key].
type indexOp struct {
	key    int
	add    bool
	score  any
	member any
}

// The first index writes of a plan make room for those of a batch of
// jobs at once, rather than growing one by one.
const (
	indexKeysHint = 4
	indexOpsHint  = 8
)

// zremArg and zaddArg are the command names, converted to arguments once.
var zremArg, zaddArg any = "zrem", "zadd"

func (p *indexPlan) use(key string) int {
	for i := range p.keys {
		if p.keys[i].key == key {
			return i
		}
	}
	if p.keys == nil {
		p.keys = make([]indexKey, 0, indexKeysHint)
		p.checks = slices.Grow(p.checks, indexKeysHint)
	}
	p.keys = append(p.keys, indexKey{key: key, box: key})
	p.checks = append(p.checks, typeCheck{Key: key, Want: "zset"})
	return len(p.keys) - 1
}

// boxScore returns score as an argument, sharing the last one's box when
// equal: converting an int64 to any allocates, and a batch's jobs mostly
// have the same score (the transaction's time, or its lease deadline).
func (p *indexPlan) boxScore(score int64) any {
	if p.score.box == nil || p.score.v != score {
		p.score.v, p.score.box = score, score
	}
	return p.score.box
}

func (p *indexPlan) zrem(key, id string) { p.zremBoxed(key, id) }

// zremBoxed is zrem of a member already converted to an argument (move
// converts one ID once for both of its writes).
func (p *indexPlan) zremBoxed(key string, member any) {
	k := p.use(key)
	p.keys[k].rems++
	p.growOps()
	p.ops = append(p.ops, indexOp{key: k, member: member})
}

func (p *indexPlan) growOps() {
	if p.ops == nil {
		p.ops = make([]indexOp, 0, indexOpsHint)
	}
}

func (p *indexPlan) zadd(key string, score int64, id string) { p.zaddBoxed(key, score, id) }

func (p *indexPlan) zaddBoxed(key string, score int64, member any) {
	k := p.use(key)
	p.keys[k].adds++
	p.growOps()
	p.ops = append(p.ops, indexOp{key: k, add: true, score: p.boxScore(score), member: member})
}

// rescore sets id's score in key to score, replacing an addition of id to
// key the plan already holds.
func (p *indexPlan) rescore(key string, score int64, id string) {
	k := p.use(key)
	for i := range p.ops {
		if o := &p.ops[i]; o.key == k && o.add && memberIs(o.member, id) {
			o.score = p.boxScore(score)
			return
		}
	}
	p.zadd(key, score, id)
}

func memberIs(member any, id string) bool {
	s, ok := member.(string)
	return ok && s == id
}

// flag sets a string key to "1" in the transaction (once), its type
// checked before MULTI.
func (p *indexPlan) flag(key string) {
	if slices.ContainsFunc(p.checks, func(c typeCheck) bool { return c.Key == key }) {
		return
	}
	p.checks = append(p.checks, typeCheck{Key: key, Want: "string"})
	p.extra = append(p.extra, []any{"set", key, "1"})
}

// steps returns the merged commands: removals, then additions, each key's
// in first-use order and its members in the order they were written.
// No ID is both removed from and added to one key in a plan, so the order
// between them does not matter.
func (p *indexPlan) steps() [][]any {
	n, cmds := 0, 0
	for _, k := range p.keys {
		if k.rems > 0 {
			n, cmds = n+2+k.rems, cmds+1
		}
		if k.adds > 0 {
			n, cmds = n+2+2*k.adds, cmds+1
		}
	}
	out := make([][]any, 0, cmds+len(p.extra))
	if cmds > 0 {
		args := make([]any, 0, n)
		// Each command is a capped window of args, filled key by key.
		cmd := func(k int, add bool, size int) {
			start := len(args)
			name := zremArg
			if add {
				name = zaddArg
			}
			args = append(args, name, p.keys[k].box)
			for _, o := range p.ops {
				if o.key != k || o.add != add {
					continue
				}
				if add {
					args = append(args, o.score)
				}
				args = append(args, o.member)
			}
			out = append(out, args[start:start+size:start+size])
		}
		for k, w := range p.keys {
			if w.rems > 0 {
				cmd(k, false, 2+w.rems)
			}
		}
		for k, w := range p.keys {
			if w.adds > 0 {
				cmd(k, true, 2+2*w.adds)
			}
		}
	}
	return append(out, p.extra...)
}

// move adds the index writes that take job id from what old says (nil: no
// value before) to what new says (nil: no value after), writing only what
// really changes. hint names an index the caller found id in; when it is
// not where old says, the index was changed outside jobkey, so the hint is
// removed and the right entry written whatever old said (rule 3).
func (d *decider) move(p *indexPlan, shard int, id string, old, new *Job, hint string) {
	if m, ok := batchMoveOf(shard, old, new); ok {
		p.batch = append(p.batch, m)
	}
	if t, ok := stateChangeOf(shard, id, old, new); ok {
		p.moves = append(p.moves, t)
	}
	var from, to entry
	if old != nil {
		from = d.entryOf(old)
	}
	if new != nil {
		to = d.entryOf(new)
		if new.State == StatePending && new.Priority > 0 {
			// Readers that do not know the queue uses priorities learn it
			// from the flag; this process drops what it read ahead below
			// the job's priority before the EXEC (raised).
			p.raised = max(p.raised, new.Priority)
			p.flag(d.ks.index(shard, prioFlag))
		}
	}
	tampered := hint != "" && hint != from.index
	remFrom := from.index != "" && from.index != to.index
	remHint := tampered && hint != to.index && hint != from.index
	add := to.index != "" && (to != from || tampered)
	if !remFrom && !remHint && !add {
		return
	}
	var member any = id // converted once, for every write below
	if remFrom {
		p.zremBoxed(d.ks.index(shard, from.index), member)
	}
	if remHint {
		p.zremBoxed(d.ks.index(shard, hint), member)
	}
	if add {
		p.zaddBoxed(d.ks.index(shard, to.index), to.score, member)
	}
}

// write returns the casWrite storing j, with the retention expiry a
// finished job gets in the same EXEC that finishes it. j.UpdatedAt is the
// transaction's time. A job canceled while it ran keeps its key, and so its
// ID, at least until that run's lease ends, however short the retention
// (lastrun.go).
func (d *decider) write(key string, j *Job) casWrite {
	w := casWrite{key: key, job: j}
	if j.State.Finished() {
		w.ttl = max(d.retention(j), lastRunLeft(j, j.UpdatedAt))
	}
	return w
}
