package jobkey

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// errRefusedByCaller is what the caller's function of a transaction
// returns when the model draws a refusal: nothing is written.
var errRefusedByCaller = errors.New("refused by the caller's function")

// mjob is the model's view of one job.
type mjob struct {
	state      State
	attempt    int
	max        int
	runAt      time.Time
	owner      string
	token      uint64
	leaseUntil time.Time
	lastErr    string
	prio       int
	key        string // its concurrency key, "" for none
	entry      int64  // pending: the score of its ready entry (unix ms)
	snoozes    int
	// endToken and endMsg are the claim whose run a Fail or snooze ended
	// last, and its error: the same write sent again finds its own.
	endToken uint64
	endMsg   string
}

// mwait is a job listed as waiting for a slot of its key.
type mwait struct {
	id     string
	prio   int
	runAt  int64
	pulled int64
}

// mkey is the model's view of one concurrency key.
type mkey struct {
	limit   int              // its own limit; 0: Config's
	leases  map[string]int64 // job ID -> lease deadline (unix ms)
	waiting []mwait
	rate    int     // its rate limit: at most rate starts within period ms; 0: none
	period  int64   // ms
	starts  []int64 // the latest starts (unix ms), at most rate of them
}

// model is a plain in-memory queue that the real one must agree with.
type model struct {
	jobs     map[string]*mjob
	keys     map[string]*mkey
	now      time.Time
	lease    time.Duration
	backoff  func(int) time.Duration
	defLimit int // Config.ConcurrencyLimit
	tally    tally
	batches  []*mbatch // batch.go
	cbMax    int       // a callback's MaxAttempts: Config.MaxAttempts
}

// tally counts what the model saw happen, to show what a run exercised.
type tally struct {
	claims, outcomes, choices  int // claims, their outcomes, claims with more than one
	parked, lapsedBack, pulled int // jobs left waiting, lapsed jobs back to pending, jobs pulled forward
	extendLost, overLimit      int // renewals refused for want of a slot, checks that found a lowered limit exceeded
	snoozed, snoozeLimit       int // snoozes, and snoozes past the limit that failed their job
	overRate                   int // claims that met a job held back by its key's rate
	replaced                   int // jobs an enqueue replaced (IfExists)
	batches, fired, doomed     int // batches made; callbacks written, and written canceled
}

// ownFailure says whether a Fail (or snooze) with error msg of the run
// that claimed copy j finds its own write already stored in mj: the job
// no longer active, still under j's token, and ended by this run with
// this error, or whose last error is it; a snooze also finds the snooze
// it counted, or the limit it failed on.
func ownFailure(mj *mjob, j *Job, msg string, snooze bool) bool {
	if mj.token != j.LeaseToken || mj.state != StatePending && mj.state != StateFailed {
		return false
	}
	switch {
	case mj.endToken == j.LeaseToken && mj.endMsg == msg:
		return true
	case snooze && mj.state == StatePending && mj.snoozes > j.Snoozes:
		return true
	case snooze && mj.state == StateFailed && strings.HasPrefix(mj.lastErr, ErrSnoozeLimit.Error()):
		return true
	}
	return mj.lastErr != "" && strings.HasPrefix(msg, mj.lastErr)
}

func (m *model) clone() *model {
	c := *m
	c.jobs = make(map[string]*mjob, len(m.jobs))
	for id, j := range m.jobs {
		cj := *j
		c.jobs[id] = &cj
	}
	c.keys = make(map[string]*mkey, len(m.keys))
	for k, v := range m.keys {
		c.keys[k] = &mkey{limit: v.limit, leases: maps.Clone(v.leases), waiting: slices.Clone(v.waiting),
			rate: v.rate, period: v.period, starts: slices.Clone(v.starts)}
	}
	c.batches = make([]*mbatch, len(m.batches))
	for i, b := range m.batches {
		cb := *b
		c.batches[i] = &cb
	}
	return &c
}

func (m *model) ms() int64 { return toMillis(m.now) }

func (m *model) claimable(j *mjob) bool {
	switch j.state {
	case StatePending:
		return j.entry <= m.ms() && j.attempt < j.max
	case StateActive:
		return !j.leaseUntil.After(m.now) && j.attempt < j.max
	}
	return false
}

// due says whether a claim reads j's entry: a pending job whose entry has
// come, or an active one whose lease ran out.
func (m *model) due(j *mjob) bool {
	switch j.state {
	case StatePending:
		return j.entry <= m.ms()
	case StateActive:
		return !j.leaseUntil.After(m.now)
	}
	return false
}

// rank orders claimable jobs as claims take them: expired leases first,
// then pending jobs by priority, highest first.
func (m *model) rank(j *mjob) int {
	if j.state == StateActive {
		return leasedPrio
	}
	return j.prio
}

// takeable says whether a claim that meets j takes it: claimable, and its
// key (if any) has a free slot.
func (m *model) takeable(id string) bool {
	j := m.jobs[id]
	return m.claimable(j) && (j.key == "" || m.turn(j.key, id) && !m.rateFull(j.key))
}

// turn says whether a free slot of k is job id's: one held for it when
// it was pulled forward, or one beyond those held for pulled jobs when no
// listed job waits ahead of it (higher priority, or an older RunAt).
func (m *model) turn(k, id string) bool {
	j := m.jobs[id]
	free := m.limit(k) - m.live(k, id)
	if free <= 0 {
		return false
	}
	grace := m.ms() - pullGrace.Milliseconds()
	held := 0
	for _, w := range m.key(k).waiting {
		switch {
		case w.pulled != 0 && w.pulled >= grace && w.id == id:
			return true
		case w.pulled != 0 && w.pulled >= grace:
			held++
		case w.pulled == 0 && w.id != id && (w.prio > j.prio || w.prio == j.prio && w.runAt < toMillis(j.runAt)):
			return false
		}
	}
	return free > held
}

// pulledBy says whether after, a claim's outcome from m, holds a slot of
// k for a job other than id that the claim pulled forward: listed in m
// not pulled since now, and pulled now in after.
func (m *model) pulledBy(after *model, k, id string) bool {
	kv := after.keys[k]
	if kv == nil {
		return false
	}
	for _, w := range kv.waiting {
		if w.id == id || w.pulled != m.ms() {
			continue
		}
		if m.keys[k] == nil || !slices.ContainsFunc(m.keys[k].waiting, func(o mwait) bool { return o.id == w.id && o.pulled == m.ms() }) {
			return true
		}
	}
	return false
}

// The rate limits, as designed (ratelimit.go): a claim takes a keyed job
// only while fewer than rate of its key's starts lie within the period
// before now, and records its start; a job held back by the rate alone is
// not listed as waiting, and its entry comes due when the rate-th latest
// start leaves the window.

// recent counts k's starts within its period before now.
func (m *model) recent(k string) int {
	kv, n := m.key(k), 0
	for _, s := range kv.starts {
		if s > m.ms()-kv.period {
			n++
		}
	}
	return n
}

func (m *model) rateFull(k string) bool { return m.key(k).rate > 0 && m.recent(k) >= m.key(k).rate }

// rateAt is when k's rate lets a job start again, or rateRecheck from
// now if that is sooner; 0 when it does now.
func (m *model) rateAt(k string) int64 {
	if !m.rateFull(k) {
		return 0
	}
	kv := m.key(k)
	return min(kv.starts[len(kv.starts)-kv.rate]+kv.period, m.ms()+rateRecheck.Milliseconds())
}

// setRate is SetRateLimit: the latest starts the new rate counts are kept.
func (m *model) setRate(k string, n int, period int64) {
	kv := m.key(k)
	kv.rate, kv.period = n, period
	if n == 0 {
		kv.starts, kv.period = nil, 0
	} else if d := len(kv.starts) - n; d > 0 {
		kv.starts = slices.Clone(kv.starts[d:])
	}
}

