package jobkey

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"
	"unsafe"

	"github.com/jobkey/jobkey/internal/msgpk"
	"github.com/jobkey/jobkey/internal/reply"
)

// Concurrency limits per key (docs/design.md, "Concurrency keys").
//
// A job enqueued with EnqueueOpts.ConcurrencyKey runs only while its key
// has a free slot. Each key has one value of its own, next to its jobs:
//
//	<prefix>:{<shard tag>}:ck:<key>   limit, active leases, waiting jobs
//
// and, like a job, it is only ever rewritten whole, by the compare-and-set
// that changes the job: a claim watches and reads the claimed job's key
// value and writes the job and the lease it adds in one EXEC, so the limit
// and the claim are one all-or-nothing change. Every write that ends or
// renews a keyed job's lease (Complete, Fail, Release, Extend, a claim
// that fails a job whose last lease ran out) rewrites the key's value in
// the same EXEC. A lease entry carries the job's lease deadline, so a
// lease that ran out frees its slot by itself: the next claim does not
// count it, and no sweeper is needed. A value with no limit of its own
// expires after its last lease (slotBook.linger), so one that no write
// touches again does not stay behind.
//
// A claim that finds the key full leaves the job pending and moves its
// ready entry to the time the first of the key's leases would run out, so
// claimers stop meeting it, and lists it in the key's waiting list. A
// write that frees a slot moves the first waiting jobs' entries back to
// their RunAt (ZADD XX LT: an entry that is no longer there, because the
// job was claimed, canceled or deleted meanwhile, is not recreated) and
// wakes the workers. A job is never stranded: at worst its entry comes due
// when the leases it waited for would have run out. Cancel, Retry, Update,
// Delete and the bulk actions read a keyed job's value too, and take the
// job off the waiting list when it no longer waits as listed (another
// state, RunAt or priority), so a freed slot never pulls its entry before
// its RunAt (slotBook.unlistMoved).

const (
	// maxWaiting bounds a key's waiting list. A job blocked while the list
	// is full still waits, by its entry's score, but is not pulled forward
	// when a slot frees: it comes due when the key's first lease would
	// have run out, and tries again.
	maxWaiting = 1000
	// pullGrace is how long a waiting job pulled forward keeps a slot in
	// mind before the list forgets it: it was claimed (and its lease
	// counts), or canceled, deleted or changed in between.
	pullGrace = 5 * time.Second
	// unreadableWait is how long a job waits when its key's value cannot
	// be read, before it is tried again.
	unreadableWait = time.Minute
	// slotFormat is the first element of a key's value with no rate limit;
	// slotFormatRate that of one with a rate limit (two elements more:
	// the limit and its period, and the recent starts). A key's value is
	// written in format 2 only once SetRateLimit gave it a rate, so a
	// build that reads format 1 only keeps working with every key that has
	// none.
	slotFormat     = 1
	slotFormatRate = 2
	// slotLinger is how long a key's value with no limit of its own
	// outlives the last of its leases before Redis expires it. Leases are
	// judged by the TIME of the server that holds the value, the clock its
	// expiry runs on, so the value is always there while one of them may
	// be in force; the margin only absorbs rounding to milliseconds.
	slotLinger = time.Second
)

// slotLease is one active job of a key: its ID, the lease token of the
// claim, and the lease deadline (unix ms), kept equal to the job's.
type slotLease struct {
	id    string
	token uint64
	until int64
}

// slotWait is a job that found its key full: where its ready entry belongs
// (priority, RunAt in unix ms), and when a freed slot pulled it forward (0:
// not yet).
type slotWait struct {
	id     string
	prio   int
	runAt  int64
	pulled int64
}

// slotValue is a concurrency key's value. limit 0 means Config's default.
// rate > 0 is the key's rate limit: at most rate claims of its jobs start
// within any period ms, judged by Redis's clock; starts holds the unix ms
// of the latest starts, oldest first, at most rate of them.
type slotValue struct {
	limit   int
	leases  []slotLease
	waiting []slotWait
	rate    int
	period  int64
	starts  []int64
}

