package jobkey

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/jobkey/jobkey/internal/streamsnap"
	"github.com/redis/go-redis/v9"
)

// The event stream, read side: Events reads a page of every shard's
// stream from a cursor, FollowEvents blocks for more. See events.go for
// what writes them, and docs/design.md ("The event stream") for what a
// reader is promised.

// EventKind says what an Event reports.
type EventKind uint8

// The kinds of Event.
const (
	// EventTransition is a job's transition, written in its EXEC.
	EventTransition EventKind = 1
	// EventEnabled and EventDisabled are the entries EnableEvents and
	// DisableEvents append: between a Disabled and the next Enabled, the
	// shard's transitions have no events.
	EventEnabled  EventKind = 2
	EventDisabled EventKind = 3
	// EventGap says entries of the shard after the cursor were gone before
	// the reader got to them: trimmed to Config.EventsMaxLen, or deleted
	// outside jobkey. The reader goes on after them.
	EventGap EventKind = 4
	// EventRewound says the shard's stream lost entries the reader had
	// already read: a failover to a replica that had not received them
	// (their job writes are lost with them), or the stream was deleted.
	// The shard is read again from the start of its stream, so no entry
	// written since is skipped; entries read before may come again.
	EventRewound EventKind = 5
	// EventMalformed is an entry jobkey did not write as it writes them
	// (a forged one, say): Problem says what is wrong, Fields holds it as
	// read, and the fields that could be read are set.
	EventMalformed EventKind = 6
)

