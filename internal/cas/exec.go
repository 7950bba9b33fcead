package cas

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/jobkey/jobkey/internal/resp"
	"github.com/redis/go-redis/v9"
)

// Round trip 2: the type checks nobody predicted (one more round trip,
// still under the WATCH, only when there are some), MULTI, the whole
// values, the extra steps, EXEC; then what EXEC's reply means, and the
// UNWATCH of every path that does not reach EXEC.

// checkLate types the keys a plan writes that were neither predicted nor
// verified by the caller: one more round trip, still under the WATCH.
func (e *Engine) checkLate(ctx context.Context, conn *redis.Conn, late []TypeCheck) error {
	if len(late) == 0 {
		return nil
	}
	e.c.roundTrips.Add(1)
	e.c.commands.Add(int64(len(late)))
	types := make([]*redis.StatusCmd, 0, len(late))
	cmds, err := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, c := range late {
			types = append(types, p.Type(ctx, c.Key))
		}
		return nil
	})
	if err != nil && (!reply.IsRedisErr(err) || reply.Unanswered(cmds, err) != nil) {
		return fmt.Errorf("jobkey: type check: %w", err)
	}
	return verifyTypes(late, types)
}

// lateChecks returns the plan's checks that the caller did not predict.
func lateChecks(t *Txn, plan *Plan) []TypeCheck {
	var late []TypeCheck
next:
	for _, c := range plan.Checks {
		for _, p := range t.Checks {
			if p == c {
				continue next
			}
		}
		late = append(late, c)
	}
	return late
}

// exec is MULTI, the whole values, the extra steps, EXEC, in one
// pipeline of the pipe's commands (execPipe).
func (e *Engine) exec(ctx context.Context, conn *redis.Conn, route string, plan *Plan) ([]Result, error) {
	results, _, _, err := e.execPipe(ctx, conn, route, plan, nil)
	return results, err
}

// writeArgs returns the SET (with PX when the write expires) or DEL of
// each of plan's writes. Their arguments share one array; a watched key
// takes the interface value round trip 1 boxed it in; a TTL is boxed once for the writes that share it. go-redis's
// Set would allocate an argument slice and box the key, the value and the
// TTL for each.
func writeArgs(plan *Plan) [][]any {
	writes := plan.Writes
	store := make([]any, 0, 5*len(writes))
	out := make([][]any, 0, len(writes))
	var ttl time.Duration
	var ms any
	next := 0 // where the key of the write before was, plus one
	for _, w := range writes {
		var key any // boxed only when not found: a declaration with w.Key boxes it at once
		// Writes mostly follow the keys' order: look from after the last
		// one found, once around.
		for k := range len(plan.boxed) {
			at := (next + k) % len(plan.boxed)
			if plan.keys[at] == w.Key {
				key, next = plan.boxed[at], at+1
				break
			}
		}
		if key == nil {
			key = w.Key
		}
		at := len(store)
		switch {
		case w.Del:
			store = append(store, "del", key)
		case w.TTL > 0:
			if ms == nil || w.TTL != ttl {
				ttl, ms = w.TTL, max(w.TTL.Milliseconds(), 1)
			}
			store = append(store, "set", key, w.Value, "px", ms)
		default:
			store = append(store, "set", key, w.Value) // no expiry
		}
		out = append(out, store[at:len(store):len(store)])
	}
	return out
}