// The concurrency keys, as designed (concurrencykey.go): a lease counts
// while it has not run out; a claim that finds its key full leaves the
// job waiting, its entry moved to when the first live lease runs out; a
// write that frees a slot pulls the first waiting jobs forward, each to
// its RunAt, as many as there are free slots that no job pulled forward
// within pullGrace is about to take.

func (m *model) key(k string) *mkey {
	if m.keys[k] == nil {
		m.keys[k] = &mkey{leases: map[string]int64{}}
	}
	return m.keys[k]
}

func (m *model) limit(k string) int {
	if l := m.key(k).limit; l > 0 {
		return l
	}
	return m.defLimit
}

// live counts k's leases that have not run out, but for job except's.
func (m *model) live(k, except string) int {
	n := 0
	for id, u := range m.key(k).leases {
		if u > m.ms() && id != except {
			n++
		}
	}
	return n
}

func (m *model) dropLeases(k, id string) {
	for lid, u := range m.key(k).leases {
		if lid == id || u <= m.ms() {
			delete(m.key(k).leases, lid)
		}
	}
}

// take gives job id a slot of k until until; the caller checked it is free.
func (m *model) take(k, id string, until int64) {
	m.dropLeases(k, id)
	kv := m.key(k)
	kv.leases[id] = until
	kv.waiting = slices.DeleteFunc(kv.waiting, func(w mwait) bool { return w.id == id })
	if kv.rate > 0 {
		kv.starts = append(kv.starts, m.ms())
		if d := len(kv.starts) - kv.rate; d > 0 {
			kv.starts = slices.Clone(kv.starts[d:])
		}
	}
	m.pull(k)
}

// release gives back job id's slot of k.
func (m *model) release(k, id string) {
	m.dropLeases(k, id)
	m.pull(k)
}

// extend renews job id's lease of k to until: a lease that ran out takes
// a slot again, if there is one free.
func (m *model) extend(k, id string, until int64) bool {
	kv := m.key(k)
	if u, ok := kv.leases[id]; ok && u > m.ms() {
		kv.leases[id] = until
		return true
	}
	if m.live(k, id) >= m.limit(k) {
		return false
	}
	m.dropLeases(k, id)
	kv.leases[id] = until
	return true
}

// pull moves waiting jobs of k forward into the slots free now.
func (m *model) pull(k string) {
	kv := m.key(k)
	grace := m.ms() - pullGrace.Milliseconds()
	kv.waiting = slices.DeleteFunc(kv.waiting, func(w mwait) bool { return w.pulled != 0 && w.pulled < grace })
	reserved := 0
	for _, w := range kv.waiting {
		if w.pulled != 0 {
			reserved++
		}
	}
	free := m.limit(k) - m.live(k, "") - reserved
	for i := range kv.waiting {
		if free <= 0 {
			break
		}
		if w := &kv.waiting[i]; w.pulled == 0 {
			w.pulled = m.ms()
			free--
			m.tally.pulled++
			// Due again at its RunAt: a pending job's entry that is later
			// comes back to it. A job no longer pending has no ready entry
			// to move.
			if j := m.jobs[w.id]; j != nil && j.state == StatePending && j.prio == w.prio {
				// No sooner than the rate lets it start.
				j.entry = min(j.entry, max(toMillis(j.runAt), m.rateAt(k)))
			}
		}
	}
}

// park lists job id, blocked by its key k, as waiting, and returns when
// its entry comes due again: when the first of k's live leases runs out,
// and no sooner than the rate lets it start. Held back by the rate alone,
// it is not listed.
func (m *model) park(k, id string) int64 {
	j, kv := m.jobs[id], m.key(k)
	m.tally.parked++
	if m.rateFull(k) && m.turn(k, id) {
		m.tally.overRate++
		kv.waiting = slices.DeleteFunc(kv.waiting, func(o mwait) bool { return o.id == id })
		return max(m.rateAt(k), m.ms()+1)
	}
	w := mwait{id: id, prio: j.prio, runAt: toMillis(j.runAt)}
	i := slices.IndexFunc(kv.waiting, func(o mwait) bool { return o.id == id })
	switch {
	case i >= 0 && kv.waiting[i] == w:
		// Listed already as it is (not pulled forward, the same priority
		// and RunAt): it keeps its place, ahead of the jobs it ties with
		// that were listed after it.
	case i >= 0 || len(kv.waiting) < maxWaiting:
		kv.waiting = slices.DeleteFunc(kv.waiting, func(o mwait) bool { return o.id == id })
		// Highest priority first, then oldest RunAt; jobs pulled forward
		// keep their place.
		at := len(kv.waiting)
		for at > 0 && kv.waiting[at-1].pulled == 0 && (kv.waiting[at-1].prio < w.prio ||
			kv.waiting[at-1].prio == w.prio && kv.waiting[at-1].runAt > w.runAt) {
			at--
		}
		kv.waiting = slices.Insert(kv.waiting, at, w)
	}
	next := int64(math.MaxInt64)
	for _, u := range kv.leases {
		if u > m.ms() {
			next = min(next, u)
		}
	}
	if next == math.MaxInt64 {
		next = m.ms() + time.Second.Milliseconds()
	}
	return max(next, m.rateAt(k), m.ms()+1)
}

// rewrite keeps k's waiting list true to job id after a write that takes
// no slot and gives none back (Cancel, Retry): listed as waiting, it stays
// listed only while it is pending at the priority and RunAt it waited with.
// A listing dropped pulls the next waiting jobs forward into the slots
// free now, as a freed slot does (slotBook.unlist).
func (m *model) rewrite(id string) {
	j := m.jobs[id]
	if j.key == "" {
		return
	}
	kv := m.key(j.key)
	n := len(kv.waiting)
	kv.waiting = slices.DeleteFunc(kv.waiting, func(w mwait) bool {
		return w.id == id && (j.state != StatePending || w.prio != j.prio || w.runAt != toMillis(j.runAt))
	})
	if len(kv.waiting) < n {
		m.pull(j.key)
	}
}

// meet is what a claim does to job id, a due candidate: take it for
// worker (true), fail it for good, or leave it waiting for a slot.
func (m *model) meet(id, worker string) bool {
	j := m.jobs[id]
	if j.state == StateActive {
		switch {
		case j.attempt >= j.max:
			j.state = StateFailed
			j.lastErr = fmt.Sprintf("lease of attempt %d/%d (worker %q) expired before it finished", j.attempt, j.max, j.owner)
			if j.key != "" {
				m.release(j.key, id)
			}
			return false
		case j.key != "" && (!m.turn(j.key, id) || m.rateFull(j.key)):
			j.state, j.runAt = StatePending, m.now
			why := "a slot"
			if m.turn(j.key, id) {
				why = "the rate limit"
			}
			j.lastErr = fmt.Sprintf("lease of attempt %d/%d (worker %q) expired before it finished; waiting for %s of concurrency key %q",
				j.attempt, j.max, j.owner, why, j.key)
			m.tally.lapsedBack++
			m.release(j.key, id)
			j.entry = m.park(j.key, id)
			m.pull(j.key) // a slot it was refused goes to the jobs ahead of it
			return false
		}
	} else if j.key != "" && (!m.turn(j.key, id) || m.rateFull(j.key)) {
		j.entry = m.park(j.key, id)
		m.pull(j.key)
		return false
	}
	j.state, j.attempt, j.owner, j.leaseUntil = StateActive, j.attempt+1, worker, m.now.Add(m.lease)
	if j.key != "" {
		m.take(j.key, id, toMillis(j.leaseUntil))
	}
	return true
}

// candidates returns the due jobs a claim reads, in groups of one rank,
// the highest first.
func (m *model) candidates() [][]string {
	by := map[int][]string{}
	for id, j := range m.jobs {
		if m.due(j) {
			by[m.rank(j)] = append(by[m.rank(j)], id)
		}
	}
	var ranks []int
	for r := range by {
		ranks = append(ranks, r)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(ranks)))
	var out [][]string
	for _, r := range ranks {
		slices.Sort(by[r])
		out = append(out, by[r])
	}
	return out
}

