package jobkey

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// attempt is one pass: read under WATCH, decide, check the types of keys
// nobody predicted, EXEC, and classify what came back. Any error it returns
// means nothing was written, except one that says the outcome is unknown
// and a *ReplicationError, which comes with the read and plan of a write
// that committed on the master.
func (e *casEngine) attempt(ctx context.Context, t *casTxn) (_ *casRead, _ *casPlan, err error) {
	e.m.attempts.Add(1)
	node, err := e.node(ctx, t.route)
	if err != nil {
		return nil, nil, err
	}
	// The first read of a flush that took over a busy connection rides
	// behind the EXEC before it (ride.go); any other reads on its own.
	var conn *redis.Conn
	var read *casRead
	rr := e.readRound(t)
	res, offered := e.rideIn(ctx, node, rr)
	rode := offered && res.conn != nil
	if offered && !rode {
		rr = e.readRound(t) // the ride's pipeline failed: read afresh
	}
	if rode {
		e.m.rides.Add(1)
		conn = res.conn
		e.adopt(ctx, node, conn)
	} else {
		conn = e.get(ctx, node)
	}
	armed := true   // a WATCH may be active on conn
	sick := false   // a command on conn failed: it may not be kept
	handed := false // conn went to the next flush (a ride): not ours to touch
	defer func() {
		if handed {
			return
		}
		if armed && !e.unwatch(ctx, conn) {
			sick = true
		}
		e.put(ctx, node, conn, !sick)
	}()
	if rode {
		read, err = rr.parse(ctx, conn, res.cmds, res.err, res.sent, res.recv)
	} else {
		read, err = e.readOn(ctx, conn, rr)
	}
	if err != nil {
		sick = true
		return nil, nil, err
	}
	if t.follow != nil {
		if err := e.readAux(ctx, conn, read, t.follow(read)); err != nil {
			sick = true
			return nil, nil, err
		}
	}
	plan, err := t.decide(read)
	if err == nil && plan != nil && plan.confirm && plan.empty() && e.dur.on() {
		armed = false // confirm's round trip starts with UNWATCH
		healthy, err := e.confirm(ctx, conn, t.route)
		sick = !healthy
		return read, nil, err
	}
	if err != nil || plan.empty() {
		return read, nil, err // the deferred UNWATCH releases the watch
	}
	values, err := encodePlan(t.keys, read, plan)
	if err != nil {
		return read, nil, err
	}
	if err := e.checkLate(ctx, conn, lateChecks(t, plan)); err != nil {
		sick = true
		return read, nil, err
	}
	// go-redis would still send the EXEC on a done context; a caller who
	// gave up must not have the write land behind its back.
	if err := ctx.Err(); err != nil {
		return read, nil, err
	}
	var cmds []redis.Cmder
	var unconfirmed error
	carried := false // a successor's read went after the EXEC
	if e.dur.on() {
		cmds, unconfirmed, err = e.execWait(ctx, conn, t.route, plan, values)
	} else if r := e.rideOut(ctx, node); r != nil {
		// The hand-over may have taken a while: a flush whose callers
		// all gave up meanwhile sends nothing, and its successor reads on
		// its own.
		if err := ctx.Err(); err != nil {
			r.result <- rideResult{}
			return read, nil, err
		}
		carried = true
		cmds, handed, err = e.execRide(ctx, node, conn, t.route, plan, values, r)
	} else {
		cmds, err = e.exec(ctx, conn, plan, values)
	}
	armed, err = classify(t.route, cmds, err)
	if carried && !handed {
		// The read behind the EXEC was not answered in full: its WATCH may
		// be armed, and the connection out of step. It is not kept.
		armed, sick = true, true
	}
	if err != nil {
		var r *retry
		sick = sick || !errors.As(err, &r) && !errors.Is(err, ErrStep)
		return nil, nil, err
	}
	var re *ReplicationError
	if errors.As(unconfirmed, &re) && re.Err != nil && !isRedisErr(re.Err) {
		sick = true // WAIT's reply did not come: the connection may be out of step
	}
	plan.results = cmds
	return read, plan, unconfirmed
}

