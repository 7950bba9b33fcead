package jobkey

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jobkey/jobkey/internal/cas"
	"github.com/jobkey/jobkey/internal/readahead"
	"github.com/jobkey/jobkey/internal/reply"

	"github.com/redis/go-redis/v9"
)

// A Work runner that finishes a job and wants the next one completes the
// first and claims the second in one compare-and-set, as BullMQ's
// moveToFinished returns the next job: both keys are watched and read in
// round trip 1, and both written in one MULTI/EXEC. The candidate comes
// from due entries read ahead, in a round trip that was being made anyway
// (the previous complete-and-claim transaction's, or a claim's), so finishing one job
// and starting the next costs two round trips. Every rule holds: each job
// is decided under its own WATCH, the completion is fenced on its lease
// token, the claim is decided from the candidate's value, types are checked
// before MULTI, and on a cluster a pair goes in one transaction only within one hash slot.

// finishIn is one runner's request: complete job with result, and claim the
// next due job for worker ("" wants none). more asks for that many jobs
// besides, claimed for worker too: a Work's claims ahead of its free
// slots (workahead.go).
type finishIn struct {
	job    *Job
	result []byte
	worker string
	more   int
}

// finishOut is its answer: the job as completed, and the next job claimed
// for the runner, if one was. unsure is set instead of next when the EXEC's
// reply was lost: the job as the transaction would have claimed it, for
// the runner to look for by its lease token.
type finishOut struct {
	done   *Job
	next   *Job
	unsure *Job
	// more and unsureMore are the jobs claimed besides next (finishIn.more),
	// as next and unsure are.
	more, unsureMore []*Job
}

// claimed returns every job o claimed: next, then more.
func (o finishOut) claimed() []*Job {
	if o.next == nil {
		return o.more
	}
	return append([]*Job{o.next}, o.more...)
}

// completeAndClaim completes j with result and, in the same transaction,
// claims a due job for worker when one is known. The error is the
// completion's: next may be set even when the completion failed (its lease
// was lost), and is nil when the transaction itself failed.
func (q *Queue) completeAndClaim(ctx context.Context, j *Job, result []byte, worker string) (finishOut, error) {
	if err := q.checkJob(j); err != nil {
		return finishOut{}, err
	}
	if err := q.resultFits(j, result); err != nil {
		return finishOut{}, err
	}
	if q.finishes == nil {
		done, err := q.Complete(ctx, j, result)
		return finishOut{done: done}, err
	}
	return q.finishes.Do(ctx, finishIn{job: j, result: result, worker: worker})
}

// flushFinishes serves a batch of completeAndClaim calls: one transaction
// per set of txnSets (per shard on a cluster).
func (q *Queue) flushFinishes(ctx context.Context, batch []*cas.Call[finishIn, finishOut]) {
	if batch = cas.Live(batch); len(batch) == 0 {
		return
	}
	// A job finished twice in one batch (two runners holding it, one of them
	// stale) goes in a transaction of its own: one transaction must not
	// decide about one job twice, and the others must not pay for it.
	var pos, again []int
	seen := map[string]bool{}
	for i, c := range batch {
		if seen[c.In().job.ID] {
			again = append(again, i)
			continue
		}
		seen[c.In().job.ID] = true
		pos = append(pos, i)
	}
	sets := q.txnSets(pos, func(i int) string { return batch[i].In().job.ID })
	if q.cluster() {
		q.probeGone()
	}
	if q.cluster() && q.pool.RefreshDue() {
		// A cluster's transaction reads ahead only its own shard: every
		// shard is read beside it, before the pool stops serving. Not
		// those whose node could not be reached: the flush waits for this
		// read, and probeGone looks at them again.
		var refresh sync.WaitGroup
		defer refresh.Wait()
		refresh.Go(func() {
			v, err := q.dueIn(ctx, aheadN, q.pool.Reachable())
			if err == nil {
				q.pool.Fill(v)
			}
			q.pool.Refreshed()
		})
	}
	if q.cluster() && len(sets) > 1 {
		// A cluster's shards: their transactions run at once, each on a
		// connection of its own, since Work's runners spread over the
		// shards (duePool serves them in turn).
		var txns sync.WaitGroup
		for _, set := range sets[1:] {
			txns.Go(func() {
				ctx, release := cas.WithConnCache(ctx)
				defer release()
				q.finishSet(ctx, batch, set)
			})
		}
		q.finishSet(ctx, batch, sets[0])
		txns.Wait()
	} else {
		for _, set := range sets {
			q.finishSet(ctx, batch, set)
		}
	}
	for _, i := range again {
		q.finishSet(ctx, batch, []int{i})
	}
}