// claimOutcome is one way a claim may end: the model after it, and the job
// it took ("" for ErrNoJob).
type claimOutcome struct {
	m     *model
	taken string
}

// claimOutcomes lists every way a Claim by worker may end. A claim reads
// the due entries and tries them one by one, the highest rank first and
// in random order within a rank, until it takes one; every one it meets
// before is failed for good or left waiting for a slot, and a round that
// took nothing reads again. The order within a rank is the claim's
// choice, so the model follows every order (the outcomes are few: states
// reached twice are explored once).
func (m *model) claimOutcomes(worker string) []claimOutcome {
	var outs []claimOutcome
	seen := map[string]bool{}
	var visit func(m *model, groups [][]string, round int)
	visit = func(m *model, groups [][]string, round int) {
		for len(groups) > 0 && len(groups[0]) == 0 {
			groups = groups[1:]
		}
		if len(groups) == 0 {
			// A job a round ended may end its batch: the round's EXEC
			// writes the callback, which the next round may take.
			m.settleBatches()
			next := m.candidates()
			if len(next) == 0 || round+1 >= maxClearRounds {
				outs = append(outs, claimOutcome{m: m})
				return
			}
			groups, round = next, round+1
		}
		fp := fmt.Sprint(m.project(), groups, round)
		if seen[fp] {
			return
		}
		seen[fp] = true
		for i, id := range groups[0] {
			mm := m.clone()
			if mm.meet(id, worker) {
				mm.settleBatches()
				outs = append(outs, claimOutcome{m: mm, taken: id})
				continue
			}
			rest := slices.Concat([][]string{slices.Delete(slices.Clone(groups[0]), i, i+1)}, groups[1:])
			visit(mm, rest, round)
		}
	}
	visit(m, m.candidates(), 0)
	return outs
}

func (m *model) stats() Stats {
	var s Stats
	for _, j := range m.jobs {
		switch j.state {
		case StatePending:
			s.Pending++
			if j.entry > m.ms() {
				s.Scheduled++
			} else {
				s.Due++
				s.DueByPriority[j.prio]++
			}
		case StateActive:
			s.Active++
			if !j.leaseUntil.After(m.now) {
				s.ExpiredLeases++
			}
		case StateSucceeded:
			s.Succeeded++
		case StateFailed:
			s.Failed++
		case StateCanceled:
			s.Canceled++
		}
	}
	return s
}

// jobView is what the model says of a job and the real queue must show:
// its value's fields that say where it stands, and its index entry (the
// score of finished jobs' entries is their UpdatedAt, checked apart).
type jobView struct {
	State      State
	Attempt    int
	RunAt      int64 // pending only
	Owner      string
	LeaseUntil int64 // active only
	LastError  string
	Snoozes    int
	Index      string
	Score      int64 // pending and active only
}

// keyView is a concurrency key's value: its own limit, live leases and
// waiting list.
type keyView struct {
	Limit   int
	Leases  map[string]int64
	Waiting []mwait
}

type view struct {
	Jobs map[string]jobView
	Keys map[string]keyView
}

func (m *model) project() view {
	v := view{Jobs: map[string]jobView{}, Keys: map[string]keyView{}}
	for id, j := range m.jobs {
		jv := jobView{State: j.state, Attempt: j.attempt, LastError: j.lastErr, Snoozes: j.snoozes}
		switch j.state {
		case StatePending:
			jv.RunAt, jv.Index, jv.Score = toMillis(j.runAt), readyIndex(j.prio), j.entry
		case StateActive:
			jv.Owner, jv.LeaseUntil, jv.Index, jv.Score = j.owner, toMillis(j.leaseUntil), idxLeased, toMillis(j.leaseUntil)
		case StateSucceeded:
			jv.Index = idxSucceeded
		case StateFailed:
			jv.Index = idxFailed
		case StateCanceled:
			jv.Index = idxCanceled
		}
		v.Jobs[id] = jv
	}
	for k, kv := range m.keys {
		if kv.limit == 0 && m.live(k, "") == 0 && len(kv.waiting) == 0 {
			continue // nothing to keep
		}
		x := keyView{Limit: kv.limit, Leases: map[string]int64{}}
		if len(kv.waiting) > 0 {
			x.Waiting = slices.Clone(kv.waiting)
		}
		for id, u := range kv.leases {
			if u > m.ms() {
				x.Leases[id] = u
			}
		}
		v.Keys[k] = x
	}
	return v
}

