// Package readahead holds due index entries read ahead of need, shard by
// shard, for the claims that follow: they take candidates from the pool
// instead of reading the indexes in a round trip of their own. It judges
// entries by when each shard was read, the priorities announced since, and
// which shards' nodes could not be reached; it never reads Redis itself
// (Probe runs the read it is given).
package readahead

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// Candidate is a due index entry: a job of Shard that a claim may take.
// It is a hint like any index entry: the compare-and-set that takes it
// decides from its value.
type Candidate struct {
	Shard int
	ID    string
	Index string // the index it was read from
	// Prio orders candidates, higher first: the priority of the ready
	// index it came from, or above every priority for an expired lease.
	Prio int
}

// View is one read of due entries: the candidates it found, the shards
// it read (every due entry of theirs within the read's window is among
// the candidates), those of them whose node it could not reach, the
// highest priority whose window it filled (-1: none), and when it was
// sent.
type View struct {
	Cands  []Candidate
	Shards []int
	Down   []int
	Full   int
	At     time.Time
}

// Pool holds due entries read ahead of need, shard by shard: the claims
// that follow take candidates from it instead of reading the indexes in a
// round trip of their own. A Candidate is a hint like any index entry: the
// compare-and-set that takes it decides from its value.
//
// The pool must not hide a job that is due on a shard it holds nothing of,
// since every claim of a busy process takes from it. So it hands out
// nothing while some shard's read is older than Fresh (the claim then
// reads every shard, see Queue.candidates), nothing below a priority that
// a hint announced after a shard was read, until that shard is read again,
// and it serves the shards in turn: within a priority, the shard whose
// candidates have waited longest goes first. A taker bound to one shard (a
// transaction stays in one hash slot on a cluster) gets nothing while
// another shard holds a higher priority, or has waited past Starve.
//
// A shard whose node the last read of it could not reach is left out until
// a read reaches it again: a read of a dead node may take seconds (the
// client's dial retries), and the pool must not stop every claim for it.
// Once reprobe has passed, they are read again apart (Probe), so
// a node that is back is seen again.
type Pool struct {
	mu      sync.Mutex
	shards  []poolShard
	skip    func(shard int) bool // shards no read reaches now (their node is down)
	moved   func(shard int) bool // shards whose hash slot names another node since they were unreachable
	reprobe time.Duration        // how long after a shard's node could not be reached it is read again
	// refreshing says a read of every shard is under way (refreshDue).
	refreshing bool
	// probing says a read of the shards whose node could not be reached
	// is under way; probeAt, when the last began.
	probing bool
	probeAt time.Time
	// stopProbe ends the read under way; probeEnded is closed once it has
	// returned (see StopProbe).
	stopProbe  context.CancelFunc
	probeEnded chan struct{}
	// taken remembers the IDs handed out in the last poolTTL, so a read
	// ahead made while their claims were in flight does not hand them out
	// again: two transactions watching one Candidate would both be retried.
	taken map[string]time.Time
}

// poolShard is what the pool holds of one shard.
type poolShard struct {
	cands []Candidate // highest priority first, at random within one
	read  time.Time   // when the read that filled cands was sent; zero: never, or forgotten
	full  int         // the highest priority whose window that read filled: none below it goes
	// need is the highest priority a hint announced since read (0: none):
	// none below it goes until the shard is read again.
	need    int
	needAt  time.Time
	waiting time.Time // since when its candidates have waited, none served; zero: it has none
	gone    bool      // the last read of it could not reach its node
}

const (
	// Fresh is how long a shard's read serves claims: a job that comes
	// due is seen by them within it.
	Fresh = 250 * time.Millisecond
	// Starve is how long a shard's candidates may wait while takers
	// bound to other shards serve theirs.
	Starve = 250 * time.Millisecond
	// poolTTL is how long the pool remembers a Candidate it handed out.
	poolTTL = 500 * time.Millisecond
)

// Takers of candidates not bound to one shard: AnyShard takes them in
// turn from every shard, OneShard from the one whose turn it is.
const (
	AnyShard = -1
	OneShard = -2
)

// maxTaken bounds duePool.taken.
const maxTaken = 4096

// New returns an empty pool of a queue of shards shards. skip says which
// shards no read reaches now; moved, which shards' hash slots name another
// node since they could not be reached; reprobe, how long after a read
// could not reach a shard's node it is read again (Probe).
func New(shards int, skip, moved func(int) bool, reprobe time.Duration) *Pool {
	p := &Pool{shards: make([]poolShard, shards), skip: skip, moved: moved, reprobe: reprobe}
	p.Drop()
	return p
}