// finishSet runs the transaction of one set of a batch of finishes, and
// answers the callers it could not serve.
func (q *Queue) finishSet(ctx context.Context, batch []*cas.Call[finishIn, finishOut], set []int) {
	err := q.finishTxn(ctx, batch, set)
	switch {
	case err == nil:
	case len(set) > 1 && refusedWhole(err):
		for _, i := range set { // each on its own, so one broken job does not refuse the others
			if err := q.finishTxn(ctx, batch, []int{i}); err != nil {
				batch[i].Finish(finishOut{}, err)
			}
		}
	default:
		for _, i := range set {
			batch[i].Finish(finishOut{}, err)
		}
	}
}

// finishTxn completes the jobs of batch[set...] and claims, from the due
// entries read ahead, a job for each caller that wants one, in one
// compare-and-set; it answers the callers when it commits. It runs in
// three steps: plan the transaction, run it, and settle what it did.
func (q *Queue) finishTxn(ctx context.Context, batch []*cas.Call[finishIn, finishOut], set []int) error {
	fs := q.planFinish(batch, set)
	asked := time.Now() // the claims' leases are measured from here
	_, done, err := q.run(ctx, fs.txn)
	return q.settleFinish(ctx, fs, done, asked, err)
}

// finishSet is one complete-and-claim transaction: its callers, the candidates taken
// for them, what round trip 1 reads ahead, and what its latest decision
// made of them.
type finishSet struct {
	batch   []*cas.Call[finishIn, finishOut]
	set     []int    // positions in batch
	ids     []string // the jobs completed, per position in set
	keys    []string
	shards  []int
	cands   []candidate // keys[len(set):] are theirs
	guardOf []int       // per candidate, its shard's pause flag in the casTxn's guards
	wanting []int       // positions in set whose caller wants a next job
	txn     *casTxn
	ahead   *aheadPlan // nil: no read ahead
	view    dueView    // what the read ahead found

	out  []finishOut
	errs []error
	lost []candidate
}

// planFinish builds the transaction of batch[set...]: the jobs to
// complete, the candidates taken from the pool for the callers that want a
// next job, the keys and types to check, and the due entries to read
// ahead in round trip 1.
func (q *Queue) planFinish(batch []*cas.Call[finishIn, finishOut], set []int) *finishSet {
	fs := &finishSet{batch: batch, set: set, ids: make([]string, len(set)),
		out: make([]finishOut, len(set)), errs: make([]error, len(set))}
	for k, i := range set {
		in := batch[i].In()
		fs.ids[k] = in.job.ID
		if in.worker != "" {
			for range 1 + max(in.more, 0) {
				fs.wanting = append(fs.wanting, k)
			}
		}
	}
	keys, shards, checks := q.txnKeys(fs.ids, idxLeased, idxSucceeded)
	shard := readahead.AnyShard // a single Redis takes candidates of every shard
	if q.cluster() {
		shard = shards[0] // one hash slot: while no other shard's turn has come (readahead.Pool.Take)
	}
	inTxn := make(map[string]bool, len(keys)+len(fs.wanting))
	for _, k := range keys {
		inTxn[k] = true
	}
	for _, c := range q.pool.Take(len(fs.wanting), shard) {
		if key := q.ks.jobKey(c.Shard, c.ID); !inTxn[key] {
			inTxn[key] = true
			fs.cands = append(fs.cands, c)
			keys = append(keys, key)
		}
	}
	q.pool.Served(fs.cands)
	fs.keys, fs.shards = keys, shards
	// The candidates' pause flags are watched; the flags of the shards read
	// ahead are read in the same MGET.
	flags, guardOf := q.shardGuards(fs.cands)
	fs.guardOf = guardOf
	fs.ahead = q.planAhead(shards, len(fs.wanting))
	var read func(ctx context.Context, p redis.Pipeliner) func(*casRead) error
	if fs.ahead != nil {
		prio := !q.prios.Load()
		for _, s := range fs.ahead.shards {
			flags.add(q.ks, s, prio)
		}
		read = func(ctx context.Context, p redis.Pipeliner) func(*casRead) error {
			return q.readAhead(ctx, p, fs.ahead, flags, &fs.view)
		}
	}
	for _, k := range q.indexKeys(fs.cands, idxLeased) {
		if !slices.ContainsFunc(checks, func(c typeCheck) bool { return c.Key == k }) {
			checks = append(checks, typeCheck{Key: k, Want: "zset"})
		}
	}
	all := slices.Clone(shards)
	mine := make([]*Job, len(set))
	for k, i := range set {
		mine[k] = batch[i].In().job
	}
	for _, c := range fs.cands {
		all = append(all, c.Shard)
	}
	checks = q.pullChecks(checks, mine, shards, []string{idxLeased, idxSucceeded})
	checks = fs.ahead.typing(q.ks, checks)
	fs.txn = &casTxn{keys: keys, checks: checks, extra: read, guards: flags.keys,
		aux: append(q.slotPredict(mine, shards), q.batchPredict(mine, []string{idxSucceeded})...), follow: q.slotFollow(all),
		decide: func(r *casRead) (*casPlan, error) {
			p := q.decideFinish(fs, r)
			p.checks = fs.ahead.untyped(p.checks)
			return p, nil
		}}
	return fs
}

