package cas

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unsafe"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/jobkey/jobkey/internal/resp"
	"github.com/redis/go-redis/v9"
)

// Round trip 1: WATCH, TIME, the watched keys, the TYPE of every declared
// key, the guards and the auxiliary keys, in one pipeline. It is sent on
// the attempt's own connection (readOn), or carried behind the EXEC of
// the batch before it on the same connection (handover.go).

// readOn sends rr on its own on conn. One key is a GET. Several are one
// MGET and one EXISTS: MGET answers nil for a key of another type, so when
// EXISTS counts more keys than MGET returned values, one more round trip
// of GETs finds the culprit.
func (e *Engine) readOn(ctx context.Context, conn *redis.Conn, rr *readRound) (*Read, error) {
	e.c.roundTrips.Add(1)
	sent := e.opts.Clock.Local()
	cmds, err := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		rr.queue(ctx, p)
		return nil
	})
	return rr.parse(ctx, conn, cmds, err, sent, e.opts.Clock.Local())
}

// readRound is round trip 1 of one attempt: the commands it queues on a
// pipeline, and what to make of their replies.
type readRound struct {
	e      *Engine
	t      *Txn
	watch  []any
	get    *redis.StringCmd
	mget   *redis.RawWriteToCmd
	raw    *sink // mget's reply
	exists *redis.Cmd
	clock  *redis.TimeCmd
	after  func(*Read) error
	types  []*redis.StatusCmd
	guards *redis.SliceCmd
	auxs   []*redis.StringCmd
}

func (e *Engine) readRound(t *Txn) *readRound {
	watch := make([]any, 0, 1+len(t.Keys)+len(t.Guards)+len(t.Aux)+len(t.Watch))
	watch = append(watch, "watch")
	for _, k := range t.Keys {
		watch = append(watch, k)
	}
	for _, k := range t.Guards {
		watch = append(watch, k)
	}
	for _, k := range t.Aux {
		watch = append(watch, k)
	}
	for _, k := range t.Watch {
		watch = append(watch, k)
	}
	return &readRound{e: e, t: t, watch: watch,
		types: make([]*redis.StatusCmd, 0, len(t.Checks)),
		auxs:  make([]*redis.StringCmd, 0, len(t.Aux))}
}

// queue appends the round's commands to p, WATCH first.
func (rr *readRound) queue(ctx context.Context, p redis.Pipeliner) {
	t := rr.t
	n := p.Len()
	p.Do(ctx, rr.watch...)
	rr.clock = p.Time(ctx)
	if len(t.Keys) > 1 {
		// The keys boxed once, for WATCH: MGET and EXISTS take the same
		// interface values (go-redis's MGet and Exists would box each key
		// again, an allocation per key per command). MGET's reply is read
		// raw (multiRead).
		keys := rr.watch[1 : 1+len(t.Keys)]
		args := make([]any, 2*(1+len(keys)))
		mget, exists := args[:1+len(keys)], args[1+len(keys):]
		mget[0], exists[0] = "mget", "exists"
		copy(mget[1:], keys)
		copy(exists[1:], keys)
		rr.raw = &sink{b: make([]byte, 0, 16+8*len(keys)), values: len(keys)} // room for the header and nulls
		rr.mget = redis.NewRawWriteToCmd(ctx, rr.raw, mget...)
		_ = p.Process(ctx, rr.mget)
		rr.exists = p.Do(ctx, exists...)
	} else if len(t.Keys) == 1 {
		rr.get = p.Get(ctx, t.Keys[0])
	}
	for _, c := range t.Checks {
		rr.types = append(rr.types, p.Type(ctx, c.Key))
	}
	if len(t.Guards) > 0 {
		rr.guards = p.MGet(ctx, t.Guards...)
	}
	for _, k := range t.Aux {
		rr.auxs = append(rr.auxs, p.Get(ctx, k))
	}
	if t.Extra != nil {
		rr.after = t.Extra(ctx, p)
	}
	rr.e.c.commands.Add(int64(p.Len() - n))
}