// readOn is round trip 1, rr, sent on its own on conn: WATCH, TIME, every
// job key, and TYPE of every declared key. One key is a GET. Several are
// one MGET and one EXISTS: MGET answers nil for a key of another type, so
// when EXISTS counts more keys than MGET returned values, one more round
// trip of GETs finds the culprit.
func (e *casEngine) readOn(ctx context.Context, conn *redis.Conn, rr *readRound) (*casRead, error) {
	e.m.roundTrips.Add(1)
	sent := e.clock.Local()
	cmds, err := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		rr.queue(ctx, p)
		return nil
	})
	return rr.parse(ctx, conn, cmds, err, sent, e.clock.Local())
}

// readRound is round trip 1 of one attempt: the commands it queues on a
// pipeline, and what to make of their replies. The pipeline is the
// attempt's own (read), or the one that carries the EXEC of the batch
// before it on the same connection (a ride).
type readRound struct {
	e      *casEngine
	t      *casTxn
	watch  []any
	get    *redis.StringCmd
	mget   *redis.SliceCmd
	exists *redis.IntCmd
	clock  *redis.TimeCmd
	after  func(*casRead) error
	types  []*redis.StatusCmd
	guards *redis.SliceCmd
	auxs   []*redis.StringCmd
}

func (e *casEngine) readRound(t *casTxn) *readRound {
	watch := make([]any, 0, 1+len(t.keys)+len(t.guards)+len(t.aux))
	watch = append(watch, "watch")
	for _, k := range t.keys {
		watch = append(watch, k)
	}
	for _, k := range t.guards {
		watch = append(watch, k)
	}
	for _, k := range t.aux {
		watch = append(watch, k)
	}
	return &readRound{e: e, t: t, watch: watch,
		types: make([]*redis.StatusCmd, 0, len(t.checks)),
		auxs:  make([]*redis.StringCmd, 0, len(t.aux))}
}

// queue appends the round's commands to p, WATCH first.
func (rr *readRound) queue(ctx context.Context, p redis.Pipeliner) {
	t := rr.t
	n := p.Len()
	p.Do(ctx, rr.watch...)
	rr.clock = p.Time(ctx)
	if len(t.keys) > 1 {
		rr.mget = p.MGet(ctx, t.keys...)
		rr.exists = p.Exists(ctx, t.keys...)
	} else if len(t.keys) == 1 {
		rr.get = p.Get(ctx, t.keys[0])
	}
	for _, c := range t.checks {
		rr.types = append(rr.types, p.Type(ctx, c.key))
	}
	if len(t.guards) > 0 {
		rr.guards = p.MGet(ctx, t.guards...)
	}
	for _, k := range t.aux {
		rr.auxs = append(rr.auxs, p.Get(ctx, k))
	}
	if t.extra != nil {
		rr.after = t.extra(ctx, p)
	}
	rr.e.m.commands.Add(int64(p.Len() - n))
}