// settleFinish answers the callers of a complete-and-claim transaction that ran with
// err: each completion with its outcome, each claim once confirmed; and
// fills the pool with what it read ahead.
func (q *Queue) settleFinish(ctx context.Context, fs *finishSet, done *casPlan, asked time.Time, err error) error {
	out, errs := fs.out, fs.errs
	if errors.Is(err, ErrOutcomeUnknown) {
		q.recoverClaims(fs, err)
	}
	if errors.Is(err, ErrNotReplicated) {
		// Committed on the master, not yet confirmed: each completion is
		// answered with the error, for its caller to retry (it recognises
		// its own write, and waits again), and each claim is handed over
		// only once confirmed, as claimTxn's are.
		for k := range errs {
			if errs[k] == nil {
				errs[k] = err
			}
		}
		var all []*Job
		for k := range out {
			all = append(all, out[k].claimed()...)
		}
		q.confirmClaims(ctx, all, asked, err)
		for k := range out {
			o := &out[k]
			n := len(o.claimed())
			got := slices.DeleteFunc(all[:n:n], func(j *Job) bool { return j == nil })
			all = all[n:]
			o.next, o.more = nil, nil
			if len(got) > 0 {
				o.next, o.more = got[0], got[1:]
			}
		}
		err = nil
	}
	if err != nil {
		return err
	}
	q.settleLostHints(ctx, done, fs.lost)
	if fs.ahead != nil {
		// The due entries read ahead go to the pool, less the jobs this
		// very transaction claimed or completed.
		used := make(map[string]bool, len(fs.ids)+len(out))
		for _, id := range fs.ids {
			used[id] = true
		}
		for _, o := range out {
			for _, j := range o.claimed() {
				used[j.ID] = true
			}
		}
		fs.view.Cands = slices.DeleteFunc(fs.view.Cands, func(c candidate) bool { return used[c.ID] })
		q.pool.Fill(fs.view)
	}
	for k, i := range fs.set {
		if errs[k] != errLeftOut {
			fs.batch[i].Finish(out[k], errs[k])
		}
	}
	return nil
}