// encode returns the value's bytes: [1, limit, leases, waiting], or, with
// a rate limit, [2, limit, leases, waiting, [rate, period ms], starts]. A
// value with nothing to keep is nil: its key is deleted.
func (v *slotValue) encode() []byte {
	if v.limit == 0 && len(v.leases) == 0 && len(v.waiting) == 0 && v.rate == 0 {
		return nil
	}
	var b []byte
	if v.rate > 0 {
		b = msgpk.AppendArrayHdr(nil, 6)
		b = msgpk.AppendUint(b, slotFormatRate)
	} else {
		b = msgpk.AppendArrayHdr(nil, 4)
		b = msgpk.AppendUint(b, slotFormat)
	}
	b = msgpk.AppendUint(b, uint64(v.limit))
	b = msgpk.AppendArrayHdr(b, len(v.leases))
	for _, l := range v.leases {
		b = msgpk.AppendArrayHdr(b, 3)
		b = msgpk.AppendStr(b, l.id)
		b = msgpk.AppendUint(b, l.token)
		b = msgpk.AppendInt(b, l.until)
	}
	b = msgpk.AppendArrayHdr(b, len(v.waiting))
	for _, w := range v.waiting {
		b = msgpk.AppendArrayHdr(b, 4)
		b = msgpk.AppendStr(b, w.id)
		b = msgpk.AppendUint(b, uint64(w.prio))
		b = msgpk.AppendInt(b, w.runAt)
		b = msgpk.AppendInt(b, w.pulled)
	}
	if v.rate > 0 {
		b = msgpk.AppendArrayHdr(b, 2)
		b = msgpk.AppendUint(b, uint64(v.rate))
		b = msgpk.AppendInt(b, v.period)
		b = msgpk.AppendArrayHdr(b, len(v.starts))
		for _, t := range v.starts {
			b = msgpk.AppendInt(b, t)
		}
	}
	return b
}

// decodeSlots decodes a key's value. Like the job codec, it never panics
// and allocates no more than the input holds: a malformed value is a
// *CorruptError, and is kept as it is by every caller.
func decodeSlots(s string) (slotValue, error) {
	var v slotValue
	if len(s) > MaxValueBytes {
		return v, fmt.Errorf("%w: concurrency value is %d bytes, limit %d", ErrTooLarge, len(s), MaxValueBytes)
	}
	d := newDecoder(unsafe.Slice(unsafe.StringData(s), len(s)), false)
	n, err := d.ArrayLen("concurrency value")
	if err != nil {
		return v, err
	}
	if n != 4 && n != 6 {
		return v, d.Corrupt("concurrency value", fmt.Sprintf("array of %d elements, want 4 or 6", n))
	}
	f, err := d.Uint("concurrency format", math.MaxUint32)
	switch {
	case err != nil:
		return v, err
	case f != slotFormat && f != slotFormatRate:
		return v, fmt.Errorf("%w: concurrency value format %d, this build reads %d and %d", ErrUnsupportedFormat, f, slotFormat, slotFormatRate)
	case f == slotFormat && n != 4, f == slotFormatRate && n != 6:
		return v, d.Corrupt("concurrency value", fmt.Sprintf("format %d with %d elements", f, n))
	}
	limit, err := d.Uint("limit", MaxConcurrencyLimit)
	if err != nil {
		return v, err
	}
	v.limit = int(limit)
	n, err = d.ArrayLen("leases")
	if err != nil {
		return v, err
	}
	v.leases = make([]slotLease, 0, min(n, 64)) // grown as read: n is only bounded by the bytes
	for range n {
		if m, err := d.ArrayLen("lease"); err != nil {
			return v, err
		} else if m != 3 {
			return v, d.Corrupt("lease", fmt.Sprintf("array of %d elements, want 3", m))
		}
		var l slotLease
		if l.id, err = d.Str("lease ID"); err != nil {
			return v, err
		}
		if l.token, err = d.Uint("lease token", math.MaxUint64); err != nil {
			return v, err
		}
		if l.until, err = d.Int("lease until", math.MinInt64, math.MaxInt64); err != nil {
			return v, err
		}
		v.leases = append(v.leases, l)
	}
	n, err = d.ArrayLen("waiting")
	if err != nil {
		return v, err
	}
	v.waiting = make([]slotWait, 0, min(n, 64))
	for range n {
		if m, err := d.ArrayLen("waiting job"); err != nil {
			return v, err
		} else if m != 4 {
			return v, d.Corrupt("waiting job", fmt.Sprintf("array of %d elements, want 4", m))
		}
		var w slotWait
		if w.id, err = d.Str("waiting ID"); err != nil {
			return v, err
		}
		p, err := d.Uint("waiting priority", MaxPriority)
		if err != nil {
			return v, err
		}
		w.prio = int(p)
		if w.runAt, err = d.Int("waiting RunAt", math.MinInt64, math.MaxInt64); err != nil {
			return v, err
		}
		if w.pulled, err = d.Int("waiting pulled", math.MinInt64, math.MaxInt64); err != nil {
			return v, err
		}
		v.waiting = append(v.waiting, w)
	}
	if f == slotFormatRate {
		if err := decodeRate(d, &v); err != nil {
			return v, err
		}
	}
	if d.Off != len(d.B) {
		return v, d.Corrupt("concurrency value", fmt.Sprintf("%d trailing bytes", len(d.B)-d.Off))
	}
	return v, nil
}