// skipped reports a shard no read reaches now, or none reached last.
// p.mu is held.
func (p *Pool) skipped(s int) bool {
	return p.gone(s) || p.skip != nil && p.skip(s)
}

// gone reports a shard the last read of it could not reach, unless the
// hash slot map names another node for it since (a replica promoted). p.mu is
// held.
func (p *Pool) gone(s int) bool {
	return p.shards[s].gone && (p.moved == nil || !p.moved(s))
}

// probeDue returns the shards whose node the last read could not reach
// and that are due to be read again (reprobe after the last such read),
// when no such read is under way; if it names some, one is under way from
// now until probed is called, under ctx, which stopProbe ends.
func (p *Pool) probeDue() ([]int, context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if p.probing || now.Sub(p.probeAt) <= p.reprobe && !p.anyMoved() {
		return nil, nil
	}
	var out []int
	for s := range p.shards {
		if p.shards[s].gone && (p.skip == nil || !p.skip(s)) {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	p.probing, p.probeAt = true, now
	ctx, cancel := context.WithTimeout(context.Background(), 5*p.reprobe)
	p.stopProbe, p.probeEnded = cancel, make(chan struct{})
	return out, ctx
}

// IsGone reports a shard whose node the last read of it could not reach.
func (p *Pool) IsGone(s int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return s >= 0 && s < len(p.shards) && p.gone(s)
}

// anyMoved reports a shard gone from the pool whose hash slot map names another
// node now: it is read again at once. p.mu is held.
func (p *Pool) anyMoved() bool {
	for s := range p.shards {
		if p.shards[s].gone && p.moved != nil && p.moved(s) {
			return true
		}
	}
	return false
}

// Probe reads again, apart from the claims, the shards whose node the
// last read could not reach, once reprobe has passed: the pool and the
// claims leave them out meanwhile, since a read of a dead node may take
// the client's dial retries. It returns at once; read runs on a goroutine
// of its own, bounded by 5×reprobe, and what it returns fills the pool.
// StopProbe ends it.
func (p *Pool) Probe(read func(ctx context.Context, shards []int) (View, error)) {
	shards, ctx := p.probeDue()
	if len(shards) == 0 {
		return
	}
	go func() {
		defer p.probed()
		if v, err := read(ctx, shards); err == nil {
			p.Fill(v)
		}
	}()
}

// StopProbe ends the read that Probe started, if one is under way, and
// waits for it to return. The shards stay gone until a later read reaches
// them.
func (p *Pool) StopProbe() {
	p.mu.Lock()
	stop, ended := p.stopProbe, p.probeEnded
	p.mu.Unlock()
	if stop != nil {
		stop()
		<-ended
	}
}

// Probing reports a read that Probe started and that has not returned.
func (p *Pool) Probing() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.probing
}

// probed notes that the read probeDue announced is over.
func (p *Pool) probed() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopProbe()
	close(p.probeEnded)
	p.probing, p.stopProbe, p.probeEnded = false, nil, nil
}

// Reachable returns the shards a read reached last.
func (p *Pool) Reachable() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := []int{}
	for s := range p.shards {
		if !p.skipped(s) {
			out = append(out, s)
		}
	}
	return out
}

// fresh reports whether every shard a read reaches was read within
// Fresh. p.mu is held.
func (p *Pool) fresh(now time.Time) bool {
	for s := range p.shards {
		if r := p.shards[s].read; (r.IsZero() || now.Sub(r) > Fresh) && !p.skipped(s) {
			return false
		}
	}
	return true
}

// Complete reports whether the pool vouches for every shard a read
// reaches: each was read within Fresh, and after the last hint of a
// priority. When it does not, a claim reads every shard.
func (p *Pool) Complete() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.fresh(time.Now()) {
		return false
	}
	for s := range p.shards {
		if p.shards[s].need > 0 && !p.skipped(s) {
			return false
		}
	}
	return true
}

// floor returns the lowest priority the pool may hand out now. p.mu is
// held.
func (p *Pool) floor() int {
	f := 0
	for s := range p.shards {
		if !p.skipped(s) {
			f = max(f, p.shards[s].full, p.shards[s].need)
		}
	}
	return f
}