// execPipe sends MULTI, plan's writes and steps, and EXEC, then what tail
// queues after them (WAIT, the next batch's round trip 1), in one plain
// pipeline: its own commands are a pipe's, built once (pipe.go), and
// their replies are read raw. It returns one Result per write and step,
// tail's commands, and whether every command of the pipeline got a reply
// (the connection is then in step). err is nil when EXEC committed every step;
// redis.TxFailedErr when a watched key changed; an EXECABORT when a
// command was refused as it was queued (nothing was written); the first
// step's error when EXEC ran and some step failed (the others applied);
// any other error when EXEC's reply did not come: it may or may not have
// run.
func (e *Engine) execPipe(ctx context.Context, conn *redis.Conn, route string, plan *Plan, tail func(redis.Pipeliner)) (results []Result, tailCmds []redis.Cmder, whole bool, _ error) {
	p := getPipe()
	defer p.put()
	n := len(plan.Writes) + len(plan.Steps)
	e.c.roundTrips.Add(1)
	e.c.commands.Add(int64(2 + n))
	p.cmd(multiArgs)
	for _, a := range writeArgs(plan) {
		p.cmd(a)
	}
	for _, s := range plan.Steps {
		p.cmd(s)
	}
	p.cmd(execArgs)
	own := len(p.batch)
	all, perr := conn.Pipelined(ctx, func(pl redis.Pipeliner) error {
		if err := pl.BatchProcess(ctx, p.batch...); err != nil {
			return err
		}
		if tail != nil {
			tail(pl)
		}
		return nil
	})
	results = make([]Result, n)
	for i, w := range plan.Writes {
		results[i] = Result{Name: "set", Key: w.Key}
		if w.Del {
			results[i].Name = "del"
		}
	}
	for i, s := range plan.Steps {
		results[len(plan.Writes)+i] = Result{Args: s}
	}
	if err := reply.Unanswered(all, perr); err != nil {
		// Nothing was answered, maybe nothing sent: go-redis does not mark
		// the commands with an error of Redis's own that refused the
		// connection's set-up, which must not read as EXEC's answer.
		return results, nil, false, &unanswered{err: err}
	}
	whole = answered(all)
	if len(all) > own {
		tailCmds = all[own:]
	}
	var raws [][]byte
	if n+2 <= 16 {
		raws = make([][]byte, 0, 16) // on the stack
	}
	raws, ok := p.replies(raws)
	if !ok {
		// No whole reply to EXEC: it may or may not have run.
		err := cmp.Or(firstErr(p.batch), perr, errNoReply)
		for i := range results {
			results[i].Err = err
		}
		return results, tailCmds, whole, err
	}
	// MULTI's reply, then one per queued command: a command refused as it
	// was queued keeps its refusal, and EXEC answers EXECABORT.
	for i := range results {
		results[i].Err = replyErr(raws[1+i])
	}
	if xerr := replyErr(raws[0]); xerr != nil {
		// MULTI refused: Redis ran each command as it came, outside any
		// transaction, and those replies are the commands' own; when every
		// one is an error (LOADING), nothing was written.
		none := true
		for i := range results {
			none = none && results[i].Err != nil
		}
		return results, tailCmds, whole, &multiRefused{err: fmt.Errorf("jobkey: multi %s: %w", route, xerr), none: none}
	}
	return results, tailCmds, whole, execReply(route, raws[n+1], results)
}

// unanswered is a pipeline error that came before any reply.
type unanswered struct{ err error }

func (u *unanswered) Error() string { return u.err.Error() }
func (u *unanswered) Unwrap() error { return u.err }

// multiRefused is a MULTI that Redis refused: none says every command was
// refused too, so nothing was written.
type multiRefused struct {
	err  error
	none bool
}

func (m *multiRefused) Error() string { return m.err.Error() }
func (m *multiRefused) Unwrap() error { return m.err }

var (
	multiArgs  = []any{"multi"}
	execArgs   = []any{"exec"}
	errNoReply = errors.New("jobkey: no reply")
)

// execReply reads EXEC's raw reply into results: nil when every step
// applied.
func execReply(route string, raw []byte, results []Result) error {
	if xerr := replyErr(raw); xerr != nil {
		// EXECABORT: a command was refused as it was queued (a hash slot
		// that moved, a command the ACL denies); nothing was written. A
		// command keeps the error it was refused with; the others get
		// EXEC's.
		for i := range results {
			if results[i].Err == nil {
				results[i].Err = xerr
			}
		}
		return xerr
	}
	count, null, rest, err := resp.Header(raw)
	switch {
	case err != nil:
		err = fmt.Errorf("jobkey: exec %s: %w", route, err)
	case null:
		// EXEC found a watched key changed and wrote nothing.
		err = redis.TxFailedErr
	case count != len(results):
		err = fmt.Errorf("jobkey: exec %s: %d replies to %d commands", route, count, len(results))
	}
	if err != nil {
		for i := range results {
			results[i].Err = err
		}
		return err
	}
	var first error
	for i := range results {
		var v any
		if v, rest, err = resp.Next(rest); err != nil {
			err = fmt.Errorf("jobkey: exec %s: %w", route, err)
			for j := i; j < len(results); j++ {
				results[j].Err = err
			}
			return cmp.Or(first, err)
		}
		if rerr, ok := v.(resp.Error); ok {
			results[i].Err = rerr
			first = cmp.Or(first, error(rerr))
			continue
		}
		results[i].Val = v
	}
	return first // a Redis error: some steps applied, some not
}