// slotKeyOf is the key of j's concurrency value in shard, or "" when j has
// no concurrency key.
func (d *decider) slotKeyOf(shard int, j *Job) string {
	if j == nil || j.ConcurrencyKey == "" {
		return ""
	}
	return d.ks.slotKey(shard, j.ConcurrencyKey)
}

// slotKeys names the concurrency values of the keyed jobs among jobs
// that want accepts (every one when want is nil), each once: jobs[k] is
// in shards[k].
func (q *Queue) slotKeys(jobs []*Job, shards []int, want func(*Job) bool) []string {
	var out []string
	for k, j := range jobs {
		if want != nil && j != nil && !want(j) {
			continue
		}
		if key := q.slotKeyOf(shards[k], j); key != "" && !slices.Contains(out, key) {
			out = append(out, key)
		}
	}
	return out
}

// slotFollow returns a casTxn.follow that names the concurrency values of
// the keyed jobs a transaction read: keys[k] is in shards[k].
func (q *Queue) slotFollow(shards []int) func(r *casRead) []string {
	return func(r *casRead) []string { return q.slotKeys(r.jobs, shards, nil) }
}

// slotFollowListed is slotFollow for writes outside the claim: it names
// the concurrency values of the pending keyed jobs read, the only ones a
// key's waiting list may hold (unlistMoved). Writes to other jobs watch
// no key value, and cost no round trip more.
func (q *Queue) slotFollowListed(shards []int) func(r *casRead) []string {
	return func(r *casRead) []string {
		return q.slotKeys(r.jobs, shards, func(j *Job) bool { return j.State == StatePending })
	}
}

// slotPredict names the concurrency values of the caller's copies of jobs,
// to be read in round trip 1: a fenced write knows its job's key before it
// reads the job. A key no stored job can hold is not read.
func (q *Queue) slotPredict(jobs []*Job, shards []int) []string {
	return q.slotKeys(jobs, shards, func(j *Job) bool { return len(j.ConcurrencyKey) <= MaxConcurrencyKeyLen })
}

// slotBook holds the concurrency values one decision reads and changes:
// each is decoded once, changed by every job of the transaction in turn,
// and written once, whole, by finish.
type slotBook struct {
	d     *decider
	r     *casRead
	now   int64 // Redis's clock, unix ms
	open  map[string]*slotEntry
	order []*slotEntry
}