// observe reads, in one round trip, the real queue's view of the jobs ids
// and of the concurrency keys: the stored values and the raw index
// entries.
func observe(rt *rapid.T, f *fixture, m *model, ids, keys []string) view {
	indexes := append(slices.Clone(readyIndexes), idxLeased, idxSucceeded, idxFailed, idxCanceled)
	gets := map[string]*redis.StringCmd{}
	scores := map[string][]*redis.FloatCmd{}
	slots := map[string]*redis.StringCmd{}
	_, err := f.rdb.Pipelined(f.ctx, func(p redis.Pipeliner) error {
		for _, id := range ids {
			key, shard := f.q.ks.jobKeyOf(id)
			gets[id] = p.Get(f.ctx, key)
			for _, idx := range indexes {
				scores[id] = append(scores[id], p.ZScore(f.ctx, f.q.ks.index(shard, idx), id))
			}
		}
		for _, k := range keys {
			slots[k] = p.Get(f.ctx, f.q.ks.slotKey(f.q.ks.shardOf(k), k))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		require.NoError(rt, err)
	}
	v := view{Jobs: map[string]jobView{}, Keys: map[string]keyView{}}
	for _, id := range ids {
		raw, err := gets[id].Result()
		if errors.Is(err, redis.Nil) {
			for i, c := range scores[id] {
				require.ErrorIs(rt, c.Err(), redis.Nil, "%s has no value but an entry in %s", id, indexes[i])
			}
			continue
		}
		require.NoError(rt, err)
		got := new(Job)
		require.NoError(rt, unmarshalString(raw, got))
		jv := jobView{State: got.State, Attempt: got.Attempt, LastError: got.LastError, Snoozes: got.Snoozes}
		switch got.State {
		case StatePending:
			jv.RunAt = toMillis(got.RunAt)
		case StateActive:
			jv.Owner, jv.LeaseUntil = got.LeaseOwner, toMillis(got.LeaseUntil)
		}
		for i, c := range scores[id] {
			sc, err := c.Result()
			if errors.Is(err, redis.Nil) {
				continue
			}
			require.NoError(rt, err)
			require.Empty(rt, jv.Index, "job %s is in %s and %s", id, jv.Index, indexes[i])
			jv.Index, jv.Score = indexes[i], int64(sc)
		}
		if got.State.Finished() {
			require.Equal(rt, f.q.entryOf(got).score, jv.Score, "score of %s", id)
			jv.Score = 0
		}
		v.Jobs[id] = jv
	}
	for _, k := range keys {
		s, err := slots[k].Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		require.NoError(rt, err)
		sv, err := decodeSlots(s)
		require.NoError(rt, err)
		x := keyView{Limit: sv.limit, Leases: map[string]int64{}}
		for _, l := range sv.leases {
			if l.until > m.ms() {
				x.Leases[l.id] = l.until
			}
		}
		for _, w := range sv.waiting {
			x.Waiting = append(x.Waiting, mwait(w))
		}
		if x.Limit == 0 && len(x.Leases) == 0 && len(x.Waiting) == 0 {
			continue
		}
		v.Keys[k] = x
	}
	return v
}

// sameView compares two views.
func sameView(a, b view) bool { return fmt.Sprint(a) == fmt.Sprint(b) }

// mrun is one lease a claim handed out, followed apart from the model's
// keys: the safety properties are checked against these.
type mrun struct {
	id, key string
	token   uint64
	until   time.Time
	ended   bool
}

// TestModel applies random operations to the queue and to the model, and
// after every step checks that Get, Stats, Concurrency and the raw index
// and concurrency keys all agree with the model. Jobs may have a
// concurrency key ("a" or "b") whose limit steps change; a claim must take
// a job the model allows (the highest rank that is not blocked), and never
// one whose key has its limit of live leases. A run may snooze: its
// attempt is given back and the job is due later, and the snooze past
// Config.MaxSnoozes (1 here, so that runs reach it) fails the job.
func TestModel(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	ctx := context.Background()
	bases := []string{"a", "b", "c", "d", "e", "f"}
	keys := []string{"a", "b"}
	workers := []string{"w1", "w2"}
	var total tally

	rapid.Check(t, func(rt *rapid.T) {
		clock := newClock()
		backoff := func(attempt int) time.Duration { return time.Duration(attempt) * 10 * time.Second }
		const maxSnoozes = 1
		q, err := NewQueue(rdb, "q", &Config{
			Prefix: "model-" + NewID(), Backoff: backoff, Shards: rapid.IntRange(1, 3).Draw(rt, "shards"), MaxSnoozes: maxSnoozes,
			ConcurrencyLimit: rapid.IntRange(1, 2).Draw(rt, "default limit"),
			ClaimWindow:      20, // every due job of an index: bases x keys
		})
		require.NoError(rt, err)
		q.clock.Fake = clock.Now
		events := rapid.Bool().Draw(rt, "events")
		if events {
			require.NoError(rt, q.EnableEvents(ctx)) // checked at the end (checkEventChains)
		}
		f := &fixture{q: q, rdb: rdb, clock: clock, ctx: ctx}
		m := &model{jobs: map[string]*mjob{}, keys: map[string]*mkey{}, now: clock.Now(), lease: q.cfg.Lease,
			backoff: backoff, defLimit: q.cfg.ConcurrencyLimit, cbMax: q.cfg.MaxAttempts}
		// Every ID a job may have: a keyed job lives in its key's shard.
		var ids []string
		for _, b := range bases {
			for _, k := range append([]string{""}, keys...) {
				id, err := q.IDFor(k, b)
				require.NoError(rt, err)
				if !slices.Contains(ids, id) {
					ids = append(ids, id)
				}
			}
		}
		batchIDs := []string{"x1", "x2"} // batches' IDs, and their callbacks'
		ids = append(ids, batchIDs...)
		var held []*Job  // every copy a claim handed out, stale ones included
		var runs []*mrun // every lease a claim handed out
		liveRuns := func(k string) int {
			n := 0
			for _, r := range runs {
				if r.key == k && !r.ended && r.until.After(m.now) {
					n++
				}
			}
			return n
		}
		runOf := func(j *Job) *mrun {
			for _, r := range runs {
				if r.token == j.LeaseToken {
					return r
				}
			}
			panic("no run for " + j.ID)
		}
		fenced := func(j *Job) (*mjob, bool) {
			mj := m.jobs[j.ID]
			return mj, mj.state == StateActive && mj.token == j.LeaseToken
		}

		// pickHeld draws a claimed copy: most often one whose lease is
		// still the job's, else any, stale ones included.
		pickHeld := func(rt *rapid.T) *Job {
			var cur []*Job
			for _, h := range held {
				if _, ok := fenced(h); ok {
					cur = append(cur, h)
				}
			}
			if len(cur) > 0 && rapid.IntRange(0, 3).Draw(rt, "stale") > 0 {
				return rapid.SampledFrom(cur).Draw(rt, "held")
			}
			return rapid.SampledFrom(held).Draw(rt, "held")
		}
		claim := func(rt *rapid.T, w string) *Job {
			// The jobs a claim could take now, for the priority order
			// checked below.
			takeable := map[string]bool{}
			for id := range m.jobs {
				if m.takeable(id) {
					takeable[id] = true
				}
			}
			outs := m.claimOutcomes(w)
			// The entries earlier claims read ahead are up to 500 ms
			// old (duePool): a job that became due since, by the model's
			// clock, may wait behind them. The model checks priority
			// order among the jobs due when the claim reads.
			q.pool.Drop()
			j, err := q.Claim(ctx, w)
			taken := ""
			if !errors.Is(err, ErrNoJob) {
				require.NoError(rt, err)
				taken = j.ID
			}
			// A batch's callback that an earlier round of this very claim
			// wrote (it ended the batch's last job) is not in m: the
			// outcome that took it holds it.
			_, known := m.jobs[taken]
			born := taken != "" && !known && slices.Contains(batchIDs, taken)
			if taken != "" && !born {
				require.Contains(rt, m.jobs, taken)
			}
			if taken != "" && !born {
				mj := m.jobs[taken]
				require.Equal(rt, mj.prio, j.Priority)
				require.Equal(rt, mj.key, j.ConcurrencyKey)
				if mj.key != "" {
					// Safety, counted from the leases handed out: a claim
					// never takes a job whose key has limit live leases.
					require.Less(rt, liveRuns(mj.key), m.limit(mj.key), "claimed %s while key %q had %d live leases, limit %d",
						taken, mj.key, liveRuns(mj.key), m.limit(mj.key))
				}
			}
			got := observe(rt, f, m, ids, keys)
			var match *model
			for _, o := range outs {
				if o.taken == taken && sameView(o.m.project(), got) {
					match = o.m
					break
				}
			}
			if match == nil {
				var b strings.Builder
				for i, o := range outs {
					fmt.Fprintf(&b, "\n  outcome %d: took %q: %+v", i, o.taken, o.m.project())
				}
				rt.Fatalf("claim by %s took %q (err %v), which no outcome of the model allows\n  got: %+v\n  before: %+v%s",
					w, taken, err, got, m.project(), b.String())
			}
			// Priority order, stated apart from the outcomes: if a due job
			// can be taken, the claim takes one, of the highest rank, and
			// only one that could be taken. The claim's own meetings move
			// a key's free slots to the jobs listed as waiting for it, and
			// that alone bends the order: a job it met first and refused
			// a slot (a waiting job was ahead of it), or failed for good,
			// pulled the waiting jobs forward, and the slots are held for
			// them (slotBook.blocked, pull, turn). So a job passed over, or
			// one taken that could not be taken before, is a keyed job
			// whose key's slot went to a waiting job in this claim: one
			// pulled forward, or the one taken.
			moved := func(k, except string) bool {
				return k != "" && (m.pulledBy(match, k, except) ||
					taken != "" && m.jobs[taken].key == k && slices.ContainsFunc(m.key(k).waiting, func(w mwait) bool { return w.id == taken }))
			}
			if born {
				// Rounds go on only while none of the jobs due when the
				// claim began could be taken.
				require.Empty(rt, takeable, "claimed %s, written by the claim, while %v could be taken", taken, takeable)
			} else if taken == "" {
				for id := range takeable {
					require.True(rt, moved(m.jobs[id].key, id), "ErrNoJob while %v could be taken, and no job waiting for %s's key took or holds its slot", takeable, id)
				}
			} else {
				if !takeable[taken] {
					require.True(rt, moved(m.jobs[taken].key, ""), "claimed %s, which could not be taken (%v could)", taken, takeable)
				}
				for id := range takeable {
					if r := m.rank(m.jobs[id]); r > m.rank(m.jobs[taken]) {
						require.True(rt, moved(m.jobs[id].key, id),
							"claimed %s of rank %d while %s of rank %d could be taken, and no job waiting for its key %q took or holds its slot",
							taken, m.rank(m.jobs[taken]), id, r, m.jobs[id].key)
					}
				}
			}
			*m = *match
			m.tally.claims++
			m.tally.outcomes += len(outs)
			if len(outs) > 1 {
				m.tally.choices++
			}
			if taken == "" {
				return nil
			}
			require.NotZero(rt, j.LeaseToken)
			for _, h := range held {
				require.NotEqual(rt, h.LeaseToken, j.LeaseToken, "every claim has a token of its own")
			}
			m.jobs[taken].token = j.LeaseToken
			held = append(held, j)
			runs = append(runs, &mrun{id: j.ID, key: j.ConcurrencyKey, token: j.LeaseToken, until: j.LeaseUntil})
			return j
		}
		complete := func(rt *rapid.T, j *Job) {
			_, err := q.Complete(ctx, j, []byte("r"))
			mj, ok := fenced(j)
			if mj.state == StateSucceeded && mj.token == j.LeaseToken {
				require.NoError(rt, err, "a repeated Complete is a no-op success")
				return
			}
			if !ok {
				require.ErrorIs(rt, err, ErrLeaseLost)
				return
			}
			require.NoError(rt, err)
			mj.state, mj.leaseUntil = StateSucceeded, m.now
			if mj.key != "" {
				m.release(mj.key, j.ID)
			}
			runOf(j).ended = true
		}
		check := func(rt *rapid.T) {
			m.settleBatches()
			for _, b := range m.batches {
				got, err := q.Batch(ctx, b.id)
				require.NoError(rt, err)
				want := m.batchCounts(b)
				require.Equal(rt, want, [4]int{got.Pending, got.Succeeded, got.Failed, got.Canceled}, "batch %s's counts", b.id)
				require.Equal(rt, b.fired, got.Fired, "batch %s", b.id)
			}
			st, err := q.Stats(ctx)
			require.NoError(rt, err)
			require.Equal(rt, m.stats(), st)
			want, got := m.project(), observe(rt, f, m, ids, keys)
			require.True(rt, sameView(want, got), "the queue disagrees with the model\n  want: %+v\n  got:  %+v", want, got)
			for _, k := range keys {
				info, err := q.Concurrency(ctx, k)
				require.NoError(rt, err)
				want := ConcurrencyInfo{Key: k, Limit: m.limit(k), Own: m.key(k).limit > 0, Active: m.live(k, ""), Waiting: len(m.key(k).waiting)}
				if kv := m.key(k); kv.rate > 0 {
					want.Rate, want.RatePeriod, want.Started = kv.rate, time.Duration(kv.period)*time.Millisecond, m.recent(k)
				}
				require.Equal(rt, want, info)
				require.Equal(rt, liveRuns(k), info.Active, "key %q: the leases handed out and not ended", k)
				if info.Active > info.Limit {
					m.tally.overLimit++ // a lowered limit stops no running job
				}
			}
		}

		enqueue := func(rt *rapid.T) {
			for range rapid.IntRange(1, 3).Draw(rt, "jobs") {
				key := rapid.SampledFrom([]string{"", "a", "a", "a", "b"}).Draw(rt, "key")
				id, err := q.IDFor(key, rapid.SampledFrom(bases).Draw(rt, "id"))
				require.NoError(rt, err)
				delay := rapid.SampledFrom([]time.Duration{0, 0, 20 * time.Second, 40 * time.Second}).Draw(rt, "delay")
				max := rapid.IntRange(1, 3).Draw(rt, "max")
				prio := rapid.IntRange(0, 2).Draw(rt, "priority")
				_, err = q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: id, Delay: delay, MaxAttempts: max, Priority: prio, ConcurrencyKey: key})
				if _, exists := m.jobs[id]; exists {
					require.ErrorIs(rt, err, ErrJobExists)
					continue
				}
				require.NoError(rt, err)
				runAt := m.now.Add(delay)
				m.jobs[id] = &mjob{state: StatePending, max: max, runAt: runAt, prio: prio, key: key, entry: toMillis(runAt)}
			}
		}
		// enqueueUnique enqueues a taken or a new ID under a policy of
		// IfExists: the stored job is refused, kept or replaced as its
		// state says, and a replaced job waits for its last run's lease.
		enqueueUnique := func(rt *rapid.T) {
			key := rapid.SampledFrom([]string{"", "a", "b"}).Draw(rt, "key")
			id, err := q.IDFor(key, rapid.SampledFrom(bases).Draw(rt, "id"))
			require.NoError(rt, err)
			p := rapid.SampledFrom([]IfExists{IfExistsRefuse, IfExistsKeep, IfExistsReplaceFinished, IfExistsReplace}).Draw(rt, "policy")
			delay := rapid.SampledFrom([]time.Duration{0, 20 * time.Second}).Draw(rt, "delay")
			max := rapid.IntRange(1, 3).Draw(rt, "max")
			prio := rapid.IntRange(0, 2).Draw(rt, "priority")
			payload := []byte(NewID())
			j, err := q.Enqueue(ctx, "t", payload, &EnqueueOpts{ID: id, Delay: delay, MaxAttempts: max, Priority: prio, ConcurrencyKey: key, IfExists: p})
			mj := m.jobs[id]
			act := conflictReplace // a new job is written as a replace writes one
			if mj != nil {
				act = p.on(mj.state)
			}
			switch act {
			case conflictRefuse:
				require.ErrorIs(rt, err, ErrJobExists)
			case conflictKeep:
				require.NoError(rt, err)
				require.Equal(rt, mj.state, j.State, "the stored job, kept")
				require.NotEqual(rt, payload, j.Payload)
			case conflictReplace:
				require.NoError(rt, err)
				require.Equal(rt, payload, j.Payload)
				runAt := m.now.Add(delay)
				if mj == nil {
					m.jobs[id] = &mjob{state: StatePending, max: max, runAt: runAt, prio: prio, key: key, entry: toMillis(runAt)}
					break
				}
				m.leaveBatch(id) // a job of no batch takes its place
				if mj.state == StatePending && mj.key != "" {
					// Its listing as waiting goes, and frees what it held back.
					kv := m.key(mj.key)
					n := len(kv.waiting)
					kv.waiting = slices.DeleteFunc(kv.waiting, func(w mwait) bool { return w.id == id })
					if len(kv.waiting) < n {
						m.pull(mj.key)
					}
				}
				if mj.leaseUntil.After(runAt) {
					runAt = mj.leaseUntil // a canceled run's lease ends first
				}
				mj.state, mj.attempt, mj.max, mj.prio, mj.key, mj.lastErr = StatePending, 0, max, prio, key, ""
				mj.runAt, mj.entry = runAt, toMillis(runAt)
				// A new job: no snoozes, and no run of its own has ended. The
				// old run's token stays (its lease is the last run's), but a
				// Fail or snooze its holder sends again finds the new job, not
				// its own write: ErrLeaseLost.
				mj.snoozes, mj.endToken, mj.endMsg = 0, 0, ""
				require.Equal(rt, runAt, j.RunAt)
				m.tally.replaced++
			}
		}
		claimStep := func(rt *rapid.T) { claim(rt, rapid.SampledFrom(workers).Draw(rt, "worker")) }
		extend := func(rt *rapid.T, j *Job) {
			_, err := q.Extend(ctx, j)
			mj, ok := fenced(j)
			if !ok {
				require.ErrorIs(rt, err, ErrLeaseLost)
				return
			}
			until := m.now.Add(m.lease)
			if mj.key != "" {
				// A holder whose lease ran out renews it only if its key
				// has a slot free: another claim may have taken its own.
				free := liveRuns(mj.key) < m.limit(mj.key) || runOf(j).until.After(m.now)
				require.Equal(rt, free, m.extend(mj.key, j.ID, toMillis(until)))
				if !free {
					m.tally.extendLost++
					require.ErrorIs(rt, err, ErrLeaseLost, "%s's lease ran out and its key %q is full", j.ID, mj.key)
					return
				}
			}
			require.NoError(rt, err)
			mj.leaseUntil = until
			runOf(j).until = until
		}
		// claimFirst is a claim that tries pending job id first, as one that
		// read ahead, or a batch claimer's block, may do while an expired
		// lease waits: the job takes a free slot, one that ran out
		// included, or waits.
		claimFirst := func(rt *rapid.T, id, w string) {
			mj := m.jobs[id]
			c := candidate{Shard: q.ks.shardOf(id), ID: id, Index: readyIndex(mj.prio), Prio: mj.prio}
			before := liveRuns(mj.key)
			took := m.meet(id, w)
			got, _, err := q.claimTxn(ctx, []candidate{c}, []string{w}, true, nil)
			require.NoError(rt, err)
			require.Equal(rt, took, got[0] != nil, "claim of %s", id)
			if !took {
				return
			}
			j := got[0]
			if mj.key != "" {
				require.Less(rt, before, m.limit(mj.key), "claimed %s while key %q had %d live leases", id, mj.key, before)
			}
			m.jobs[id].token = j.LeaseToken
			held = append(held, j)
			runs = append(runs, &mrun{id: j.ID, key: j.ConcurrencyKey, token: j.LeaseToken, until: j.LeaseUntil})
		}
		claimAhead := func(rt *rapid.T) {
			var due []string
			for id, mj := range m.jobs {
				if mj.state == StatePending && m.claimable(mj) {
					due = append(due, id)
				}
			}
			if len(due) == 0 {
				rt.Skip("no pending job is due")
			}
			slices.Sort(due)
			claimFirst(rt, rapid.SampledFrom(due).Draw(rt, "id"), rapid.SampledFrom(workers).Draw(rt, "worker"))
		}
		// A lease runs out, and a claim that meets another job of its key
		// first gives that job the slot: the lapsed holder must not renew,
		// and the claim that meets it next leaves it waiting.
		steal := func(rt *rapid.T) {
			type pair struct{ x, y string }
			var pairs []pair
			for x, mx := range m.jobs {
				for y, my := range m.jobs {
					if mx.key != "" && mx.key == my.key && mx.state == StateActive && mx.leaseUntil.After(m.now) &&
						my.state == StatePending && my.attempt < my.max && !my.runAt.After(mx.leaseUntil) {
						pairs = append(pairs, pair{x, y})
					}
				}
			}
			if len(pairs) == 0 {
				rt.Skip("no active job with a pending one of its key")
			}
			slices.SortFunc(pairs, func(a, b pair) int { return strings.Compare(a.x+"/"+a.y, b.x+"/"+b.y) })
			p := rapid.SampledFrom(pairs).Draw(rt, "pair")
			d := m.jobs[p.x].leaseUntil.Sub(m.now) + time.Millisecond
			clock.Advance(d)
			m.now = m.now.Add(d)
			claimFirst(rt, p.y, rapid.SampledFrom(workers).Draw(rt, "worker"))
			if rapid.Bool().Draw(rt, "renew") {
				for _, h := range held {
					if _, ok := fenced(h); ok && h.ID == p.x {
						extend(rt, h)
					}
				}
			}
		}

		// The caller's own hash beside the queue (tx.go): EnqueueTx and
		// CompleteTx count their writes in it, in the job's EXEC, and it
		// must hold exactly the writes of the calls that wrote their job.
		callerKey := "caller-" + q.ks.prefix
		callerWant := map[string]string{}
		callerTx := func(field string, refuse bool) TxFunc {
			return func(tx *Tx) error {
				if refuse {
					return errRefusedByCaller
				}
				n, _ := strconv.Atoi(tx.HGetAll(callerKey)[field])
				tx.HSet(callerKey, field, strconv.Itoa(n+1))
				return nil
			}
		}
		checkCaller := func(rt *rapid.T) {
			got, err := rdb.HGetAll(ctx, callerKey).Result()
			require.NoError(rt, err)
			require.Equal(rt, callerWant, got, "the caller's writes are those of the calls that wrote their job, once each")
		}
		enqueueTx := func(rt *rapid.T) {
			key := rapid.SampledFrom([]string{"", "a", "b"}).Draw(rt, "key")
			id, err := q.IDFor(key, rapid.SampledFrom(bases).Draw(rt, "id"))
			require.NoError(rt, err)
			delay := rapid.SampledFrom([]time.Duration{0, 20 * time.Second}).Draw(rt, "delay")
			max := rapid.IntRange(1, 3).Draw(rt, "max")
			prio := rapid.IntRange(0, 2).Draw(rt, "priority")
			refuse := rapid.IntRange(0, 3).Draw(rt, "refuse") == 0
			_, err = q.EnqueueTx(ctx, "t", nil, &EnqueueOpts{ID: id, Delay: delay, MaxAttempts: max, Priority: prio, ConcurrencyKey: key},
				[]TxKey{{Key: callerKey, Type: KeyHash}}, callerTx("e:"+id, refuse))
			switch _, exists := m.jobs[id]; {
			case exists:
				require.ErrorIs(rt, err, ErrJobExists)
			case refuse:
				require.ErrorIs(rt, err, errRefusedByCaller)
			default:
				require.NoError(rt, err)
				runAt := m.now.Add(delay)
				m.jobs[id] = &mjob{state: StatePending, max: max, runAt: runAt, prio: prio, key: key, entry: toMillis(runAt)}
				n, _ := strconv.Atoi(callerWant["e:"+id])
				callerWant["e:"+id] = strconv.Itoa(n + 1)
			}
			checkCaller(rt)
		}
		completeTx := func(rt *rapid.T) {
			if len(held) == 0 {
				rt.Skip("nothing claimed")
			}
			j := pickHeld(rt)
			refuse := rapid.IntRange(0, 3).Draw(rt, "refuse") == 0
			_, err := q.CompleteTx(ctx, j, []byte("r"), []TxKey{{Key: callerKey, Type: KeyHash}}, callerTx("c:"+j.ID, refuse))
			mj, ok := fenced(j)
			switch {
			case mj.state == StateSucceeded && mj.token == j.LeaseToken:
				require.NoError(rt, err, "a repeated CompleteTx is a no-op success")
			case !ok:
				require.ErrorIs(rt, err, ErrLeaseLost)
			case refuse:
				require.ErrorIs(rt, err, errRefusedByCaller)
			default:
				require.NoError(rt, err)
				mj.state, mj.leaseUntil = StateSucceeded, m.now
				if mj.key != "" {
					m.release(mj.key, j.ID)
				}
				runOf(j).ended = true
				n, _ := strconv.Atoi(callerWant["c:"+j.ID])
				callerWant["c:"+j.ID] = strconv.Itoa(n + 1)
			}
			checkCaller(rt)
		}

		// Enqueues and claims come twice as often as the other steps.
		rt.Repeat(map[string]func(*rapid.T){
			"enqueue tx":  enqueueTx,
			"complete tx": completeTx,
			"enqueue":     enqueue,
			"enqueue 2":   enqueue,
			"unique":      enqueueUnique,
			"claim":       claimStep,
			"claim 2":     claimStep,
			"claim one":   claimAhead,
			"steal":       steal,
			"set limit": func(rt *rapid.T) {
				k := rapid.SampledFrom(keys).Draw(rt, "key")
				n := rapid.IntRange(0, 3).Draw(rt, "limit")
				require.NoError(rt, q.SetConcurrencyLimit(ctx, k, n))
				if m.key(k).limit != n {
					m.key(k).limit = n
					m.pull(k) // a higher limit frees slots now
				}
			},
			"set rate": func(rt *rapid.T) {
				k := rapid.SampledFrom(keys).Draw(rt, "key")
				n := rapid.IntRange(0, 2).Draw(rt, "rate")
				period := rapid.SampledFrom([]time.Duration{10 * time.Second, time.Minute}).Draw(rt, "period")
				require.NoError(rt, q.SetRateLimit(ctx, k, n, period))
				if n == 0 {
					period = 0
				}
				changed := m.key(k).rate != n || m.key(k).period != period.Milliseconds()
				m.setRate(k, n, period.Milliseconds())
				if changed {
					m.pull(k) // jobs waiting for a slot come due by the new rate
				}
			},
			"complete": func(rt *rapid.T) {
				if len(held) == 0 {
					rt.Skip("nothing claimed")
				}
				complete(rt, pickHeld(rt))
			},
			"fail": func(rt *rapid.T) {
				if len(held) == 0 {
					rt.Skip("nothing claimed")
				}
				j := pickHeld(rt)
				_, err := q.Fail(ctx, j, errors.New("x"))
				if ownFailure(m.jobs[j.ID], j, "x", false) {
					require.NoError(rt, err, "a repeated Fail finds its own write")
					return
				}
				mj, ok := fenced(j)
				if !ok {
					require.ErrorIs(rt, err, ErrLeaseLost)
					return
				}
				require.NoError(rt, err)
				mj.lastErr, mj.leaseUntil, mj.endToken, mj.endMsg = "x", m.now, j.LeaseToken, "x"
				if mj.attempt >= mj.max {
					mj.state = StateFailed
				} else {
					mj.state, mj.runAt = StatePending, m.now.Add(m.backoff(mj.attempt))
					mj.entry = toMillis(mj.runAt)
				}
				if mj.key != "" {
					m.release(mj.key, j.ID)
				}
				runOf(j).ended = true
			},
			// A handler snoozes its run: the attempt is given back and the
			// job is due later, until the snooze past the limit fails it.
			"snooze": func(rt *rapid.T) {
				if len(held) == 0 {
					rt.Skip("nothing claimed")
				}
				j := pickHeld(rt)
				d := rapid.SampledFrom([]time.Duration{0, 5 * time.Second, 30 * time.Second}).Draw(rt, "snooze")
				cause := Snooze(d)
				_, err := q.Fail(ctx, j, cause)
				if ownFailure(m.jobs[j.ID], j, cause.Error(), true) {
					require.NoError(rt, err, "a repeated snooze finds its own write")
					return
				}
				mj, ok := fenced(j)
				if !ok {
					require.ErrorIs(rt, err, ErrLeaseLost)
					return
				}
				require.NoError(rt, err)
				mj.leaseUntil, mj.endToken, mj.endMsg = m.now, j.LeaseToken, cause.Error()
				if mj.snoozes < maxSnoozes {
					mj.state, mj.snoozes, mj.attempt = StatePending, mj.snoozes+1, max(0, mj.attempt-1)
					mj.runAt = m.now.Add(d)
					mj.entry = toMillis(mj.runAt)
					m.tally.snoozed++
				} else {
					mj.state = StateFailed
					mj.lastErr = fmt.Sprintf("%v: %d snoozes, limit %d; the last: %s", ErrSnoozeLimit, mj.snoozes, maxSnoozes, cause.Error())
					m.tally.snoozeLimit++
				}
				if mj.key != "" {
					m.release(mj.key, j.ID)
				}
				runOf(j).ended = true
			},
			"release": func(rt *rapid.T) {
				if len(held) == 0 {
					rt.Skip("nothing claimed")
				}
				j := pickHeld(rt)
				_, err := q.Release(ctx, j)
				mj, ok := fenced(j)
				if mj.token == j.LeaseToken && mj.state == StatePending {
					require.NoError(rt, err, "a repeated Release finds its own write")
					return
				}
				if !ok {
					require.ErrorIs(rt, err, ErrLeaseLost)
					return
				}
				require.NoError(rt, err)
				mj.state, mj.attempt, mj.runAt, mj.leaseUntil = StatePending, max(0, mj.attempt-1), m.now, m.now
				mj.entry = toMillis(mj.runAt)
				if mj.key != "" {
					m.release(mj.key, j.ID)
				}
				runOf(j).ended = true
			},
			"extend": func(rt *rapid.T) {
				if len(held) == 0 {
					rt.Skip("nothing claimed")
				}
				extend(rt, pickHeld(rt))
			},
			"cancel": func(rt *rapid.T) {
				id := rapid.SampledFrom(ids).Draw(rt, "id")
				_, err := q.Cancel(ctx, id)
				mj := m.jobs[id]
				switch {
				case mj == nil:
					require.ErrorIs(rt, err, ErrNotFound)
				case mj.state == StatePending || mj.state == StateActive || mj.state == StateCanceled:
					require.NoError(rt, err)
					mj.state = StateCanceled // a canceled run keeps its slot until its lease ends
					m.rewrite(id)
				default:
					var se *StateError
					require.ErrorAs(rt, err, &se)
				}
			},
			"retry": func(rt *rapid.T) {
				id := rapid.SampledFrom(ids).Draw(rt, "id")
				_, err := q.Retry(ctx, id)
				mj := m.jobs[id]
				switch {
				case mj == nil:
					require.ErrorIs(rt, err, ErrNotFound)
				case mj.state == StateFailed || mj.state == StateCanceled:
					require.NoError(rt, err)
					mj.state, mj.attempt, mj.snoozes, mj.runAt = StatePending, 0, 0, m.now
					if mj.leaseUntil.After(m.now) {
						mj.runAt = mj.leaseUntil // a canceled run's lease ends first
					}
					mj.entry = toMillis(mj.runAt)
					m.rewrite(id)
				default:
					var se *StateError
					require.ErrorAs(rt, err, &se)
				}
			},
			// A batch of fresh jobs in its ID's shard, whose callback the
			// model writes when its last job finishes (settleBatches).
			"batch": func(rt *rapid.T) {
				bid := rapid.SampledFrom(batchIDs).Draw(rt, "batch")
				if m.jobs[bid] != nil || slices.ContainsFunc(m.batches, func(b *mbatch) bool { return b.id == bid }) {
					rt.Skip("batch made")
				}
				var free []string
				for _, b := range bases {
					if m.jobs[b] == nil && q.ks.shardOf(b) == q.ks.shardOf(bid) {
						free = append(free, b)
					}
				}
				if len(free) == 0 {
					rt.Skip("no free ID in the batch's shard")
				}
				n := rapid.IntRange(1, min(3, len(free))).Draw(rt, "jobs")
				cond := rapid.SampledFrom([]BatchCondition{BatchAllFinished, BatchAllSucceeded}).Draw(rt, "condition")
				max := rapid.IntRange(1, 3).Draw(rt, "max")
				jobs := make([]JobSpec, n)
				for i := range jobs {
					jobs[i] = JobSpec{Type: "t", Opts: &EnqueueOpts{ID: free[i], MaxAttempts: max}}
				}
				_, _, err := q.EnqueueBatch(ctx, jobs, JobSpec{Type: "cb"}, &BatchOpts{ID: bid, Condition: cond})
				require.NoError(rt, err)
				b := &mbatch{id: bid, cond: cond, children: free[:n]}
				for _, id := range b.children {
					m.jobs[id] = &mjob{state: StatePending, max: max, runAt: m.now, entry: toMillis(m.now)}
				}
				m.batches = append(m.batches, b)
				m.tally.batches++
			},
			"verify": func(rt *rapid.T) {
				rep, err := q.Verify(ctx, nil)
				require.NoError(rt, err)
				require.Empty(rt, rep.Findings)
			},
			"time passes": func(rt *rapid.T) {
				d := time.Duration(rapid.IntRange(1, 45).Draw(rt, "seconds")) * time.Second
				clock.Advance(d)
				m.now = m.now.Add(d)
			},
			"time to a lease end": func(rt *rapid.T) {
				// Just past the end of a live lease: the moment its slot
				// frees by itself.
				var ends []time.Time
				for _, mj := range m.jobs {
					if mj.state == StateActive && mj.leaseUntil.After(m.now) {
						ends = append(ends, mj.leaseUntil)
					}
				}
				if len(ends) == 0 {
					rt.Skip("no live lease")
				}
				slices.SortFunc(ends, time.Time.Compare)
				d := rapid.SampledFrom(ends).Draw(rt, "lease end").Sub(m.now) + time.Millisecond
				clock.Advance(d)
				m.now = m.now.Add(d)
			},
			"": check, // the check after every step
		})

		// Liveness: once every holder finishes its job, every job left
		// runs: none is stranded waiting for a slot. Each round the claims
		// take all that can run at once (and meet the keys full), then the
		// holders finish, which frees slots and pulls waiting jobs forward
		// for the next round at the same moment; only a round that did
		// nothing lets time pass, past every lease and parked entry.
		for round := 0; ; round++ {
			left := 0
			for _, mj := range m.jobs {
				if mj.state == StatePending || mj.state == StateActive {
					left++
				}
			}
			if left == 0 {
				break
			}
			require.Less(rt, round, 40, "%d jobs left after %d rounds of draining: %+v", left, round, m.project())
			progress := false
			for claim(rt, "drain") != nil {
				progress = true
				check(rt)
			}
			for _, j := range held {
				if _, ok := fenced(j); ok {
					complete(rt, j)
					progress = true
				}
			}
			check(rt)
			if !progress {
				clock.Advance(time.Minute)
				m.now = m.now.Add(time.Minute)
			}
		}
		// Runs canceled while they ran keep their slots until their leases
		// end; then every key is free.
		clock.Advance(m.lease)
		m.now = m.now.Add(m.lease)
		check(rt)
		for _, k := range keys {
			require.Zero(rt, m.live(k, ""))
		}
		if events {
			evs, _ := readEvents(rt, q, "")
			checkEventChains(rt, q, evs, true)
		}
		total.add(m.tally)
	})
	t.Logf("model: %+v", total)
}

