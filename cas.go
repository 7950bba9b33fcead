package jobkey

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobkey/jobkey/internal/cas"
	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// The job layer of the compare-and-set. The engine (internal/cas) carries
// raw values; this layer decodes what a transaction read into jobs, runs
// the job's decision on them, and encodes the decision's plan back into
// whole values, each with its revision bumped past the value it replaces.

// typeCheck declares a key a transaction writes besides the job keys, with
// the type it must have (cas.TypeCheck).
type typeCheck = cas.TypeCheck

// rawRead is one key as a GET read it.
type rawRead = reply.Raw

// casWrite sets one watched job key to a whole new value.
type casWrite struct {
	key string
	job *Job
	ttl time.Duration // > 0: the key expires (retention of finished jobs)
}

// auxWrite sets a watched auxiliary key (casTxn.aux, casTxn.follow) to a
// whole new value, or deletes it when val is nil.
type auxWrite struct {
	key string
	val []byte
	ttl time.Duration // > 0: the key expires (a concurrency value with no limit of its own)
}

// casPlan is what a decision asks for in one MULTI/EXEC: whole values
// first, then idempotent extra steps (index updates). checks lists every
// key the steps write, with the type it must have.
type casPlan struct {
	writes []casWrite
	aux    []auxWrite // whole values of watched auxiliary keys
	steps  [][]any
	checks []typeCheck
	// results holds, once EXEC answered, every command's reply, for the
	// decisions that depend on what a step found (settleLostHints).
	results []cas.Result
	// confirm says the decision answers from a write it recognised as its
	// own (a retried Complete, an Enqueue that found its job): when writes
	// wait for replicas, that write is waited for too (cas.Plan.Confirm).
	confirm bool
	// raised is the highest priority above 0 of a job the plan makes
	// pending (indexPlan.raised).
	raised int
	// newer lists the jobs of a newer format a claim found: claimers
	// look past them for a while (Queue.newerFormat).
	newerFormat []string
	// batch lists the moves of batch jobs the plan makes that change their
	// batch's counts: q.run counts them (batch.go).
	batch []batchMove
	// fired counts the batch callbacks the plan writes; events, the events
	// it appends (Queue.Metrics counts them once the EXEC committed).
	fired, events int
	// moves lists the plan's transitions (indexPlan.moves): each is an
	// event in its shard's stream, in the same EXEC, when the shard's
	// events are on (events.go).
	moves []stateChange
	// encoded holds the values encodePlan wrote, from encodeBufs: q.run
	// puts it back once the engine's Run has returned.
	encoded *[]byte
}

// encodeBufs holds the buffers the values of a transaction are encoded
// into. A value is read only while its EXEC is written: nothing keeps it
// once the engine's Run returns (a write's cas.Result names its key, not
// its value, and go-redis writes on the calling goroutine), so q.run puts
// the buffer back then. Every value of the burn-down and of an enqueue was
// a fresh allocation before: pooled, the burn-down allocates 15% fewer
// bytes per job and an enqueue 26% fewer, and the garbage collector runs
// that much less often.
var encodeBufs sync.Pool

// maxPooledEncode bounds the buffers encodeBufs keeps: a transaction of
// large values does not pin its buffer in every P's pool.
const maxPooledEncode = 256 << 10

// encodeBuf returns an empty buffer of at least n bytes' capacity.
func encodeBuf(n int) *[]byte {
	if b, _ := encodeBufs.Get().(*[]byte); b != nil {
		if cap(*b) >= n {
			*b = (*b)[:0]
			return b
		}
		encodeBufs.Put(b) // too small for this one: another may fit
	}
	// Rounded up to a power of two: a transaction's values vary in size
	// from one to the next, and a buffer made to measure would fit few.
	b := make([]byte, 0, 1<<bits.Len(uint(max(n, 4<<10)-1)))
	return &b
}

// releaseEncoded puts the plan's value buffer back in encodeBufs. Only
// once no EXEC can still be writing it.
func (p *casPlan) releaseEncoded() {
	if p == nil || p.encoded == nil {
		return
	}
	if b := p.encoded; cap(*b) <= maxPooledEncode {
		if poisonEncoded.Load() {
			// Tests: a value still read after this reads as garbage,
			// not as a stale copy that happens to look right.
			for i := range *b {
				(*b)[i] = 0xEE
			}
		}
		*b = (*b)[:0]
		encodeBufs.Put(b)
	}
	p.encoded = nil
}

// poisonEncoded makes releaseEncoded overwrite what a buffer held before
// it goes back to the pool. The package's tests turn it on for every test.
var poisonEncoded atomic.Bool

