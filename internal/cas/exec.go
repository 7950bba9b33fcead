package cas

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobkey/jobkey/internal/reply"
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

// exec is MULTI, the whole values, the extra steps, EXEC, in go-redis's
// transaction pipeline.
func (e *Engine) exec(ctx context.Context, conn *redis.Conn, plan *Plan) ([]redis.Cmder, error) {
	e.c.roundTrips.Add(1)
	e.c.commands.Add(int64(2 + len(plan.Writes) + len(plan.Steps)))
	args := writeArgs(plan)
	cmds := make([]redis.Cmder, 0, len(args)+len(plan.Steps))
	for _, a := range args {
		cmds = append(cmds, redis.NewCmd(ctx, a...))
	}
	for _, s := range plan.Steps {
		cmds = append(cmds, redis.NewCmd(ctx, s...))
	}
	return conn.TxPipelined(ctx, func(p redis.Pipeliner) error {
		// At once: the pipeline's slice grows once, not at every command.
		return p.BatchProcess(ctx, cmds...)
	})
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

// execPipe is exec in a plain pipeline, for a round trip that goes on
// after EXEC: tail queues the commands that follow it (WAIT, the next
// batch's round trip 1), since go-redis's transaction pipeline ends at
// EXEC. The steps' replies are handed back as a transaction pipeline's
// would be, one *redis.Cmd per step, with the error classify expects; all
// is every command the pipeline sent, tail's included.
func (e *Engine) execPipe(ctx context.Context, conn *redis.Conn, route string, plan *Plan, tail func(redis.Pipeliner)) (results, all []redis.Cmder, _ error) {
	args := append(writeArgs(plan), plan.Steps...)
	e.c.roundTrips.Add(1)
	e.c.commands.Add(int64(2 + len(args)))
	cmds := make([]*redis.Cmd, len(args))
	batch := make([]redis.Cmder, 0, len(args)+2)
	batch = append(batch, redis.NewCmd(ctx, "multi"))
	for i, a := range args {
		cmds[i] = redis.NewCmd(ctx, a...)
		batch = append(batch, cmds[i])
	}
	exec := redis.NewCmd(ctx, "exec")
	batch = append(batch, exec)
	all, perr := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		if err := p.BatchProcess(ctx, batch...); err != nil {
			return err
		}
		if tail != nil {
			tail(p)
		}
		return nil
	})
	results = make([]redis.Cmder, len(args))
	for i, c := range cmds {
		results[i] = c
	}
	if err := reply.Unanswered(all, perr); err != nil {
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
	case reply.IsRedisErr(xerr):
		// EXECABORT: a step was refused as it was queued (a hash slot that
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
	case reply.Unanswered(cmds, err) != nil:
		return true, fmt.Errorf("%w: exec %s: %w", ErrOutcomeUnknown, route, err)
	case errors.Is(err, redis.TxFailedErr):
		return false, &retry{err: err} // EXEC ran, found a watched key changed, and cleared the watch
	case redis.IsExecAbortError(err):
		for _, c := range cmds {
			if reply.Redirected(c.Err()) {
				return false, &retry{err: c.Err(), moved: true} // queued while the hash slot was moving
			}
		}
		return false, stepError(cmds, true)
	case reply.Redirected(err):
		return true, &retry{err: err, moved: true}
	case reply.IsRedisErr(err):
		// EXEC ran and returned one result per step; some failed. Redis
		// applied the others and will not undo them.
		return false, stepError(cmds, false)
	}
	// A network or context error: EXEC may or may not have run. The
	// deferred UNWATCH is harmless if it did.
	return true, fmt.Errorf("%w: exec %s: %w", ErrOutcomeUnknown, route, err)
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