// Fill replaces what the pool holds of the shards v read, less the
// candidates handed out lately.
func (p *Pool) Fill(v View) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	// Sized once: a read ahead holds up to 32 candidates per index, and a
	// map or slice grown one candidate at a time allocated at each
	// doubling, on every transaction of a busy Work.
	keep := make([]Candidate, 0, len(v.Cands))
	seen := make(map[string]bool, len(v.Cands))
	oneShard := true
	for _, c := range v.Cands {
		if at, ok := p.taken[c.ID]; ok && now.Sub(at) <= poolTTL || seen[c.ID] {
			continue
		}
		seen[c.ID] = true // once each
		keep = append(keep, c)
		oneShard = oneShard && c.Shard == keep[0].Shard
	}
	// The candidates by shard: one run of keep when they are all one
	// shard's (a Work on one shard, the usual case), else grouped once.
	var by map[int][]Candidate
	if !oneShard {
		by = make(map[int][]Candidate, len(v.Shards))
		for _, c := range keep {
			by[c.Shard] = append(by[c.Shard], c)
		}
	}
	filled := make(map[int]bool, len(v.Shards))
	for _, s := range v.Shards {
		if s < 0 || s >= len(p.shards) || filled[s] {
			continue // a shard listed twice is filled once
		}
		filled[s] = true
		ps := &p.shards[s]
		if v.At.Before(ps.read) {
			continue // a later read filled it already
		}
		var cands []Candidate
		switch {
		case by != nil:
			cands = by[s]
		case len(keep) > 0 && keep[0].Shard == s:
			cands = keep
		}
		ByPriority(cands)
		had := len(ps.cands) > 0
		ps.cands, ps.read, ps.full = cands, v.At, v.Full
		ps.gone = slices.Contains(v.Down, s)
		if ps.need > 0 && v.At.After(ps.needAt) {
			ps.need = 0
		}
		switch {
		case len(cands) == 0:
			ps.waiting = time.Time{}
		case !had:
			ps.waiting = now
		}
	}
}

// Take removes up to n candidates and returns them: highest priority
// first, and within one, the shards in turn, the one whose candidates
// have waited longest first, each shard's as many as it has, so that a
// transaction touches few shards. shard names the only shard they may
// come from, or is AnyShard or OneShard (the shard whose turn it is, and
// no other). A bound taker gets its shard's candidates only while no
// other shard's rank above them, nor, at the same priority, have waited
// past Starve.
func (p *Pool) Take(n int, shard int) []Candidate {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if n <= 0 || !p.fresh(now) {
		return nil
	}
	floor := p.floor()
	out := make([]bool, len(p.shards)) // no read reaches it now
	for s := range p.shards {
		out[s] = p.skipped(s)
	}
	head := func(s int) int {
		if c := p.shards[s].cands; len(c) > 0 && c[0].Prio >= floor && !out[s] {
			return c[0].Prio
		}
		return -1
	}
	start := rand.N(len(p.shards)) // ties go to a shard at random
	cur := max(shard, -1)          // the shard taken from
	var got []Candidate
taking:
	for len(got) < n {
		best := -1
		for k := range p.shards {
			s := (start + k) % len(p.shards)
			switch h := head(s); {
			case h < 0:
			case best < 0, h > head(best), h == head(best) && p.shards[s].waiting.Before(p.shards[best].waiting):
				best = s
			}
		}
		switch {
		case best < 0:
			break taking
		case cur < 0:
			cur = best // its turn: drained before another's
		case head(cur) < head(best): // cur has none left, or a higher priority is elsewhere
			if shard != AnyShard {
				break taking
			}
			cur = best
		case shard >= 0 && best != cur && now.Sub(p.shards[best].waiting) > Starve:
			break taking // another shard's turn is overdue
		}
		ps := &p.shards[cur]
		got = append(got, ps.cands[0])
		ps.cands = ps.cands[1:]
	}
	if len(got) > 0 {
		if p.taken == nil || len(p.taken) > maxTaken {
			p.taken = map[string]time.Time{} // forget: at worst a Candidate is tried twice
		}
		for _, c := range got {
			p.taken[c.ID] = now
		}
	}
	return got
}

// Served notes that a claim tried cands: their shards had their turn.
func (p *Pool) Served(cands []Candidate) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for _, c := range cands {
		if c.Shard < 0 || c.Shard >= len(p.shards) {
			continue
		}
		if ps := &p.shards[c.Shard]; len(ps.cands) > 0 {
			ps.waiting = now
		} else {
			ps.waiting = time.Time{}
		}
	}
}