// String returns the kind's lower-case name.
func (k EventKind) String() string {
	switch k {
	case EventTransition:
		return "transition"
	case EventEnabled:
		return "enabled"
	case EventDisabled:
		return "disabled"
	case EventGap:
		return "gap"
	case EventRewound:
		return "rewound"
	case EventMalformed:
		return "malformed"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Event is one entry of a shard's event stream, or a gap or rewind a
// reader found in it.
type Event struct {
	Kind  EventKind
	Shard int
	// ID is the stream entry's ID, "<unix ms>-<seq>", ordered within the
	// shard; "" for a gap or a rewind.
	ID      string
	Job     string    // the job's ID
	Type    string    // the job's type
	From    State     // 0: the job did not exist (an enqueue)
	To      State     // 0: the job was deleted
	Attempt int       // the job's Attempt after the transition
	At      time.Time // the transaction's time, by Redis's clock
	// Worker is the worker of the run the transition starts (To is
	// StateActive), else of the run it ends (From is StateActive).
	Worker  string
	Problem string            // EventMalformed: what is wrong
	Fields  map[string]string // EventMalformed: the entry as read
}

// EventPage is what one Events call read.
type EventPage struct {
	// Events holds each shard's events in the shard's order, the shards'
	// interleaved by the time of their stream IDs.
	Events []Event
	// Cursor is where the next read starts: after every event of Events.
	Cursor string
}

// Bounds of Events' limit.
const (
	defaultEventsLimit = 100
	maxEventsLimit     = 10000
)

// Events reads up to limit events (default 100; at most 10000) of every
// shard after cursor, and returns them with the cursor after them. The
// empty cursor starts at the beginning of every shard's stream;
// EventsCursorNow gives one at their end. A cursor is opaque, resumable
// by any process (a reader that restarts passes the last one it kept),
// and valid for the queue's shard count.
//
// It costs one round trip: each shard's XINFO STREAM and XRANGE in a
// MULTI of their own, so what the first says of the second holds (on a
// cluster a MULTI stays in one hash slot: one round trip per shard, the
// shards at once).
// Entries trimmed or deleted before the reader got to them are reported
// as an EventGap, and a stream that lost entries the reader had read (a
// failover) as an EventRewound, never skipped in silence. Shards that
// could not be read are named in a *ShardsError that comes with the page
// of the others; their part of the cursor stays where it was.
func (q *Queue) Events(ctx context.Context, cursor string, limit int) (*EventPage, error) {
	cur, err := q.parseEventsCursor(cursor)
	if err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = defaultEventsLimit
	}
	if limit > maxEventsLimit {
		return nil, fmt.Errorf("%w: Events limit %d, at most %d", ErrInvalid, limit, maxEventsLimit)
	}
	if err := q.check(ctx, false); err != nil {
		return nil, err
	}
	ranges := make([]streamsnap.Range, q.ks.shards)
	for s := range ranges {
		ranges[s] = streamsnap.Range{Key: q.ks.streamKey(s), Start: cur[s].String()}
		if cur[s].isZero() {
			ranges[s].Start = "-"
		}
	}
	// A MULTI stays in one hash slot: on a cluster, one per shard.
	snaps := streamsnap.Read(ctx, q.rdb, !q.cluster(), ranges, int64(limit+1))
	failed := &ShardsError{Of: q.ks.shards}
	type item struct {
		ev  Event
		key streamID
	}
	var all []item
	next := slices.Clone(cur)
	type shardRead struct {
		events []item
		after  []streamID // the shard's cursor after each of events
	}
	reads := make([]shardRead, q.ks.shards)
	for s := range q.ks.shards {
		missing := false
		info, err := snaps[s].Info, snaps[s].InfoErr
		if err != nil && isNoSuchKey(err) {
			missing, err = true, nil
		}
		msgs := snaps[s].Msgs
		if err == nil {
			err = snaps[s].Err
		}
		if err != nil {
			if reply.IsWrongType(err) {
				err = &WrongTypeError{Key: q.ks.streamKey(s), Want: "stream", Got: "non-stream"}
			}
			failed.add(s, fmt.Errorf("jobkey: read %s: %w", q.ks.streamKey(s), err))
			continue
		}
		r := &reads[s]
		c := cur[s]
		switch classifyCursor(c, missing, info, msgs) {
		case cursorRewound:
			r.events = append(r.events, item{Event{Kind: EventRewound, Shard: s}, c})
			r.after = append(r.after, streamID{})
			continue
		case cursorRead:
			msgs = msgs[1:] // the cursor's own entry, read already
		case cursorGap:
			// It sorts with the event after it, and goes with it (below).
			if len(msgs) > 0 {
				r.events = append(r.events, item{Event{Kind: EventGap, Shard: s}, mustStreamID(msgs[0].ID)})
				r.after = append(r.after, c)
			}
		}
		// Entries deleted after the cursor (XDEL) leave the cursor's own
		// entry, so the stream says it only by its greatest deleted ID:
		// the gap goes before the first entry after that.
		var del streamID
		if info != nil {
			del, _ = parseStreamID(info.MaxDeletedEntryID)
		}
		delGap := !c.isZero() && c.less(del)
		prev := c
		for i, m := range msgs {
			id, ok := parseStreamID(m.ID)
			if !ok {
				continue // Redis makes every ID it returns
			}
			if delGap && del.less(id) {
				delGap = false
				if i > 0 || len(r.events) == 0 { // else the gap above says it
					r.events = append(r.events, item{Event{Kind: EventGap, Shard: s}, id})
					r.after = append(r.after, prev)
				}
			}
			r.events = append(r.events, item{parseEvent(s, m), id})
			r.after = append(r.after, id)
			prev = id
		}
	}
	for s := range reads {
		all = append(all, reads[s].events...)
	}
	// Each shard's events are in order already; a stable sort by stream ID
	// interleaves the shards without reordering any one.
	slices.SortStableFunc(all, func(a, b item) int { return a.key.compare(b.key) })
	if len(all) > limit {
		// A gap is reported with the event after it, so that the cursor
		// moves past both: the next read, from that event, finds no gap.
		n := limit
		if all[n-1].ev.Kind == EventGap {
			n++
		}
		all = all[:n]
	}
	taken := make([]int, q.ks.shards)
	page := &EventPage{Events: make([]Event, 0, len(all))}
	for _, it := range all {
		page.Events = append(page.Events, it.ev)
		s := it.ev.Shard
		next[s] = reads[s].after[taken[s]]
		taken[s]++
	}
	page.Cursor = q.formatEventsCursor(next)
	return page, failed.orNil()
}

// What a shard's stream says of a reader's cursor.
const (
	cursorStart   = iota // the zero cursor: the stream is read from its start
	cursorRead           // the cursor's own entry is there, first of msgs
	cursorGap            // the cursor's entry was trimmed or deleted: entries after it may have been too
	cursorRewound        // the stream lost entries up to the cursor
)

// classifyCursor says how a shard's stream, as XINFO STREAM (info, or
// missing) and an XRANGE from the cursor c inclusive (msgs) read it in one
// MULTI, stands to c. A cursor whose entry is gone is a gap when the
// entry was trimmed (it is before the stream's first recorded entry) or
// deleted (max-deleted-entry-id is at or past it); else the entry
// vanished, as in a failover to a replica that never received it, whose
// new entries may already go past c: the stream rewound. A gap is
// reported even when no entry after the cursor was lost (a reader that
// read exactly up to the trim): Redis does not say which entries a trim
// removed, only that it did.
func classifyCursor(c streamID, missing bool, info *redis.XInfoStream, msgs []redis.XMessage) int {
	switch {
	case c.isZero():
		return cursorStart
	case missing:
		return cursorRewound
	case len(msgs) > 0 && msgs[0].ID == c.String():
		return cursorRead
	}
	if last, ok := parseStreamID(info.LastGeneratedID); ok && last.less(c) {
		return cursorRewound
	}
	first, ok := parseStreamID(info.RecordedFirstEntryID) // Redis 7.0 on
	if !ok {
		first, ok = parseStreamID(info.FirstEntry.ID)
	}
	if ok && c.less(first) {
		if info.EntriesAdded > 0 && info.EntriesAdded == info.Length {
			// Nothing was ever trimmed or deleted from this stream: it is
			// a new one, which never held the cursor's entry.
			return cursorRewound
		}
		return cursorGap
	}
	if del, ok := parseStreamID(info.MaxDeletedEntryID); ok && !del.less(c) {
		return cursorGap
	}
	return cursorRewound
}

// EventsCursorNow returns a cursor at the end of every shard's stream:
// Events and FollowEvents from it see only what comes after. One round
// trip per node.
func (q *Queue) EventsCursorNow(ctx context.Context) (string, error) {
	if err := q.check(ctx, false); err != nil {
		return "", err
	}
	infos := make([]*redis.XInfoStreamCmd, q.ks.shards)
	_, _ = q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for s := range q.ks.shards {
			infos[s] = p.XInfoStream(ctx, q.ks.streamKey(s))
		}
		return nil
	})
	ids := make([]streamID, q.ks.shards)
	failed := &ShardsError{Of: q.ks.shards}
	for s, c := range infos {
		info, err := c.Result()
		switch {
		case err != nil && isNoSuchKey(err):
		case reply.IsWrongType(err):
			failed.add(s, &WrongTypeError{Key: q.ks.streamKey(s), Want: "stream", Got: "non-stream"})
		case err != nil:
			failed.add(s, fmt.Errorf("jobkey: read %s: %w", q.ks.streamKey(s), err))
		default:
			ids[s], _ = parseStreamID(info.LastGeneratedID)
		}
	}
	if err := failed.orNil(); err != nil {
		return "", err
	}
	return q.formatEventsCursor(ids), nil
}