// parse reads the round's replies: cmds are its own commands, err the
// pipeline's error for them, and sent and recv when the pipeline was sent
// and answered, by the local clock.
func (rr *readRound) parse(ctx context.Context, conn *redis.Conn, cmds []redis.Cmder, err error, sent, recv time.Time) (*casRead, error) {
	e, t := rr.e, rr.t
	if err := unanswered(cmds, err); err != nil {
		return nil, fmt.Errorf("jobkey: read %s: %w", t.route, err)
	}
	if err != nil && len(cmds) > 0 && cmds[0].Err() != nil {
		err := fmt.Errorf("jobkey: watch %s: %w", t.route, cmds[0].Err())
		if redirected(err) {
			return nil, &retry{err: err, moved: true}
		}
		return nil, err
	}
	server, err := rr.clock.Result()
	if err != nil {
		return nil, fmt.Errorf("jobkey: read Redis's clock: %w", err)
	}
	if err := verifyTypes(t.checks, rr.types); err != nil {
		return nil, err
	}
	var raws []rawRead
	if rr.mget != nil {
		if raws, err = e.multiRead(ctx, conn, t.keys, rr.mget, rr.exists); err != nil {
			return nil, err
		}
	} else if rr.get != nil {
		raws = []rawRead{fromGet(rr.get)}
	}
	r, err := decodeReads(t.keys, raws)
	if err != nil {
		return nil, err
	}
	r.now = e.clock.Observe(server, sent, recv)
	if rr.guards != nil {
		vals, err := rr.guards.Result()
		if err != nil {
			return nil, fmt.Errorf("jobkey: read %s: %w", t.guards[0], err)
		}
		for _, v := range vals {
			r.guarded = append(r.guarded, v != nil)
		}
	}
	if err := r.addAux(t.aux, rr.auxs); err != nil {
		return nil, err
	}
	if rr.after != nil {
		if err := rr.after(r); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// readAux watches and reads the auxiliary keys of keys that r has not
// read yet: one more round trip, on the connection that holds the WATCH of
// round trip 1, so the decision sees them under the same compare-and-set.
func (e *casEngine) readAux(ctx context.Context, conn *redis.Conn, r *casRead, keys []string) error {
	var todo []string
	for _, k := range keys {
		if _, ok := r.aux[k]; !ok && !slices.Contains(todo, k) {
			todo = append(todo, k)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	e.m.roundTrips.Add(1)
	e.m.commands.Add(int64(1 + len(todo)))
	watch := make([]any, 0, 1+len(todo))
	watch = append(watch, "watch")
	for _, k := range todo {
		watch = append(watch, k)
	}
	gets := make([]*redis.StringCmd, len(todo))
	cmds, err := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, watch...)
		for i, k := range todo {
			gets[i] = p.Get(ctx, k)
		}
		return nil
	})
	if err := unanswered(cmds, err); err != nil {
		return fmt.Errorf("jobkey: read %s: %w", todo[0], err)
	}
	if len(cmds) > 0 && cmds[0].Err() != nil {
		err := fmt.Errorf("jobkey: watch %s: %w", todo[0], cmds[0].Err())
		if redirected(err) {
			return &retry{err: err, moved: true}
		}
		return err
	}
	return r.addAux(todo, gets)
}

// addAux records the GETs of auxiliary keys in r.aux. A key of another
// type is recorded for the decision to report; any other error fails the
// read.
func (r *casRead) addAux(keys []string, gets []*redis.StringCmd) error {
	if r.aux == nil && len(keys) > 0 {
		r.aux = make(map[string]rawRead, len(keys))
	}
	for i, g := range gets {
		raw := fromGet(g)
		if raw.err != nil && !isWrongType(raw.err) {
			return fmt.Errorf("jobkey: get %s: %w", keys[i], raw.err)
		}
		r.aux[keys[i]] = raw
	}
	return nil
}

// checkLate types the keys a plan writes that were neither predicted nor
// verified by the caller: one more round trip, still under the WATCH.
func (e *casEngine) checkLate(ctx context.Context, conn *redis.Conn, late []typeCheck) error {
	if len(late) == 0 {
		return nil
	}
	e.m.roundTrips.Add(1)
	e.m.commands.Add(int64(len(late)))
	types := make([]*redis.StatusCmd, 0, len(late))
	cmds, err := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, c := range late {
			types = append(types, p.Type(ctx, c.key))
		}
		return nil
	})
	if err != nil && (!isRedisErr(err) || unanswered(cmds, err) != nil) {
		return fmt.Errorf("jobkey: type check: %w", err)
	}
	return verifyTypes(late, types)
}