// parse reads the round's replies: cmds are its own commands, err the
// pipeline's error for them, and sent and recv when the pipeline was sent
// and answered, by the local clock.
func (rr *readRound) parse(ctx context.Context, conn *redis.Conn, cmds []redis.Cmder, err error, sent, recv time.Time) (*Read, error) {
	e, t := rr.e, rr.t
	if err := reply.Unanswered(cmds, err); err != nil {
		return nil, fmt.Errorf("jobkey: read %s: %w", t.Route, err)
	}
	if err != nil && len(cmds) > 0 && cmds[0].Err() != nil {
		err := fmt.Errorf("jobkey: watch %s: %w", t.Route, cmds[0].Err())
		if reply.Redirected(err) {
			return nil, &retry{err: err, moved: true}
		}
		return nil, err
	}
	server, err := rr.clock.Result()
	if err != nil {
		return nil, fmt.Errorf("jobkey: read Redis's clock: %w", err)
	}
	if err := verifyTypes(t.Checks, rr.types); err != nil {
		return nil, err
	}
	r := &Read{}
	if rr.mget != nil {
		if r.Values, err = e.multiRead(ctx, conn, t.Keys, rr.mget, rr.raw, rr.exists); err != nil {
			return nil, err
		}
	} else if rr.get != nil {
		r.Values = []reply.Raw{reply.FromGet(rr.get)}
	}
	for i, v := range r.Values {
		if v.Err != nil && !reply.IsWrongType(v.Err) {
			return nil, fmt.Errorf("jobkey: get %s: %w", t.Keys[i], v.Err)
		}
	}
	r.Now = e.opts.Clock.Observe(server, sent, recv)
	if rr.guards != nil {
		vals, err := rr.guards.Result()
		if err == nil && len(vals) != len(t.Guards) {
			// The decision reads a guard by its index: a short reply must
			// not pass for one with the last guards unset.
			err = fmt.Errorf("%d values for %d keys", len(vals), len(t.Guards))
		}
		if err != nil {
			return nil, fmt.Errorf("jobkey: read %s: %w", t.Guards[0], err)
		}
		r.Guarded = make([]bool, len(vals))
		for i, v := range vals {
			r.Guarded[i] = v != nil
		}
	}
	if err := r.addAux(t.Aux, rr.auxs); err != nil {
		return nil, err
	}
	if rr.after != nil {
		if err := rr.after(r); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// multiRead turns an MGET and an EXISTS of the same keys into per-key reads.
func (e *Engine) multiRead(ctx context.Context, conn *redis.Conn, keys []string, mget *redis.RawWriteToCmd, raw *sink, exists *redis.Cmd) ([]reply.Raw, error) {
	out, err := e.mgetValues(mget, raw, len(keys))
	if err != nil {
		return nil, fmt.Errorf("jobkey: mget %s: %w", keys[0], err)
	}
	n, err := exists.Int64()
	if err != nil {
		return nil, fmt.Errorf("jobkey: exists %s: %w", keys[0], err)
	}
	found := int64(0)
	for i := range out {
		if !out[i].Missing {
			found++
		}
	}
	if found == n {
		return out, nil
	}
	// Some key exists without being a string: GET each, still under the
	// WATCH, to name it.
	e.c.roundTrips.Add(1)
	e.c.commands.Add(int64(len(keys)))
	gets := make([]*redis.StringCmd, len(keys))
	cmds, err := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			gets[i] = p.Get(ctx, k)
		}
		return nil
	})
	if err != nil && (reply.Unanswered(cmds, err) != nil || !errors.Is(err, redis.Nil) && !reply.IsRedisErr(err)) {
		return nil, fmt.Errorf("jobkey: get %s: %w", keys[0], err)
	}
	for i, g := range gets {
		out[i] = reply.FromGet(g)
	}
	return out, nil
}

