package jobkey

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
)

// The event stream, written side. Once a shard's events are on (its flag,
// keyspace.eventsKey, holds a value), every transaction that changes the
// state of one of the shard's jobs appends one event per job to the
// shard's stream (keyspace.streamKey) in its own EXEC: XADD ... MAXLEN ~
// Config.EventsMaxLen * job <id> type <type> from <state> to <state>
// attempt <n> at <unix ms> worker <name>. So the stream cannot disagree
// with the jobs: an EXEC that did not land wrote no event, and one that
// landed wrote every event of it.
//
// Every job transaction reads the flags of its jobs' shards under WATCH,
// in round trip 1, beside its own guards (q.run, eventGuards): a flag
// flipped between that read and the EXEC aborts the EXEC, and the retry
// sees the flag as it is now. The XADDs are planned where each job's
// index writes are (decider.move records the transition), so every path
// that writes a job gets its events, whoever added it.

// stateChange is one job's change of state in a plan, as its event says
// it.
type stateChange struct {
	shard    int
	id, typ  string
	from, to State // 0: the job did not exist before (from), or is deleted (to)
	attempt  int
	worker   string
}

// stateChangeOf returns the transition that writing new over old (nil: no
// value) makes, or false when the write is no transition: the state stays
// and no run starts. A lease renewal (Extend), an Update, progress and an
// index repair are no transitions; a claim that takes over a run whose
// lease ran out is one (active to active, a new lease token and attempt).
func stateChangeOf(shard int, id string, old, new *Job) (stateChange, bool) {
	t := stateChange{shard: shard, id: id}
	switch {
	case old == nil && new == nil:
		return t, false
	case old == nil:
		t.to, t.typ, t.attempt = new.State, new.Type, new.Attempt
	case new == nil:
		t.from, t.typ, t.attempt = old.State, old.Type, old.Attempt
	default:
		newRun := new.State == StateActive && (old.State != StateActive || new.LeaseToken != old.LeaseToken)
		if old.State == new.State && !newRun {
			return t, false
		}
		t.from, t.to, t.typ, t.attempt = old.State, new.State, new.Type, new.Attempt
	}
	// The worker of the run that starts, else of the run that ends.
	switch {
	case new != nil && new.State == StateActive:
		t.worker = new.LeaseOwner
	case old != nil && old.State == StateActive:
		t.worker = old.LeaseOwner
	}
	return t, true
}

// eventShards are the shards of one transaction's job keys, and their
// events flags, which the transaction watches and reads as guards after
// its own.
type eventShards struct {
	shards []int
	keys   []string    // the events flag of each shard
	checks []typeCheck // the streams of the shards last found on
}

// eventGuards returns the events flags of the shards of keys. A shard
// whose last transaction found its events on has its stream's type
// checked in round trip 1 too; any other shard's is checked, should its
// events be found on, in one more round trip under the same WATCH (the
// engine's late checks), once per process and shard after EnableEvents.
func (q *Queue) eventGuards(keys []string) *eventShards {
	var ev *eventShards
	for _, k := range keys {
		s, ok := q.ks.shardOfJobKey(k)
		if !ok {
			continue
		}
		if ev == nil {
			ev = &eventShards{}
		} else if slices.Contains(ev.shards, s) {
			continue
		}
		ev.shards = append(ev.shards, s)
		ev.keys = append(ev.keys, q.ks.eventsKey(s))
		if q.eventsSeen[s].Load() {
			ev.checks = append(ev.checks, typeCheck{Key: q.ks.streamKey(s), Want: "stream"})
		}
	}
	return ev
}

// extend returns guards and checks with ev's flags and checks after them.
func (ev *eventShards) extend(guards []string, checks []typeCheck) ([]string, []typeCheck) {
	if ev == nil {
		return guards, checks
	}
	return slices.Concat(guards, ev.keys), slices.Concat(checks, ev.checks)
}

// addEvents appends to p an XADD per transition of p whose shard's events
// flag on says is set, with its stream's type check. r is what the
// transaction read, keys its keys.
func (q *Queue) addEvents(p *casPlan, keys []string, r *casRead, ev *eventShards, on []bool) error {
	anyOn := false
	if ev != nil {
		for i, s := range ev.shards {
			if i < len(on) && q.eventsSeen[s].Load() != on[i] {
				q.eventsSeen[s].Store(on[i])
			}
			anyOn = anyOn || i < len(on) && on[i]
		}
	}
	if anyOn {
		if err := unplanned(keys, r, p); err != nil {
			return err
		}
	}
	if len(p.moves) == 0 {
		return nil
	}
	at := toMillis(r.now)
	var checked []bool // per position in ev.shards: its stream's check is in p.checks
	for _, m := range p.moves {
		i := -1
		if ev != nil {
			i = slices.Index(ev.shards, m.shard)
		}
		if i < 0 || i >= len(on) {
			return fmt.Errorf("jobkey: internal error: a transition of %q in shard %d, whose events flag the transaction did not read", m.id, m.shard)
		}
		if !on[i] {
			continue
		}
		stream := q.ks.streamKey(m.shard)
		if checked == nil {
			checked = make([]bool, len(ev.shards))
		}
		if !checked[i] {
			checked[i] = true
			p.checks = append(p.checks, typeCheck{Key: stream, Want: "stream"})
		}
		p.events++
		p.steps = append(p.steps, []any{"xadd", stream, "maxlen", "~", q.cfg.EventsMaxLen, "*",
			"job", m.id, "type", m.typ, "from", stateName(m.from), "to", stateName(m.to),
			"attempt", m.attempt, "at", at, "worker", m.worker})
	}
	return nil
}