// PutBack returns candidates taken from the pool and not tried: they are
// handed out again, first within their priority.
func (p *Pool) PutBack(cands []Candidate) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	by := map[int][]Candidate{}
	held := map[string]bool{} // the IDs of the shards put back to, and those put back
	for _, c := range cands {
		if c.Shard < 0 || c.Shard >= len(p.shards) {
			continue
		}
		delete(p.taken, c.ID)
		if _, ok := by[c.Shard]; !ok {
			by[c.Shard] = nil
			for _, o := range p.shards[c.Shard].cands {
				held[o.ID] = true
			}
		}
		if !held[c.ID] {
			held[c.ID] = true
			by[c.Shard] = append(by[c.Shard], c)
		}
	}
	for s, back := range by {
		ps := &p.shards[s]
		ps.cands = append(back, ps.cands...)
		slices.SortStableFunc(ps.cands, func(a, b Candidate) int { return b.Prio - a.Prio })
		if ps.waiting.IsZero() {
			ps.waiting = now
		}
	}
}

// Holds reports whether the pool can serve the next takes of n
// candidates without a read ahead: each shard of in (nil: every shard)
// that a read reaches was read within Fresh/2 and after the last hint
// of a priority (none of them is stale), and those shards hold at least 2n
// candidates, and one at least, that the pool would hand out now. A fused
// transaction then skips its read ahead: a shard is read again before the
// pool stops serving it, and at once after a hint, as when it reads ahead
// every time.
func (p *Pool) Holds(n int, in []int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	floor := p.floor()
	have := 0
	for s := range p.shards {
		if p.skipped(s) || in != nil && !slices.Contains(in, s) {
			continue
		}
		ps := &p.shards[s]
		if ps.read.IsZero() || ps.need > 0 || now.Sub(ps.read) > Fresh/2 {
			return false
		}
		for _, c := range ps.cands { // highest priority first
			if c.Prio < floor {
				break
			}
			have++
		}
	}
	return have >= max(2*n, 1)
}

// Drop forgets what the pool holds, and that any shard was read.
func (p *Pool) Drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.shards {
		p.shards[s] = poolShard{full: -1}
	}
}

// DropBelow forgets the candidates of a priority below prio: a job of
// priority prio became due on some shard, and must not be passed over for
// them. Those of prio and above may still go first; lower ones go again
// once every shard has been read since.
func (p *Pool) DropBelow(prio int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for s := range p.shards {
		ps := &p.shards[s]
		ps.cands = slices.DeleteFunc(ps.cands, func(c Candidate) bool { return c.Prio < prio })
		if len(ps.cands) == 0 {
			ps.waiting = time.Time{}
		}
		if prio > 0 {
			ps.need, ps.needAt = max(ps.need, prio), now
		}
	}
}

// RefreshDue reports whether a read of every shard is due, as stale
// would name some, and none is under way; if so, one is under way from now
// until refreshed is called.
func (p *Pool) RefreshDue() bool {
	if len(p.Stale(nil, 1)) == 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.refreshing {
		return false
	}
	p.refreshing = true
	return true
}

// Refreshed notes that the read refreshDue announced is over.
func (p *Pool) Refreshed() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refreshing = false
}

// Stale returns up to k shards, other than own, that a read ahead should
// refresh before the pool stops serving: those a hint made wait first,
// then those read longest ago, of those read more than Fresh/2 ago.
func (p *Pool) Stale(own []int, k int) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	var out []int
	for s := range p.shards {
		ps := &p.shards[s]
		if !slices.Contains(own, s) && !p.skipped(s) && (ps.need > 0 || now.Sub(ps.read) > Fresh/2) {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b int) int {
		pa, pb := &p.shards[a], &p.shards[b]
		if (pa.need > 0) != (pb.need > 0) {
			if pa.need > 0 {
				return -1
			}
			return 1
		}
		return pa.read.Compare(pb.read)
	})
	return out[:min(k, len(out))]
}

// ByPriority orders candidates by priority, highest first, at random
// within a priority: claimers of one priority spread over its jobs, and a
// higher priority is always tried first.
func ByPriority(cands []Candidate) {
	rand.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
	slices.SortStableFunc(cands, func(a, b Candidate) int { return b.Prio - a.Prio })
}