// FollowEvents calls fn with every page of events after cursor, in order
// (Events), and blocks for more while there are none (XREAD BLOCK on every
// shard's stream: one command on a single Redis, one per shard on a
// cluster). It returns when ctx ends or fn returns an error, with the
// cursor after the last page fn accepted, for the next FollowEvents to
// resume from, in this process or another. A read that fails (a shard's
// node down, a failover under way) is logged and tried again after a
// pause, from the same cursor; a malformed cursor and a key of the wrong
// type end it at once.
func (q *Queue) FollowEvents(ctx context.Context, cursor string, fn func(EventPage) error) (string, error) {
	if _, err := q.parseEventsCursor(cursor); err != nil {
		return cursor, err
	}
	backoff := time.Duration(0)
	for {
		page, err := q.Events(ctx, cursor, defaultEventsLimit)
		if page != nil && len(page.Events) > 0 {
			if ferr := fn(*page); ferr != nil {
				return cursor, ferr
			}
			cursor = page.Cursor
		} else if page != nil {
			cursor = page.Cursor
		}
		if ctx.Err() != nil {
			return cursor, ctx.Err()
		}
		var wt *WrongTypeError
		switch {
		case err != nil && (errors.Is(err, ErrInvalid) || errors.As(err, &wt)):
			return cursor, err
		case err != nil:
			backoff = min(max(2*backoff, 50*time.Millisecond), 2*time.Second)
			q.cfg.Logger.Warn("jobkey: follow events: read failed, trying again", "queue", q.name, "err", err, "in", backoff)
			if err := sleepCtx(ctx, backoff); err != nil {
				return cursor, err
			}
			continue
		}
		backoff = 0
		if page != nil && len(page.Events) > 0 {
			continue // there may be more at once
		}
		if err := q.waitEvents(ctx, cursor); err != nil {
			return cursor, err
		}
	}
}