// stateName is s's name in an event: "" for none.
func stateName(s State) string {
	if s == 0 {
		return ""
	}
	return s.String()
}

// EnableEvents turns the queue's event stream on, on every shard: from
// its return on, every transition of a job (an enqueue, a claim, a
// completion, a failure, a release, a cancel, a retry, a deletion, and a
// claim that finds a lease run out) appends an event to its shard's
// stream in the transition's own EXEC, and Events and FollowEvents
// read them. A lease renewal (Extend), an Update and progress are no
// transitions, and have no event; nor does a finished job whose key
// expires (Config.Retention).
//
// Each shard's flag is a compare-and-set of its own (two round trips, the
// shards at once), which also appends an entry that says the events
// went on, so a reader can tell a stream that was off from one that had
// nothing to say. A shard already on is left as it is. A key of another
// type in the flag's or the stream's place is refused with a
// *WrongTypeError. With Config.MinReplicas each waits for the replicas,
// as Pause does; a *ShardsError names the shards not written or not
// confirmed: run EnableEvents again.
func (q *Queue) EnableEvents(ctx context.Context) error {
	return q.setEvents(ctx, true)
}

// DisableEvents turns the event stream off on every shard, as
// EnableEvents turned it on: transitions from its return on append no
// event. The streams and their events stay, for readers to finish; each
// shard's ends with an entry that says the events went off.
func (q *Queue) DisableEvents(ctx context.Context) error {
	return q.setEvents(ctx, false)
}

// Values of the entries EnableEvents and DisableEvents append, under the
// field eventsSwitchField.
const (
	eventsSwitchField = "events"
	eventsOn          = "on"
	eventsOff         = "off"
)

func (q *Queue) setEvents(ctx context.Context, on bool) error {
	if err := q.check(ctx, true); err != nil {
		return err
	}
	errs := make([]error, q.ks.shards)
	var wg sync.WaitGroup
	for s := range q.ks.shards {
		wg.Go(func() {
			key, stream := q.ks.eventsKey(s), q.ks.streamKey(s)
			errs[s] = q.setShardEvents(ctx, key, stream, on)
			if errs[s] == nil {
				q.eventsSeen[s].Store(on)
			}
		})
	}
	wg.Wait()
	failed := &ShardsError{Of: q.ks.shards, Write: true}
	for s, err := range errs {
		if err != nil {
			failed.add(s, fmt.Errorf("jobkey: write %s: %w", q.ks.eventsKey(s), err))
		}
	}
	return failed.orNil()
}

// setShardEvents sets one shard's events flag by compare-and-set, and
// appends the entry that says so to its stream in the same EXEC.
func (q *Queue) setShardEvents(ctx context.Context, key, stream string, on bool) error {
	checks := []typeCheck{{Key: stream, Want: "stream"}}
	_, _, err := q.run(ctx, &casTxn{aux: []string{key}, checks: checks, decide: func(r *casRead) (*casPlan, error) {
		cur := r.aux[key]
		switch {
		case cur.Err != nil:
			return nil, &WrongTypeError{Key: key, Want: "string", Got: "non-string"}
		case on && !cur.Missing, !on && cur.Missing:
			return &casPlan{confirm: true}, nil // as asked already, maybe by this caller's last try
		}
		word := eventsOff
		plan := &casPlan{aux: []auxWrite{{key: key}}, checks: checks}
		if on {
			word, plan.aux[0].val = eventsOn, []byte("1")
		}
		plan.steps = [][]any{{"xadd", stream, "maxlen", "~", q.cfg.EventsMaxLen, "*",
			eventsSwitchField, word, "at", strconv.FormatInt(toMillis(r.now), 10)}}
		return plan, nil
	}})
	return err
}

// unplanned refuses a plan that writes a job's new state without the
// transition decider.move records: the write would land without its
// event. Every path that writes a job plans its index writes through
// move, so this holds unless a new path forgets it; the refusal says so
// instead of writing in silence.
func unplanned(keys []string, r *casRead, p *casPlan) error {
	if len(p.writes) == 0 {
		return nil
	}
	var moved map[string]bool
	for _, w := range p.writes {
		i := slices.Index(keys, w.key)
		if i < 0 || i >= len(r.jobs) {
			continue // encodePlan refuses it
		}
		if _, ok := stateChangeOf(0, w.job.ID, r.jobs[i], w.job); !ok {
			continue
		}
		if moved == nil {
			moved = make(map[string]bool, len(p.moves))
			for _, m := range p.moves {
				moved[m.id] = true
			}
		}
		if !moved[w.job.ID] {
			return fmt.Errorf("jobkey: internal error: a write of %q changes its state without the transition its event needs (decider.move)", w.job.ID)
		}
	}
	return nil
}