// mgetValues reads MGET's raw reply, written to sink, as n values. Each
// value's string shares the sink's buffer, made for this reply alone (its
// size taken from the reply's first value, sink.ReadFrom) and never
// written again: about one allocation for the batch's values, where
// go-redis's reader makes a string and a boxed value for each. A job decoded from it keeps the
// buffer alive while it lives (the batch's other values with it), the
// price of that one allocation.
func (e *Engine) mgetValues(mget *redis.RawWriteToCmd, sink *sink, n int) ([]reply.Raw, error) {
	written, err := mget.Result()
	if err == nil && written != int64(len(sink.b)) {
		err = fmt.Errorf("%d bytes of reply, %d read", len(sink.b), written)
	}
	raw := sink.b
	if err == nil {
		err = replyErr(raw) // MOVED, NOPERM: Redis's own error, as go-redis would give it
	}
	if err != nil {
		return nil, err
	}
	count, null, rest, err := resp.Header(raw)
	switch {
	case err != nil:
		return nil, err
	case null || count != n:
		return nil, fmt.Errorf("%d values for %d keys", count, n)
	}
	out := make([]reply.Raw, n)
	for i := range out {
		s, null, other, after, err := resp.NextBulk(rest)
		switch {
		case err != nil:
			return nil, err
		case other != nil:
			return nil, fmt.Errorf("value %d: a reply of type %T", i, other)
		case null:
			out[i].Missing = true // MGET answers nil for a missing key and for one of another type
		case len(s) > 0:
			out[i].S = unsafe.String(&s[0], len(s))
		}
		rest = after
	}
	return out, nil
}

// readAux watches and reads the auxiliary keys of keys that r has not
// read yet: one more round trip, on the connection that holds the WATCH of
// round trip 1, so the decision sees them under the same compare-and-set.
func (e *Engine) readAux(ctx context.Context, conn *redis.Conn, r *Read, keys []string) error {
	var todo []string
	for _, k := range keys {
		if _, ok := r.Aux[k]; !ok && !slices.Contains(todo, k) {
			todo = append(todo, k)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	e.c.roundTrips.Add(1)
	e.c.commands.Add(int64(1 + len(todo)))
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
	if err := reply.Unanswered(cmds, err); err != nil {
		return fmt.Errorf("jobkey: read %s: %w", todo[0], err)
	}
	if len(cmds) > 0 && cmds[0].Err() != nil {
		err := fmt.Errorf("jobkey: watch %s: %w", todo[0], cmds[0].Err())
		if reply.Redirected(err) {
			return &retry{err: err, moved: true}
		}
		return err
	}
	return r.addAux(todo, gets)
}

// addAux records the GETs of auxiliary keys in r.Aux. A key of another
// type is recorded for the decision to report; any other error fails the
// read.
func (r *Read) addAux(keys []string, gets []*redis.StringCmd) error {
	if r.Aux == nil && len(keys) > 0 {
		r.Aux = make(map[string]reply.Raw, len(keys))
	}
	for i, g := range gets {
		raw := reply.FromGet(g)
		if raw.Err != nil && !reply.IsWrongType(raw.Err) {
			return fmt.Errorf("jobkey: get %s: %w", keys[i], raw.Err)
		}
		r.Aux[keys[i]] = raw
	}
	return nil
}

// verifyTypes refuses the transaction if any checked key holds a type other
// than the one wanted; a missing key is fine.
func verifyTypes(checks []TypeCheck, types []*redis.StatusCmd) error {
	for i, c := range types {
		got, err := c.Result()
		if err != nil {
			return fmt.Errorf("jobkey: type %s: %w", checks[i].Key, err)
		}
		if got != "none" && got != checks[i].Want {
			return &WrongTypeError{Key: checks[i].Key, Want: checks[i].Want, Got: got}
		}
	}
	return nil
}