// index takes ip's index writes, and what they say, into the plan.
func (p *casPlan) index(ip *indexPlan) {
	p.steps, p.checks, p.raised = ip.steps(), ip.checks, ip.raised
	p.batch = append(p.batch, ip.batch...)
	p.moves = append(p.moves, ip.moves...)
}

func (p *casPlan) empty() bool {
	return p == nil || (len(p.writes) == 0 && len(p.aux) == 0 && len(p.steps) == 0)
}

// casRead is the state a decision sees: one job per watched key, and
// Redis's clock when they were read.
type casRead struct {
	jobs []*Job  // nil when the key does not exist or could not be read
	errs []error // per key: *CorruptError, ErrUnsupportedFormat, *WrongTypeError
	now  time.Time
	// guarded says, per casTxn.guards key, whether it holds a value.
	guarded []bool
	// aux holds the auxiliary keys read under WATCH (casTxn.aux and what
	// casTxn.follow named), raw: the decision decodes them.
	aux map[string]rawRead
}

// casTxn is one compare-and-set over job values: cas.Txn, with decisions
// that see jobs. decide may run several times, once per attempt, each time
// on freshly read values; it must not keep state between runs. See
// cas.Txn for what each field does.
type casTxn struct {
	route   string
	keys    []string
	checks  []typeCheck
	noRetry bool
	guards  []string
	decide  func(r *casRead) (*casPlan, error)
	aux     []string
	follow  func(r *casRead) []string
	extra   func(ctx context.Context, p redis.Pipeliner) func(r *casRead) error
	watch   []string // keys only extra reads, watched in round trip 1 (tx.go)
}

// run applies t through the engine. It returns the read and the plan of
// the attempt that committed (or that decided to write nothing: a nil
// plan). A *ReplicationError comes with them: the attempt committed on
// the master, and its replicas did not confirm it in time.
func (q *Queue) run(ctx context.Context, t *casTxn) (*casRead, *casPlan, error) {
	// Each attempt reads afresh; its jobs are decoded once, for follow,
	// extra and decide alike.
	var src *cas.Read
	var cur *casRead
	decoded := func(r *cas.Read) *casRead {
		if r != src {
			src, cur = r, decodeRead(t.keys, r)
			cur.guarded = cur.guarded[:min(len(t.guards), len(cur.guarded))] // the events flags are q.run's
		}
		cur.aux = r.Aux // follow may have read more since
		return cur
	}
	var plan *casPlan
	// Every job transaction watches and reads its shards' events flags
	// beside its own guards, in round trip 1 (events.go).
	ev := q.eventGuards(t.keys)
	guards, checks := ev.extend(t.guards, t.checks)
	ct := &cas.Txn{Route: t.route, Keys: t.keys, Checks: checks, NoRetry: t.noRetry, Guards: guards, Aux: t.aux,
		Decide: func(r *cas.Read) (*cas.Plan, error) {
			jr := decoded(r)
			p, err := t.decide(jr)
			if err == nil && p != nil && len(p.batch) > 0 {
				// Batch jobs that end (or start again) are counted in
				// their batch's value in this EXEC; it may need to read
				// that value first (cas.NeedKeys).
				err = q.countBatches(jr, p)
				if _, more := err.(*cas.NeedKeys); more {
					// Decided again on what it reads then: decide may have
					// edited the jobs it read in place.
					src = nil
				}
			}
			if plan != p {
				// Attempts run one after another: the last one's EXEC was
				// written, or never will be.
				plan.releaseEncoded()
			}
			plan = p
			if err != nil || p == nil {
				return nil, err
			}
			if err := q.addEvents(p, t.keys, jr, ev, r.Guarded[len(t.guards):]); err != nil {
				return nil, err
			}
			for _, id := range p.newerFormat {
				q.newerFormat.Add(id)
			}
			if p.raised > 0 {
				// A job of that priority may be pending once this EXEC
				// runs: what this process read ahead below it must not go
				// before it, and its reads take every priority from now.
				q.pool.DropBelow(p.raised)
				q.prios.Store(true)
			}
			return encodePlan(t.keys, jr, p)
		}}
	ct.Watch = t.watch
	if t.follow != nil {
		ct.Follow = func(r *cas.Read) []string { return t.follow(decoded(r)) }
	}
	if t.extra != nil {
		ct.Extra = func(ctx context.Context, p redis.Pipeliner) func(*cas.Read) error {
			after := t.extra(ctx, p)
			if after == nil {
				return nil
			}
			return func(r *cas.Read) error { return after(decoded(r)) }
		}
	}
	r, cp, err := q.cas.Run(ctx, ct)
	// No EXEC writes the plan's values any more.
	plan.releaseEncoded()
	if err != nil && !errors.Is(err, ErrOutcomeUnknown) {
		// A connection that broke before the EXEC was sent wrote nothing:
		// the caller is told Redis could not be reached, not a bare EOF.
		if ue := unreachable(q.rdb, err); ue != nil {
			err = ue
		}
	}
	var jr *casRead
	if r != nil {
		jr = decoded(r)
	}
	if cp == nil {
		return jr, nil, err
	}
	plan.results = cp.Results
	if plan.fired > 0 || plan.events > 0 {
		// Committed (on the master, at least: a *ReplicationError says
		// the replicas did not confirm it).
		q.written.callbacks.Add(int64(plan.fired))
		q.written.events.Add(int64(plan.events))
	}
	return jr, plan, err
}