// followBlock bounds each XREAD BLOCK of FollowEvents: a stream that went
// back past the cursor (a failover) is noticed by the next Events at most
// this late, and so is the end of ctx.
const followBlock = time.Second

// waitEvents blocks until some shard's stream may have an entry after
// cursor, or followBlock passed. Its errors other than ctx's are left to
// the Events that follows.
func (q *Queue) waitEvents(ctx context.Context, cursor string) error {
	cur, err := q.parseEventsCursor(cursor)
	if err != nil {
		return err
	}
	xread := func(shards []int) {
		args := &redis.XReadArgs{Count: 1, Block: followBlock}
		for _, s := range shards {
			args.Streams = append(args.Streams, q.ks.streamKey(s))
		}
		for _, s := range shards {
			args.Streams = append(args.Streams, cmp.Or(cur[s].String(), "0"))
		}
		_ = q.rdb.XRead(ctx, args).Err() // nil after the block: redis.Nil
	}
	if !q.cluster() {
		all := make([]int, q.ks.shards)
		for s := range all {
			all[s] = s
		}
		xread(all)
		return ctx.Err()
	}
	// A command stays in one hash slot: one XREAD per shard, at once; the
	// first to return wakes the reader (the others end within followBlock).
	woke := make(chan struct{}, q.ks.shards)
	for s := range q.ks.shards {
		go func() {
			xread([]int{s})
			woke <- struct{}{}
		}()
	}
	select {
	case <-woke:
	case <-ctx.Done():
	}
	return ctx.Err()
}

// isNoSuchKey reports XINFO STREAM's error for a key that does not exist.
func isNoSuchKey(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such key")
}

// parseEvent reads one stream entry. It never fails: an entry jobkey did
// not write as it writes them is an EventMalformed.
func parseEvent(shard int, m redis.XMessage) Event {
	ev := Event{Kind: EventTransition, Shard: shard, ID: m.ID}
	fields := make(map[string]string, len(m.Values))
	for k, v := range m.Values {
		s, _ := v.(string)
		fields[k] = s
	}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if at, ok := fields["at"]; !ok {
		bad("no at")
	} else if ms, err := strconv.ParseInt(at, 10, 64); err != nil || ms < 0 || ms > maxMillis {
		bad("at %q is no time in unix ms", at)
	} else {
		ev.At = fromMillis(ms)
	}
	if sw, ok := fields[eventsSwitchField]; ok {
		switch sw {
		case eventsOn:
			ev.Kind = EventEnabled
		case eventsOff:
			ev.Kind = EventDisabled
		default:
			bad("events %q is neither on nor off", sw)
		}
	} else {
		ev.Job, ev.Type, ev.Worker = fields["job"], fields["type"], fields["worker"]
		if ev.Job == "" {
			bad("no job")
		} else if err := validID(ev.Job); err != nil {
			bad("job %q: %v", ev.Job, err)
		}
		var okFrom, okTo bool
		ev.From, okFrom = stateOfName(fields["from"])
		ev.To, okTo = stateOfName(fields["to"])
		switch {
		case !okFrom:
			bad("from %q is no state", fields["from"])
		case !okTo:
			bad("to %q is no state", fields["to"])
		case ev.From == 0 && ev.To == 0:
			bad("neither from nor to")
		}
		if a, err := strconv.Atoi(fields["attempt"]); err != nil || a < 0 || a > MaxAttemptsLimit {
			bad("attempt %q is no attempt", fields["attempt"])
		} else {
			ev.Attempt = a
		}
	}
	if len(problems) > 0 {
		ev.Kind, ev.Problem, ev.Fields = EventMalformed, strings.Join(problems, "; "), fields
	}
	return ev
}