// slotEntry is one key's value within a decision.
type slotEntry struct {
	key   string
	shard int
	v     slotValue
	err   error // the value cannot be read: it is never written
	dirty bool
	pulls []slotWait // waiting jobs this transaction pulls forward
}

func (d *decider) newSlotBook(r *casRead) *slotBook {
	return &slotBook{d: d, r: r, now: toMillis(r.now)} // open is made by the first keyed job: most transactions have none
}

// entry returns the value of j's key, read by the transaction; nil when j
// has no key.
func (b *slotBook) entry(shard int, j *Job) *slotEntry {
	key := b.d.slotKeyOf(shard, j)
	if key == "" {
		return nil
	}
	if e, ok := b.open[key]; ok {
		return e
	}
	e := &slotEntry{key: key, shard: shard}
	raw, ok := b.r.aux[key]
	switch {
	case !ok:
		e.err = fmt.Errorf("jobkey: internal error: concurrency value %q was not read", key)
	case raw.Err != nil:
		e.err = &WrongTypeError{Key: key, Want: "string", Got: "non-string"}
	case !raw.Missing:
		e.v, e.err = decodeSlots(raw.S)
	}
	if e.err != nil {
		b.d.cfg.Logger.Error("jobkey: a concurrency key's value cannot be read: it is kept as it is, and its jobs wait until it is repaired or deleted",
			"queue", b.d.name, "key", key, "err", e.err)
	}
	if b.open == nil {
		b.open = map[string]*slotEntry{}
	}
	b.open[key] = e
	b.order = append(b.order, e)
	return e
}

// limit is the key's limit: its own, or Config's default.
func (b *slotBook) limit(e *slotEntry) int {
	if e.v.limit > 0 {
		return e.v.limit
	}
	return b.d.cfg.ConcurrencyLimit
}

// live counts the leases that have not run out. A lease is one run's, by
// job ID and lease token: a live lease of a run canceled while it ran
// counts, even against a job enqueued again under its ID.
func (b *slotBook) live(e *slotEntry) int {
	n := 0
	for _, l := range e.v.leases {
		if l.until > b.now {
			n++
		}
	}
	return n
}

// take gives next, as a claim is about to write it, a slot of its key and
// a start of its rate: false when it is not next's turn (turn), its key's
// rate limit was reached within its period, or its value cannot be read.
func (b *slotBook) take(e *slotEntry, next *Job) bool {
	if e.err != nil || !b.turn(e, next) || b.rateFull(e) {
		return false
	}
	b.started(e)
	e.v.leases = append(e.v.leases, slotLease{id: next.ID, token: next.LeaseToken, until: toMillis(next.LeaseUntil)})
	e.v.waiting = slices.DeleteFunc(e.v.waiting, func(w slotWait) bool { return w.id == next.ID })
	e.dirty = true
	b.pull(e)
	return true
}

// turn says whether a free slot of its key is next's to take. A job pulled
// forward (within pullGrace) takes the slot held for it. Any other job
// takes only a slot beyond those held for pulled jobs, and only when no
// job listed as waiting is ahead of it (higher priority, or the same and
// an older RunAt): the slot is theirs, and the claim that refuses next
// pulls them forward (blocked). So a key's waiting jobs start in their
// order, not behind newer jobs that came due by themselves; the slack is
// a pulled job's grace, after which a listing nobody claimed (its job
// gone, or its claimers away) is forgotten.
func (b *slotBook) turn(e *slotEntry, next *Job) bool {
	free := b.limit(e) - b.live(e)
	if free <= 0 {
		return false
	}
	grace := b.now - pullGrace.Milliseconds()
	prio, runAt := next.Priority, toMillis(next.RunAt)
	held := 0
	for _, w := range e.v.waiting {
		switch {
		case w.pulled != 0 && w.pulled >= grace && w.id == next.ID:
			return true // its own slot
		case w.pulled != 0 && w.pulled >= grace:
			held++
		case w.pulled == 0 && w.id != next.ID && (w.prio > prio || w.prio == prio && w.runAt < runAt):
			return false // a waiting job ahead of it
		}
	}
	return free > held
}