// decodeRead turns the raw values of keys into jobs. A missing key is a
// nil job; a key of another type or a value that cannot be decoded is
// reported per key and left untouched. The jobs share one allocation, and
// each owns its reply's bytes (unmarshalReply).
func decodeRead(keys []string, raw *cas.Read) *casRead {
	// A batch's read and its per-key slices are one allocation.
	type readBuf struct {
		r    casRead
		jobs [8]*Job
		errs [8]error
	}
	buf := new(readBuf)
	r := &buf.r
	r.now, r.guarded, r.aux = raw.Now, raw.Guarded, raw.Aux
	if len(keys) <= len(buf.jobs) {
		r.jobs, r.errs = buf.jobs[:len(keys):len(keys)], buf.errs[:len(keys):len(keys)]
	} else {
		r.jobs, r.errs = make([]*Job, len(keys)), make([]error, len(keys))
	}
	var slab []Job
	for i, v := range raw.Values {
		switch {
		case v.Missing:
			continue
		case v.Err != nil:
			// The engine passes on only WRONGTYPE; any other error failed
			// the read.
			r.errs[i] = &WrongTypeError{Key: keys[i], Want: "string", Got: "non-string"}
			continue
		}
		if len(slab) == 0 {
			slab = make([]Job, len(raw.Values)-i)
		}
		j := &slab[0]
		if err := unmarshalReply(v.S, j); err != nil {
			var ce *CorruptError
			if errors.As(err, &ce) {
				ce.Key = keys[i]
			} else {
				err = fmt.Errorf("key %q: %w", keys[i], err)
			}
			r.errs[i] = err
			continue
		}
		if err := storedAt(keys[i], j); err != nil {
			r.errs[i] = err
			continue
		}
		r.jobs[i] = j
		slab = slab[1:]
	}
	return r
}

// encodePlan bumps each written job's revision past the value it replaces
// and encodes it. The values share one buffer, of their exact total size;
// each is capped, so nothing appends across.
func encodePlan(keys []string, read *casRead, plan *casPlan) (*cas.Plan, error) {
	out := &cas.Plan{Steps: plan.steps, Checks: plan.checks, Confirm: plan.confirm}
	if plan.empty() {
		return out, nil
	}
	total := 0
	for _, w := range plan.writes {
		var prevRev uint64
		idx := slices.Index(keys, w.key)
		switch raw, ok := read.aux[w.key]; {
		case idx < 0 && ok && raw.Missing:
			// A job made where an auxiliary key was read missing: a
			// batch's callback (batch.go).
		case idx < 0:
			return nil, fmt.Errorf("jobkey: internal error: write to unwatched key %q", w.key)
		case read.jobs[idx] != nil:
			prevRev = read.jobs[idx].Rev // read first: decide may have edited prev in place
		}
		w.job.Rev = prevRev + 1
		n, err := marshalSize(w.job)
		if err != nil {
			return nil, err
		}
		total += n
	}
	out.Writes = make([]cas.Write, 0, len(plan.writes)+len(plan.aux))
	if len(plan.writes) > 0 {
		enc := encodeBuf(total)
		buf := *enc
		for _, w := range plan.writes {
			start := len(buf)
			buf = appendJob(buf, w.job)
			out.Writes = append(out.Writes, cas.Write{Key: w.key, Value: buf[start:len(buf):len(buf)], TTL: w.ttl})
		}
		*enc, plan.encoded = buf, enc
	}
	for _, w := range plan.aux {
		out.Writes = append(out.Writes, cas.Write{Key: w.key, Value: w.val, TTL: w.ttl, Del: w.val == nil})
	}
	return out, nil
}

// sleepCtx waits d, or until ctx ends, and returns ctx's error then.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