// mbatch is the model's batch: its jobs, and whether and how it fired.
type mbatch struct {
	id       string
	cond     BatchCondition
	children []string
	left     [4]int // counts of jobs that left it (replaced), by bucket
	// until is the latest lease end of the runs of jobs that left it: a
	// run canceled while it ran may go on after its job was replaced.
	until time.Time
	fired BatchFired
}

// batchCounts is what b's value must count: each of its jobs by where it
// stands, and the jobs that left it as they were counted then.
func (m *model) batchCounts(b *mbatch) [4]int {
	c := b.left
	for _, id := range b.children {
		c[bucketIndex(bucket(m.jobs[id].state))]++
	}
	return c
}

// leaveBatch takes job id out of its batch, counted canceled if it had not
// finished (a replaced job).
func (m *model) leaveBatch(id string) {
	for _, b := range m.batches {
		if i := slices.Index(b.children, id); i >= 0 {
			s := bucket(m.jobs[id].state)
			if s == StatePending {
				s = StateCanceled
			}
			b.left[bucketIndex(s)]++
			b.until = maxTime(b.until, m.jobs[id].leaseUntil)
			b.children = slices.Delete(slices.Clone(b.children), i, i+1)
		}
	}
}

// settleBatches writes the callback of every batch whose jobs have all
// finished and that has not fired: pending and due now (or once the lease
// of a job canceled while it ran ends), or canceled when
// it waits for success and a job did not succeed.
func (m *model) settleBatches() {
	for _, b := range m.batches {
		c := m.batchCounts(b)
		if b.fired != BatchNotFired || c[0] > 0 {
			continue
		}
		if b.cond == BatchAllSucceeded && c[2]+c[3] > 0 {
			b.fired = BatchFiredCanceled
			m.jobs[b.id] = &mjob{state: StateCanceled, max: m.cbMax, runAt: m.now,
				lastErr: fmt.Sprintf("batch %q did not all succeed: %d succeeded, %d failed, %d canceled", b.id, c[1], c[2], c[3])}
			m.tally.doomed++
			continue
		}
		b.fired = BatchFiredEnqueued
		// Due once every run of its jobs may have ended: a job canceled
		// while it ran keeps its lease, which bounds its handler, even
		// once the job left the batch (batchcount.go: Callback.RunAt).
		due := maxTime(m.now, b.until)
		for _, id := range b.children {
			due = maxTime(due, m.jobs[id].leaseUntil)
		}
		m.jobs[b.id] = &mjob{state: StatePending, max: m.cbMax, runAt: due, entry: toMillis(due)}
		m.tally.fired++
	}
}