// extend renews cur's lease in its key's value to next's deadline. A lease
// that ran out may have lost its slot to another claim: then the key may
// be full, and extend returns false (the caller's lease is lost).
func (b *slotBook) extend(e *slotEntry, cur, next *Job) bool {
	if e.err != nil {
		return true // nothing to count against; the job's own lease still holds
	}
	i := slices.IndexFunc(e.v.leases, func(l slotLease) bool { return l.id == cur.ID && l.token == cur.LeaseToken })
	if i < 0 || e.v.leases[i].until <= b.now {
		if b.live(e) >= b.limit(e) {
			return false
		}
		e.v.leases = slices.DeleteFunc(e.v.leases, func(l slotLease) bool { return l.id == cur.ID && l.token == cur.LeaseToken })
		e.v.leases = append(e.v.leases, slotLease{id: cur.ID, token: next.LeaseToken, until: toMillis(next.LeaseUntil)})
	} else {
		e.v.leases[i].until = toMillis(next.LeaseUntil)
	}
	e.dirty = true
	return true
}

// release removes the lease of job id's run under token, and pulls waiting
// jobs forward into the slots free now.
func (b *slotBook) release(e *slotEntry, id string, token uint64) {
	if e.err != nil {
		return
	}
	e.v.leases = slices.DeleteFunc(e.v.leases, func(l slotLease) bool { return l.id == id && l.token == token })
	e.dirty = true
	b.pull(e)
}

// unlist drops job id's listing among the key's waiting jobs, and pulls
// the next waiting jobs forward into the slot a pulled listing held in
// mind. A write outside the claim that moves a keyed job's entry (Cancel,
// Retry, Update of its RunAt or Priority, Delete, a claim that fails it)
// unlists it: a listing keeps the RunAt and priority the job had when it
// was listed, and pulling a stale one forward would move the job's entry
// to a RunAt it no longer has.
func (b *slotBook) unlist(e *slotEntry, id string) {
	if e == nil || e.err != nil || !slices.ContainsFunc(e.v.waiting, func(w slotWait) bool { return w.id == id }) {
		return
	}
	e.v.waiting = slices.DeleteFunc(e.v.waiting, func(w slotWait) bool { return w.id == id })
	e.dirty = true
	b.pull(e)
}

// unlistMoved unlists old, a job stored in shard, when a write outside the
// claim takes its entry from where old says (next nil: the job is
// deleted). Only a pending job is listed (a claim unlists the job it
// takes), and one whose entry stays where it is keeps its listing.
func (b *slotBook) unlistMoved(shard int, old, next *Job) {
	if old == nil || old.ConcurrencyKey == "" || old.State != StatePending || next != nil && derive(old) == derive(next) {
		return
	}
	b.unlist(b.entry(shard, old), old.ID)
}

// pull moves the first waiting jobs forward, as many as there are free
// slots that no job pulled forward recently is about to take. A job pulled
// forward longer than pullGrace ago is forgotten.
func (b *slotBook) pull(e *slotEntry) {
	grace := b.now - pullGrace.Milliseconds()
	if n := len(e.v.waiting); n > 0 {
		e.v.waiting = slices.DeleteFunc(e.v.waiting, func(w slotWait) bool { return w.pulled != 0 && w.pulled < grace })
		e.dirty = e.dirty || len(e.v.waiting) < n
	}
	reserved := 0
	for _, w := range e.v.waiting {
		if w.pulled != 0 {
			reserved++
		}
	}
	free := b.limit(e) - b.live(e) - reserved
	for i := range e.v.waiting {
		if free <= 0 {
			break
		}
		if w := &e.v.waiting[i]; w.pulled == 0 {
			w.pulled = b.now
			p := *w
			if b.rateFull(e) {
				// The slot is free, the rate is not yet: the job comes
				// due when the rate lets it start (or is looked at again
				// within rateRecheck).
				p.runAt = max(p.runAt, min(b.rateFreeAt(e), b.now+rateRecheck.Milliseconds()))
			}
			e.pulls = append(e.pulls, p)
			e.dirty = true
			free--
		}
	}
}