// decideFinish decides a complete-and-claim transaction from what round trip 1 read:
// each completion fenced on its lease token, then the candidates, each
// claimed from its own value for the next caller that wants a job.
func (q *Queue) decideFinish(fs *finishSet, r *casRead) *casPlan {
	plan := &casPlan{}
	var ip indexPlan
	b := q.newSlotBook(r)
	fs.lost = fs.lost[:0]
	for k, i := range fs.set {
		fs.out[k], fs.errs[k] = finishOut{}, nil
		in := fs.batch[i].In()
		if fs.batch[i].Gone() {
			fs.errs[k] = errLeftOut
			continue
		}
		f := fencedWrite{key: fs.keys[k], shard: fs.shards[k], j: in.job, done: completed, fn: succeed(in.result)}
		fs.out[k].done, fs.errs[k] = q.decideFenced(plan, &ip, b, f, r.jobs[k], r.errs[k], r.now)
	}
	w := 0
	for ci, c := range fs.cands {
		for w < len(fs.wanting) && fs.errs[fs.wanting[w]] == errLeftOut {
			w++
		}
		if w == len(fs.wanting) {
			break
		}
		if r.guarded[fs.guardOf[ci]] {
			continue // its shard is paused
		}
		k := len(fs.set) + ci
		worker := fs.batch[fs.set[fs.wanting[w]]].In().worker
		claimed, lost := q.decideCandidate(plan, &ip, b, c, fs.keys[k], r.jobs[k], r.errs[k], worker, r.now)
		if claimed != nil {
			if o := &fs.out[fs.wanting[w]]; o.next == nil {
				o.next = claimed
			} else {
				o.more = append(o.more, claimed)
			}
			w++
		}
		if lost {
			fs.lost = append(fs.lost, c)
		}
	}
	b.finish(plan, &ip)
	plan.index(&ip)
	return plan
}

// recoverClaims answers the callers of a complete-and-claim transaction whose EXEC was
// sent and whose reply was lost. The completions are left to the callers,
// which retry them and recognise their own writes. Each claim is handed
// over as unsure: the job as the last decision claimed it, with the lease
// token it chose, for the caller to look for (worker.findClaim), so it is
// not left under a lease nobody holds, spending an attempt it never ran.
func (q *Queue) recoverClaims(fs *finishSet, err error) {
	for k, i := range fs.set {
		if fs.errs[k] != errLeftOut {
			fs.batch[i].Finish(finishOut{unsure: fs.out[k].next, unsureMore: fs.out[k].more}, err)
		}
	}
}