// maxMillis is the last unix ms of year 9999: no event is later.
const maxMillis = 253402300799999

// stateOfName is the state an event names; "" is none (0).
func stateOfName(name string) (State, bool) {
	if name == "" {
		return 0, true
	}
	for s := StatePending; s <= StateCanceled; s++ {
		if s.String() == name {
			return s, true
		}
	}
	return 0, false
}

// streamID is a stream entry's ID.
type streamID struct{ ms, seq uint64 }

func (id streamID) isZero() bool { return id == streamID{} }

func (id streamID) String() string {
	if id.isZero() {
		return ""
	}
	return strconv.FormatUint(id.ms, 10) + "-" + strconv.FormatUint(id.seq, 10)
}

func (id streamID) compare(o streamID) int {
	if c := cmp.Compare(id.ms, o.ms); c != 0 {
		return c
	}
	return cmp.Compare(id.seq, o.seq)
}

func (id streamID) less(o streamID) bool { return id.compare(o) < 0 }

// parseStreamID reads "<ms>-<seq>"; "" and "0-0" are the zero ID.
func parseStreamID(s string) (streamID, bool) {
	ms, seq, ok := strings.Cut(s, "-")
	if !ok {
		return streamID{}, false
	}
	a, err1 := strconv.ParseUint(ms, 10, 64)
	b, err2 := strconv.ParseUint(seq, 10, 64)
	if err1 != nil || err2 != nil {
		return streamID{}, false
	}
	return streamID{a, b}, true
}

func mustStreamID(s string) streamID {
	id, _ := parseStreamID(s)
	return id
}

// eventsCursorVersion prefixes every cursor: a later format will be told
// from this one.
const eventsCursorVersion = "e1:"

// formatEventsCursor writes one stream ID per shard: "e1:", the queue's
// tag (eventsCursorTag), ":" and the IDs, comma-separated, "" for the
// start of a stream.
func (q *Queue) formatEventsCursor(ids []streamID) string {
	var b strings.Builder
	b.WriteString(eventsCursorVersion)
	b.WriteString(q.eventsCursorTag())
	b.WriteByte(':')
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(id.String())
	}
	return b.String()
}

// eventsCursorTag names the queue a cursor was read from (its prefix and
// name, hashed): read against another queue's streams, a cursor's IDs
// mean nothing, and one equal to an entry there would pass for it and
// skip every entry before it.
func (q *Queue) eventsCursorTag() string {
	h := fnv.New32a()
	h.Write([]byte(q.ks.prefix))
	h.Write([]byte{0})
	h.Write([]byte(q.name))
	return fmt.Sprintf("%08x", h.Sum32())
}

// parseEventsCursor reads a cursor of this queue's shard count; "" is the
// start of every stream.
func (q *Queue) parseEventsCursor(c string) ([]streamID, error) {
	ids := make([]streamID, q.ks.shards)
	if c == "" {
		return ids, nil
	}
	rest, ok := strings.CutPrefix(c, eventsCursorVersion)
	if !ok {
		return nil, fmt.Errorf("%w: events cursor %.40q is not of this version of jobkey", ErrInvalid, c)
	}
	tag, rest, ok := strings.Cut(rest, ":")
	if !ok {
		return nil, fmt.Errorf("%w: events cursor %.40q names no queue", ErrInvalid, c)
	}
	if tag != q.eventsCursorTag() {
		return nil, fmt.Errorf("%w: events cursor %.40q is of another queue than %q under prefix %q", ErrInvalid, c, q.name, q.ks.prefix)
	}
	parts := strings.Split(rest, ",")
	if len(parts) != q.ks.shards {
		return nil, fmt.Errorf("%w: events cursor has %d shards, queue %q has %d", ErrInvalid, len(parts), q.name, q.ks.shards)
	}
	for i, p := range parts {
		if p == "" {
			continue
		}
		id, ok := parseStreamID(p)
		if !ok {
			return nil, fmt.Errorf("%w: events cursor: shard %d: %.40q is no stream ID", ErrInvalid, i, p)
		}
		ids[i] = id
	}
	return ids, nil
}