// park lists cur, blocked by its key's limit, among the key's waiting jobs,
// and returns when its ready entry should come due again: when the first
// of the key's leases would run out, and no sooner than its rate limit
// lets a job start. A job held back by the rate limit alone is not listed
// (a freed slot would not let it start): its entry comes due when the
// rate does, or within rateRecheck, so that a rate an operator raised or
// removed meanwhile holds no job back for longer.
func (b *slotBook) park(e *slotEntry, cur *Job) int64 {
	if e.err != nil {
		return b.now + unreadableWait.Milliseconds()
	}
	rateAt := int64(0)
	if b.rateFull(e) {
		rateAt = min(b.rateFreeAt(e), b.now+rateRecheck.Milliseconds())
	}
	i := slices.IndexFunc(e.v.waiting, func(o slotWait) bool { return o.id == cur.ID })
	if rateAt > 0 && b.turn(e, cur) {
		// Held back by the rate alone.
		if i >= 0 {
			e.v.waiting = slices.Delete(e.v.waiting, i, i+1)
			e.dirty = true
		}
		return max(rateAt, b.now+1)
	}
	w := slotWait{id: cur.ID, prio: cur.Priority, runAt: toMillis(cur.RunAt)}
	switch {
	case i >= 0 && e.v.waiting[i] == w:
		// Listed already, as it is: a claim that met it again (read ahead
		// before it was moved) has nothing to write in the key's value.
	case i >= 0 || len(e.v.waiting) < maxWaiting:
		if i >= 0 {
			// Pulled forward and beaten to the slot, or changed since it
			// was listed: listed again, in its place by what it is now.
			e.v.waiting = slices.Delete(e.v.waiting, i, i+1)
		}
		// Highest priority first, then oldest RunAt; jobs pulled forward
		// keep their place.
		k := len(e.v.waiting)
		for k > 0 && e.v.waiting[k-1].pulled == 0 && (e.v.waiting[k-1].prio < w.prio ||
			e.v.waiting[k-1].prio == w.prio && e.v.waiting[k-1].runAt > w.runAt) {
			k--
		}
		e.v.waiting = slices.Insert(e.v.waiting, k, w)
		e.dirty = true
	}
	next := int64(math.MaxInt64)
	for _, l := range e.v.leases {
		if l.until > b.now {
			next = min(next, l.until)
		}
	}
	if next == math.MaxInt64 {
		next = b.now + time.Second.Milliseconds()
	}
	return max(next, rateAt, b.now+1)
}

// finish adds the writes of every changed value to the plan: the value
// whole (or its deletion when nothing is left in it), with its expiry
// (linger), the entries of the jobs pulled forward moved back to their
// RunAt, and a wake-up.
func (b *slotBook) finish(plan *casPlan, ip *indexPlan) {
	for _, e := range b.order {
		if !e.dirty || e.err != nil {
			continue
		}
		// Leases that ran out count for nothing: dropped here, once, for
		// every change.
		e.v.leases = slices.DeleteFunc(e.v.leases, func(l slotLease) bool { return l.until <= b.now })
		plan.aux = append(plan.aux, auxWrite{key: e.key, val: e.v.encode(), ttl: b.linger(e)})
		top := -1
		for _, w := range e.pulls {
			key := b.d.ks.index(e.shard, readyIndex(w.prio))
			ip.use(key) // its type is checked before MULTI
			ip.extra = append(ip.extra, []any{"zadd", key, "XX", "LT", w.runAt, w.id})
			top = max(top, w.prio)
		}
		if top >= 0 {
			ip.extra = append(ip.extra, []any{"publish", b.d.ks.wakeChannel(), wakeHint(top)})
		}
	}
}