// indexKeys returns the index keys a claim of the candidates may write:
// each one's own index, and the named indexes of their shards.
func (q *Queue) indexKeys(cands []candidate, names ...string) []string {
	var out []string
	for _, c := range cands {
		for _, n := range append([]string{c.Index}, names...) {
			if k := q.ks.index(c.Shard, n); !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	return out
}

// aheadOf returns the shards a complete-and-claim transaction that completes jobs of
// shards reads ahead. On a cluster, theirs: the read rides the connection
// of their hash slot's node. On a single Redis, every shard when there are at
// most claimShards; else theirs and up to claimShards more whose read in
// the pool is getting old, so the pool goes on serving with a fresh read
// of every shard (see duePool).
func (q *Queue) aheadOf(shards []int) []int {
	switch {
	case q.cluster():
		return shards
	case q.ks.shards <= claimShards:
		return q.upShards(nil)
	}
	var own []int
	for _, s := range shards {
		if !slices.Contains(own, s) {
			own = append(own, s)
		}
	}
	return append(own, q.pool.Stale(own, claimShards)...)
}

// aheadPlan is what a complete-and-claim transaction reads ahead: the due indexes idx
// of shards, and which keys of the transaction's type checks that read
// types in its stead.
type aheadPlan struct {
	shards []int
	idx    []dueIndex
	typed  map[string]bool
}

// planAhead returns what a complete-and-claim transaction that completes jobs of shards
// for callers of whom want want a next job reads ahead, or nil when the
// pool holds enough candidates, fresh, for the takes that follow
// (duePool.holds; on a cluster, of those shards: the other shards are read
// apart, see flushFinishes). Most batches of a busy Work then read no
// index: its read and the pool's refill cost more than the transaction's
// own commands.
func (q *Queue) planAhead(shards []int, want int) *aheadPlan {
	var in []int
	if q.cluster() {
		in = shards
	}
	if q.pool.Holds(want, in) {
		return nil
	}
	a := &aheadPlan{idx: q.dueIdx()} // once: every shard reads the same indexes
	for _, s := range q.aheadOf(shards) {
		if !slices.Contains(a.shards, s) {
			a.shards = append(a.shards, s)
		}
	}
	return a
}

// typing returns checks less the zset checks of the indexes a reads: its
// ZRANGEBYSCORE of each, in the same round trip under the same WATCH,
// types the key as TYPE would (a key of another type answers WRONGTYPE),
// and readAhead refuses the transaction then, before MULTI (rule 5). a may
// be nil: nothing is read ahead.
func (a *aheadPlan) typing(ks *keyspace, checks []typeCheck) []typeCheck {
	if a == nil {
		return checks
	}
	read := make(map[string]bool, len(a.shards)*len(a.idx))
	for _, s := range a.shards {
		for _, d := range a.idx {
			read[ks.index(s, d.index)] = true
		}
	}
	a.typed = map[string]bool{}
	return slices.DeleteFunc(checks, func(c typeCheck) bool {
		if c.Want == "zset" && read[c.Key] {
			a.typed[c.Key] = true
			return true
		}
		return false
	})
}

// untyped returns a plan's checks less those the read ahead makes: the
// engine would otherwise type them again in a round trip of its own.
func (a *aheadPlan) untyped(checks []typeCheck) []typeCheck {
	if a == nil || len(a.typed) == 0 {
		return checks
	}
	return slices.DeleteFunc(checks, func(c typeCheck) bool { return c.Want == "zset" && a.typed[c.Key] })
}

// readAhead adds to a pipeline the reads of the due entries a names (up
// to aheadN of each index), and returns what, once round trip 1 is read,
// turns their replies into a view in *into, for the pool: less the shards
// whose pause flag flags (the transaction's guards) found set, and nothing
// when it found a priority flag set while the read left out the priority
// indexes. It refuses the transaction when an index whose type check the
// read stands in for (a.typed) could not be read as a sorted set.
func (q *Queue) readAhead(ctx context.Context, p redis.Pipeliner, a *aheadPlan, flags *shardFlags, into *dueView) func(*casRead) error {
	sent := time.Now()
	now, _ := q.clock.Estimate()
	upTo := strconv.FormatInt(toMillis(now), 10)
	type read struct {
		shard int
		key   string
		due   dueIndex
		cmd   *redis.StringSliceCmd
	}
	reads := make([]read, 0, len(a.shards)*len(a.idx))
	for _, s := range a.shards {
		for _, d := range a.idx {
			key := q.ks.index(s, d.index)
			by := &redis.ZRangeBy{Min: "-inf", Max: upTo, Count: int64(aheadN)}
			reads = append(reads, read{s, key, d, p.ZRangeByScore(ctx, key, by)})
		}
	}
	return func(r *casRead) error {
		*into = dueView{Full: -1, At: sent}
		for _, rd := range reads {
			if err := rd.cmd.Err(); err != nil && a.typed[rd.key] {
				if reply.IsWrongType(err) {
					return &WrongTypeError{Key: rd.key, Want: "zset", Got: "non-zset"}
				}
				return fmt.Errorf("jobkey: read %s: %w", rd.key, err)
			}
		}
		if q.sawPrioFlag(flags, r.guarded) {
			return nil // the queue uses priorities this read did not look at: nothing to pool
		}
		into.Shards = a.shards
		// An ID in two indexes (a stray entry) is a candidate once: one
		// transaction must not decide about one job twice. One index
		// read holds each member once by itself.
		var seen map[string]bool
		if len(reads) > 1 {
			seen = map[string]bool{}
		}
		n := 0
		for _, rd := range reads {
			n += len(rd.cmd.Val())
		}
		into.Cands = make([]candidate, 0, n)
		newer := q.newerFormat.Size() > 0
		for _, rd := range reads {
			if flags.paused(r.guarded, rd.shard) {
				continue
			}
			ids := rd.cmd.Val()
			if len(ids) == aheadN {
				into.Full = max(into.Full, rd.due.prio)
			}
			for _, id := range ids {
				if !seen[id] && !(newer && q.newerFormat.Has(id)) {
					if seen != nil {
						seen[id] = true
					}
					into.Cands = append(into.Cands, candidate{Shard: rd.shard, ID: id, Index: rd.due.index, Prio: rd.due.prio})
				}
			}
		}
		q.sawPriorities(into.Cands)
		into.Cands = keepTopPriorities(into.Cands, into.Full)
		return nil
	}
}