// exec is round trip 2: MULTI, the whole values, the extra steps, EXEC.
func (e *casEngine) exec(ctx context.Context, conn *redis.Conn, plan *casPlan, values [][]byte) ([]redis.Cmder, error) {
	e.m.roundTrips.Add(1)
	e.m.commands.Add(int64(2 + len(plan.writes) + len(plan.aux) + len(plan.steps)))
	return conn.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i, w := range plan.writes {
			p.Set(ctx, w.key, values[i], w.ttl) // ttl 0: no expiry
		}
		for _, w := range plan.aux {
			if w.val == nil {
				p.Del(ctx, w.key)
			} else {
				p.Set(ctx, w.key, w.val, w.ttl) // ttl 0: no expiry
			}
		}
		for _, s := range plan.steps {
			p.Do(ctx, s...)
		}
		return nil
	})
}

// execPipe is exec in a plain pipeline, for a round trip that goes on
// after EXEC: tail queues the commands that follow it (WAIT, the next
// batch's round trip 1), since go-redis's transaction pipeline ends at
// EXEC. The steps' replies are handed back as a transaction pipeline's
// would be, one *redis.Cmd per step, with the error classify expects; all
// is every command the pipeline sent, tail's included.
func (e *casEngine) execPipe(ctx context.Context, conn *redis.Conn, route string, plan *casPlan, values [][]byte, tail func(redis.Pipeliner)) (results, all []redis.Cmder, _ error) {
	args := make([][]any, 0, len(plan.writes)+len(plan.aux)+len(plan.steps))
	for i, w := range plan.writes {
		args = append(args, setArgs(w.key, values[i], w.ttl))
	}
	for _, w := range plan.aux {
		if w.val == nil {
			args = append(args, []any{"del", w.key})
		} else {
			args = append(args, setArgs(w.key, w.val, w.ttl))
		}
	}
	args = append(args, plan.steps...)
	e.m.roundTrips.Add(1)
	e.m.commands.Add(int64(2 + len(args)))
	cmds := make([]*redis.Cmd, len(args))
	var exec *redis.Cmd
	all, perr := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "multi")
		for i, a := range args {
			cmds[i] = p.Do(ctx, a...)
		}
		exec = p.Do(ctx, "exec")
		if tail != nil {
			tail(p)
		}
		return nil
	})
	results = make([]redis.Cmder, len(args))
	for i, c := range cmds {
		results[i] = c
	}
	if err := unanswered(all, perr); err != nil {
		return results, all, err // nothing was sent, and nothing answered
	}
	xerr := exec.Err()
	switch {
	case xerr == nil:
	case errors.Is(xerr, redis.Nil):
		// EXEC found a watched key changed and wrote nothing.
		for _, c := range cmds {
			c.SetErr(redis.TxFailedErr)
		}
		return results, all, redis.TxFailedErr
	case isRedisErr(xerr):
		// EXECABORT: a step was refused as it was queued (a slot that
		// moved, a command the ACL denies); nothing was written. A step
		// keeps the error it was refused with; the others get EXEC's.
		for _, c := range cmds {
			if c.Err() == nil {
				c.SetErr(xerr)
			}
		}
		return results, all, xerr
	default:
		// No reply to EXEC: it may or may not have run.
		for _, c := range cmds {
			c.SetErr(xerr)
		}
		return results, all, xerr
	}
	replies, _ := exec.Val().([]any)
	if len(replies) != len(cmds) {
		return results, all, fmt.Errorf("jobkey: exec %s: %d replies to %d steps", route, len(replies), len(cmds))
	}
	var first error
	for i, v := range replies {
		if rerr, ok := v.(redis.Error); ok {
			cmds[i].SetErr(rerr)
			if first == nil {
				first = rerr
			}
			continue
		}
		cmds[i].SetErr(nil)
		cmds[i].SetVal(v)
	}
	if first != nil {
		return results, all, first // a StepError: some steps applied, some not
	}
	return results, all, nil
}