// linger is how long e's value, as finish writes it, may live: for ever
// when the key has a limit of its own (SetConcurrencyLimit or SetRateLimit
// stored it there), else until its last lease would run out (and, while jobs wait,
// at least pullGrace), plus slotLinger. A value no write touches again,
// such as one whose only lease was a run canceled while it ran, so goes by
// itself once nothing in it counts; a write before then sets its expiry
// again. A value that expired held nothing a claim would count: a lost
// waiting list only means its jobs come due by their parked entries.
func (b *slotBook) linger(e *slotEntry) time.Duration {
	if e.v.limit > 0 || e.v.rate > 0 {
		return 0
	}
	end := b.now
	if len(e.v.waiting) > 0 {
		end += pullGrace.Milliseconds()
	}
	for _, l := range e.v.leases {
		end = max(end, l.until)
	}
	return time.Duration(end-b.now)*time.Millisecond + slotLinger
}

// blocked decides about cur, a keyed job a claim would take but whose key
// is full: it stays (or, when its lease ran out, goes back to) pending,
// listed as waiting, with its ready entry moved to when a slot may free.
func (d *decider) blocked(plan *casPlan, ip *indexPlan, b *slotBook, e *slotEntry, c candidate, key string, cur *Job, now time.Time) {
	next := cur
	if cur.State == StateActive {
		// Its lease ran out, and its slot went to another job meanwhile
		// (or is held for a job waiting ahead of it), or the key's rate
		// lets none start now.
		next = cloneJob(cur)
		next.State = StatePending
		next.RunAt = now
		why := "a slot"
		if e.err == nil && b.turn(e, next) {
			why = "the rate limit"
		}
		next.LastError = fmt.Sprintf("lease of attempt %d/%d (worker %q) expired before it finished; waiting for %s of concurrency key %q",
			cur.Attempt, cur.MaxAttempts, cur.LeaseOwner, why, cur.ConcurrencyKey)
		next.UpdatedAt = now
		plan.writes = append(plan.writes, d.write(key, next))
		b.release(e, cur.ID, cur.LeaseToken)
	}
	d.move(ip, c.Shard, c.ID, cur, next, c.Index)
	ip.rescore(d.ks.index(c.Shard, readyIndex(next.Priority)), b.park(e, next), c.ID)
	if e.err == nil {
		// A free slot it was refused goes to the jobs waiting ahead of it.
		b.pull(e)
	}
}

// SetConcurrencyLimit sets the limit of concurrency key key: at most n jobs
// of the queue with that key are active at once. n = 0 gives the key
// Config.ConcurrencyLimit again. Lowering a limit stops no running job:
// new claims wait until the key is under it. The limit is stored in Redis,
// in the key's value, so it holds for every process; one compare-and-set.
func (q *Queue) SetConcurrencyLimit(ctx context.Context, key string, n int) error {
	if n < 0 || n > MaxConcurrencyLimit {
		return fmt.Errorf("%w: concurrency limit is %d, want 0..%d", ErrInvalid, n, MaxConcurrencyLimit)
	}
	return q.changeSlotValue(ctx, "SetConcurrencyLimit", key, func(v *slotValue) bool {
		if v.limit == n {
			return false
		}
		v.limit = n // a higher limit frees slots now: changeSlotValue pulls
		return true
	})
}