func (t *tally) add(o tally) {
	t.claims += o.claims
	t.outcomes += o.outcomes
	t.choices += o.choices
	t.parked += o.parked
	t.lapsedBack += o.lapsedBack
	t.pulled += o.pulled
	t.extendLost += o.extendLost
	t.overLimit += o.overLimit
	t.snoozed += o.snoozed
	t.snoozeLimit += o.snoozeLimit
	t.overRate += o.overRate
	t.replaced += o.replaced
	t.batches += o.batches
	t.fired += o.fired
	t.doomed += o.doomed
}

// A batch's job canceled while it ran, then replaced by a job of no batch
// (it leaves the batch), then the batch's last job finishes: the canceled
// run may go on until its lease ends, so the callback is not due before
// (batch.go, Callback.RunAt). The queue says so, and the model agrees: a
// model that forgot the lease of a run whose job left the batch expected
// the callback due at once, and TestModel failed its Stats check when its
// random claims took that path.
func TestModelWaitsForTheLeaseOfARunWhoseJobLeftItsBatch(t *testing.T) {
	f := setup(t, &Config{Shards: 1})
	q, ctx := f.q, f.ctx
	m := &model{jobs: map[string]*mjob{}, keys: map[string]*mkey{}, now: f.clock.Now(), lease: q.cfg.Lease,
		defLimit: q.cfg.ConcurrencyLimit, cbMax: q.cfg.MaxAttempts}

	// A batch x2 of b and d, each of one attempt.
	_, _, err := q.EnqueueBatch(ctx, []JobSpec{
		{Type: "t", Opts: &EnqueueOpts{ID: "b", MaxAttempts: 1}},
		{Type: "t", Opts: &EnqueueOpts{ID: "d", MaxAttempts: 1}},
	}, JobSpec{Type: "cb"}, &BatchOpts{ID: "x2", Condition: BatchAllFinished})
	require.NoError(t, err)
	for _, id := range []string{"b", "d"} {
		m.jobs[id] = &mjob{state: StatePending, max: 1, runAt: m.now, entry: toMillis(m.now)}
	}
	m.batches = append(m.batches, &mbatch{id: "x2", cond: BatchAllFinished, children: []string{"b", "d"}})

	// Both are claimed.
	held := map[string]*Job{}
	for range 2 {
		j, err := q.Claim(ctx, "w1")
		require.NoError(t, err)
		held[j.ID] = j
		mj := m.jobs[j.ID]
		mj.state, mj.attempt, mj.owner, mj.leaseUntil, mj.token = StateActive, 1, "w1", m.now.Add(m.lease), j.LeaseToken
	}
	require.Len(t, held, 2)

	// d is canceled while it runs: its run keeps its lease.
	_, err = q.Cancel(ctx, "d")
	require.NoError(t, err)
	m.jobs["d"].state = StateCanceled

	// d is replaced by a job of no batch: it leaves x2, counted canceled.
	f.clock.Advance(time.Second)
	m.now = m.now.Add(time.Second)
	_, err = q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "d", MaxAttempts: 1, Priority: 1, IfExists: IfExistsReplace})
	require.NoError(t, err)
	m.leaveBatch("d")
	mj := m.jobs["d"]
	runAt := maxTime(m.now, mj.leaseUntil) // a canceled run's lease ends first
	mj.state, mj.attempt, mj.prio, mj.lastErr, mj.runAt, mj.entry = StatePending, 0, 1, "", runAt, toMillis(runAt)

	// b, the batch's last job, succeeds: x2 fires.
	_, err = q.Complete(ctx, held["b"], []byte("r"))
	require.NoError(t, err)
	m.jobs["b"].state, m.jobs["b"].leaseUntil = StateSucceeded, m.now
	m.settleBatches()

	cb, err := q.Get(ctx, "x2")
	require.NoError(t, err)
	require.Equal(t, held["d"].LeaseUntil, cb.RunAt, "the queue: the callback waits for d's canceled run's lease")
	require.Equal(t, toMillis(cb.RunAt), m.jobs["x2"].entry, "the model's callback entry")
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, m.stats(), st)
}