// classify turns what EXEC returned into the attempt's error, and says
// whether a WATCH may still be armed on the connection.
func classify(route string, cmds []redis.Cmder, err error) (armed bool, _ error) {
	switch {
	case err == nil:
		return false, nil
	case unanswered(cmds, err) != nil:
		return true, fmt.Errorf("%w: exec %s: %w", ErrOutcomeUnknown, route, err)
	case errors.Is(err, redis.TxFailedErr):
		return false, &retry{err: err} // EXEC ran, found a watched key changed, and cleared the watch
	case redis.IsExecAbortError(err):
		for _, c := range cmds {
			if redirected(c.Err()) {
				return false, &retry{err: c.Err(), moved: true} // queued while the slot was moving
			}
		}
		return false, stepError(cmds, true)
	case redirected(err):
		return true, &retry{err: err, moved: true}
	case isRedisErr(err):
		// EXEC ran and returned one result per step; some failed. Redis
		// applied the others and will not undo them.
		return false, stepError(cmds, false)
	}
	// A network or context error: EXEC may or may not have run. The
	// deferred UNWATCH is harmless if it did.
	return true, fmt.Errorf("%w: exec %s: %w", ErrOutcomeUnknown, route, err)
}

// verifyTypes refuses the transaction if any checked key holds a type other
// than the one wanted; a missing key is fine.
func verifyTypes(checks []typeCheck, types []*redis.StatusCmd) error {
	for i, c := range types {
		got, err := c.Result()
		if err != nil {
			return fmt.Errorf("jobkey: type %s: %w", checks[i].key, err)
		}
		if got != "none" && got != checks[i].want {
			return &WrongTypeError{Key: checks[i].key, Want: checks[i].want, Got: got}
		}
	}
	return nil
}

// lateChecks returns the plan's checks that the caller did not predict.
func lateChecks(t *casTxn, plan *casPlan) []typeCheck {
	var late []typeCheck
next:
	for _, c := range plan.checks {
		for _, p := range t.checks {
			if p.key == c.key && p.want == c.want {
				continue next
			}
		}
		late = append(late, c)
	}
	return late
}

// unanswered returns err when a pipeline failed without any command
// carrying an error. go-redis does that when it cannot set up the
// connection (a wrong password, a refused SELECT), and the commands' empty
// results must then not be read as answers.
func unanswered(cmds []redis.Cmder, err error) error {
	if err == nil {
		return nil
	}
	for _, c := range cmds {
		if c.Err() != nil {
			return nil
		}
	}
	return err
}

func isRedisErr(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}

func isWrongType(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE")
}

// rawRead is one job key as read: its bytes, or that it is missing, or the
// error reading it gave.
type rawRead struct {
	s       string
	missing bool
	err     error
}

func fromGet(g *redis.StringCmd) rawRead {
	s, err := g.Result()
	if errors.Is(err, redis.Nil) {
		return rawRead{missing: true}
	}
	return rawRead{s: s, err: err}
}

// multiRead turns an MGET and an EXISTS of the same keys into per-key reads.
func (e *casEngine) multiRead(ctx context.Context, conn *redis.Conn, keys []string, mget *redis.SliceCmd, exists *redis.IntCmd) ([]rawRead, error) {
	vals, err := mget.Result()
	if err != nil {
		return nil, fmt.Errorf("jobkey: mget %s: %w", keys[0], err)
	}
	n, err := exists.Result()
	if err != nil {
		return nil, fmt.Errorf("jobkey: exists %s: %w", keys[0], err)
	}
	out := make([]rawRead, len(keys))
	found := int64(0)
	for i, v := range vals {
		if s, ok := v.(string); ok {
			out[i].s = s
			found++
		} else {
			out[i].missing = true
		}
	}
	if found == n {
		return out, nil
	}
	// Some key exists without being a string: GET each, still under the
	// WATCH, to name it.
	e.m.roundTrips.Add(1)
	e.m.commands.Add(int64(len(keys)))
	gets := make([]*redis.StringCmd, len(keys))
	cmds, err := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			gets[i] = p.Get(ctx, k)
		}
		return nil
	})
	if err != nil && (unanswered(cmds, err) != nil || !errors.Is(err, redis.Nil) && !isRedisErr(err)) {
		return nil, fmt.Errorf("jobkey: get %s: %w", keys[0], err)
	}
	for i, g := range gets {
		out[i] = fromGet(g)
	}
	return out, nil
}