// changeSlotValue applies change to the value of concurrency key key in
// one compare-and-set: the operator's settings (its limit, its rate). A
// change that returns false writes nothing; one that changes the value
// pulls waiting jobs forward into the slots it may have freed, in the same
// EXEC. A value that cannot be read is refused and kept as it is.
func (q *Queue) changeSlotValue(ctx context.Context, call, key string, change func(v *slotValue) bool) error {
	if err := q.check(ctx, true); err != nil {
		return err
	}
	if key == "" {
		return fmt.Errorf("%w: %s of an empty key", ErrInvalid, call)
	}
	if err := validConcurrencyKey(key); err != nil {
		return err
	}
	shard := q.ks.shardOf(key)
	probe := &Job{ConcurrencyKey: key}
	_, _, err := q.run(ctx, &casTxn{aux: []string{q.slotKeyOf(shard, probe)}, decide: func(r *casRead) (*casPlan, error) {
		b := q.newSlotBook(r)
		e := b.entry(shard, probe)
		if e.err != nil {
			return nil, e.err
		}
		if !change(&e.v) {
			return nil, nil
		}
		e.dirty = true
		b.pull(e)
		plan := &casPlan{}
		var ip indexPlan
		b.finish(plan, &ip)
		plan.index(&ip)
		return plan, nil
	}})
	return err
}

// ConcurrencyInfo is where a concurrency key stands.
type ConcurrencyInfo struct {
	Key     string // the concurrency key
	Limit   int    // its limit: its own, or else this Queue's Config.ConcurrencyLimit
	Own     bool   // the limit was set by SetConcurrencyLimit, and is stored in Redis
	Active  int    // leases that have not run out
	Waiting int    // jobs listed as waiting for a slot

	// Rate and RatePeriod are the key's rate limit (SetRateLimit): at
	// most Rate starts within any RatePeriod. 0: none.
	Rate       int
	RatePeriod time.Duration
	// Started counts the key's starts within the RatePeriod before now
	// (0 without a rate limit).
	Started int
	// Err, from ConcurrencyKeys, says the key's value could not be read
	// (left as it is); the fields but Key are then empty.
	Err error
}

// Concurrency reads where concurrency key key stands: its limit, its
// active leases and its waiting jobs. A key without a limit of its own
// (Own false) is held by the Config.ConcurrencyLimit of each worker's
// Queue, which Redis does not store: Limit is then this Queue's, which
// says nothing of the workers' unless every process has the same. One round trip: a plain GET, no
// WATCH (which would cost an UNWATCH), and leases counted by the estimate
// of Redis's clock, as Stats counts due jobs.
func (q *Queue) Concurrency(ctx context.Context, key string) (ConcurrencyInfo, error) {
	if err := q.check(ctx, false); err != nil {
		return ConcurrencyInfo{}, err
	}
	if key == "" {
		return ConcurrencyInfo{}, fmt.Errorf("%w: Concurrency of an empty key", ErrInvalid)
	}
	if err := validConcurrencyKey(key); err != nil {
		return ConcurrencyInfo{}, err
	}
	shard := q.ks.shardOf(key)
	probe := &Job{ConcurrencyKey: key}
	slot := q.slotKeyOf(shard, probe)
	now, err := q.clock.Now(ctx, q.rdb)
	if err != nil {
		return ConcurrencyInfo{}, err
	}
	raw := reply.FromGet(q.rdb.Get(ctx, slot))
	if raw.Err != nil && !reply.IsWrongType(raw.Err) {
		return ConcurrencyInfo{}, fmt.Errorf("jobkey: get %s: %w", slot, raw.Err)
	}
	b := q.newSlotBook(&casRead{now: now, aux: map[string]rawRead{slot: raw}})
	e := b.entry(shard, probe)
	if e.err != nil {
		return ConcurrencyInfo{}, e.err
	}
	info := ConcurrencyInfo{Key: key, Limit: b.limit(e), Own: e.v.limit > 0, Active: b.live(e), Waiting: len(e.v.waiting)}
	if e.v.rate > 0 {
		info.Rate, info.RatePeriod, info.Started = e.v.rate, time.Duration(e.v.period)*time.Millisecond, b.recent(e)
	}
	return info, nil
}