// replyErr returns the error reply raw holds, if it is one.
func replyErr(raw []byte) error {
	if len(raw) == 0 || raw[0] != '-' && raw[0] != '!' {
		return nil
	}
	v, _, err := resp.Next(raw)
	if err != nil {
		return err
	}
	rerr, _ := v.(resp.Error)
	return rerr
}

// firstErr returns the first error among cmds.
func firstErr(cmds []redis.Cmder) error {
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}

// Result is what EXEC answered for one of a plan's commands: its writes'
// SET or DEL first, then its steps, in order.
type Result struct {
	Name string // a write's command, "set" or "del"
	Key  string // a write's key
	Args []any  // a step, as sent
	Val  any    // the reply, as resp.Next reads it (int64 for an integer)
	Err  error  // the error Redis replied with, or why no reply came
}

// Cmd returns the command's name.
func (r *Result) Cmd() string {
	if r.Args == nil {
		return r.Name
	}
	if len(r.Args) > 0 {
		if s, ok := r.Args[0].(string); ok {
			return strings.ToLower(s)
		}
	}
	return ""
}

// desc names the command and its key, e.g. "zadd jobkey:{q/0}:ready".
func (r *Result) desc() string {
	if r.Args == nil {
		return r.Name + " " + r.Key
	}
	if len(r.Args) > 1 {
		return fmt.Sprintf("%s %v", r.Cmd(), r.Args[1])
	}
	return r.Cmd()
}

// classify turns what EXEC returned into the attempt's error, and says
// whether a WATCH may still be armed on the connection.
func classify(route string, results []Result, err error) (armed bool, _ error) {
	var un *unanswered
	var mr *multiRefused
	switch {
	case err == nil:
		return false, nil
	case errors.As(err, &un):
		return true, fmt.Errorf("%w: exec %s: %w", ErrOutcomeUnknown, route, un.err)
	case errors.As(err, &mr):
		// No EXEC ran (EXEC without MULTI): the WATCH is still armed.
		return true, stepError(results, mr.none)
	case errors.Is(err, redis.TxFailedErr):
		return false, &retry{err: err} // EXEC ran, found a watched key changed, and cleared the watch
	case redis.IsExecAbortError(err):
		for _, r := range results {
			if reply.Redirected(r.Err) {
				return false, &retry{err: r.Err, moved: true} // queued while the hash slot was moving
			}
		}
		return false, stepError(results, true)
	case reply.Redirected(err):
		return true, &retry{err: err, moved: true}
	case reply.IsRedisErr(err):
		// EXEC ran and returned one result per step; some failed. Redis
		// applied the others and will not undo them.
		return false, stepError(results, false)
	}
	// A network or context error: EXEC may or may not have run. The deferred UNWATCH is harmless if it did.
	return true, fmt.Errorf("%w: exec %s: %w", ErrOutcomeUnknown, route, err)
}

func stepError(results []Result, aborted bool) *StepError {
	se := &StepError{Aborted: aborted, Steps: make([]StepResult, 0, len(results))}
	for i := range results {
		se.Steps = append(se.Steps, StepResult{Cmd: results[i].desc(), Err: results[i].Err})
	}
	return se
}

// unwatch releases a watch on a path that did not reach EXEC. It must run
// even when ctx is done, so it gets a short context of its own. It reports
// whether the connection answered: if not, it is broken and must not be
// kept.
func (e *Engine) unwatch(ctx context.Context, conn *redis.Conn) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	e.c.unwatches.Add(1)
	e.c.roundTrips.Add(1)
	e.c.commands.Add(1)
	return conn.Do(ctx, "unwatch").Err() == nil
}