// decodeReads turns raw reads into jobs. A missing key is a nil job; a key
// of another type or a value that cannot be decoded is reported per key and
// left untouched. The jobs share one allocation, and each owns its reply's
// bytes (unmarshalReply): raws are not read again.
func decodeReads(keys []string, raws []rawRead) (*casRead, error) {
	// A batch's read and its per-key slices are one allocation.
	type readBuf struct {
		r    casRead
		jobs [8]*Job
		errs [8]error
	}
	buf := new(readBuf)
	r := &buf.r
	if len(keys) <= len(buf.jobs) {
		r.jobs, r.errs = buf.jobs[:len(keys):len(keys)], buf.errs[:len(keys):len(keys)]
	} else {
		r.jobs, r.errs = make([]*Job, len(keys)), make([]error, len(keys))
	}
	var slab []Job
	for i, raw := range raws {
		switch {
		case raw.missing:
			continue
		case isWrongType(raw.err):
			r.errs[i] = &WrongTypeError{Key: keys[i], Want: "string", Got: "non-string"}
			continue
		case raw.err != nil:
			return nil, fmt.Errorf("jobkey: get %s: %w", keys[i], raw.err)
		}
		if len(slab) == 0 {
			slab = make([]Job, len(raws)-i)
		}
		j := &slab[0]
		if err := unmarshalReply(raw.s, j); err != nil {
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
	return r, nil
}

// encodePlan bumps each written job's revision past the value it replaces
// and encodes it. Every write must target a watched key, or the compare in
// compare-and-set would not cover it. The values share one buffer, of
// their exact total size; each is capped, so nothing appends across.
func encodePlan(keys []string, read *casRead, plan *casPlan) ([][]byte, error) {
	for _, w := range plan.aux {
		if _, ok := read.aux[w.key]; !ok {
			return nil, fmt.Errorf("jobkey: internal error: write to unwatched key %q", w.key)
		}
	}
	total := 0
	for _, w := range plan.writes {
		idx := slices.Index(keys, w.key)
		if idx < 0 {
			return nil, fmt.Errorf("jobkey: internal error: write to unwatched key %q", w.key)
		}
		var prevRev uint64
		if prev := read.jobs[idx]; prev != nil {
			prevRev = prev.Rev // read first: decide may have edited prev in place
		}
		w.job.Rev = prevRev + 1
		n, err := marshalSize(w.job)
		if err != nil {
			return nil, err
		}
		total += n
	}
	values := make([][]byte, len(plan.writes))
	buf := make([]byte, 0, total)
	for i, w := range plan.writes {
		start := len(buf)
		buf = appendJob(buf, w.job)
		values[i] = buf[start:len(buf):len(buf)]
	}
	return values, nil
}

// unwatch releases a watch on a path that did not reach EXEC. It must run
// even when ctx is done, so it gets a short context of its own. It reports
// whether the connection answered: if not, it is broken and must not be
// kept.
func (e *casEngine) unwatch(ctx context.Context, conn *redis.Conn) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	e.m.unwatches.Add(1)
	e.m.roundTrips.Add(1)
	e.m.commands.Add(1)
	return conn.Do(ctx, "unwatch").Err() == nil
}

func stepError(cmds []redis.Cmder, aborted bool) *StepError {
	se := &StepError{Aborted: aborted}
	for _, c := range cmds {
		name := c.Name()
		if name == "multi" || name == "exec" {
			continue
		}
		args := c.Args()
		desc := name
		if len(args) > 1 {
			desc = fmt.Sprintf("%s %v", name, args[1])
		}
		se.Steps = append(se.Steps, StepResult{Cmd: desc, Err: c.Err()})
	}
	return se
}
