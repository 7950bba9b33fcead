package jobkey

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func eventIDs(evs []Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = fmt.Sprint(e.Shard, "/", e.ID)
	}
	return out
}

// A cursor resumes in another process where the last page ended: every
// event once, each shard's in order.
func TestEventsCursorResumesInAnotherProcess(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 3})
	ctx := f.ctx
	require.NoError(t, f.q.EnableEvents(ctx))
	for range 20 {
		_, err := f.q.Enqueue(ctx, "t", nil, nil)
		require.NoError(t, err)
	}
	whole, _ := readEvents(t, f.q, "")
	require.Len(t, whole, 3+20)

	page, err := f.q.Events(ctx, "", 7)
	require.NoError(t, err)
	require.Len(t, page.Events, 7)
	restarted := f.twin(t)
	rest, _ := readEvents(t, restarted, page.Cursor)
	got := append(slices.Clone(page.Events), rest...)
	require.ElementsMatch(t, eventIDs(whole), eventIDs(got), "every event once")
	last := map[int]streamID{}
	for _, e := range got {
		id := mustStreamID(e.ID)
		require.True(t, last[e.Shard].less(id), "shard %d in order", e.Shard)
		last[e.Shard] = id
	}

	tag := "e1:" + f.q.eventsCursorTag() + ":"
	_, err = f.q.Events(ctx, tag+"1-0", 0)
	require.ErrorIs(t, err, ErrInvalid, "a cursor of another shard count")
	for _, forged := range []string{"junk", "e1:", "e1:1-0,,", tag + "x,,", tag + "-1-0,,", tag + "1--1,,", tag + "1-0-0,,",
		tag + "99999999999999999999-0,,", tag + strings.Repeat("1-0,", 1<<16), "e0:" + tag[3:] + ",,"} {
		_, err = f.q.Events(ctx, forged, 0)
		require.ErrorIs(t, err, ErrInvalid, "%.60q", forged)
	}
	// A cursor past every entry there is: the stream is read again from
	// its start, told so.
	ahead, err := f.q.Events(ctx, tag+"18446744073709551615-18446744073709551615,,", 0)
	require.NoError(t, err)
	require.Contains(t, ahead.Events, Event{Kind: EventRewound, Shard: 0})
}

// A reader that fell behind the trimming of the stream is told, with an
// EventGap before the first event it gets, and goes on from there; a
// reader that kept up is told nothing.
func TestEventsReportTrimmedEntriesAsGap(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{EventsMaxLen: 10})
	ctx := f.ctx
	require.NoError(t, f.q.EnableEvents(ctx))
	for range 5 {
		_, err := f.q.Enqueue(ctx, "t", nil, nil)
		require.NoError(t, err)
	}
	behind, err := f.q.Events(ctx, "", 3)
	require.NoError(t, err)
	_, upToDate := readEvents(t, f.q, "")
	for range 300 {
		_, err := f.q.Enqueue(ctx, "t", nil, nil)
		require.NoError(t, err)
	}
	n, err := f.rdb.XLen(ctx, f.q.ks.streamKey(0)).Result()
	require.NoError(t, err)
	require.Less(t, n, int64(300), "trimmed")

	evs, _ := readEvents(t, f.q, behind.Cursor)
	require.Equal(t, EventGap, evs[0].Kind)
	require.Equal(t, EventTransition, evs[1].Kind)
	require.Len(t, evs, 1+int(n), "the gap, then every entry kept")
	for _, e := range evs[1:] {
		require.Equal(t, EventTransition, e.Kind)
	}
	// A page cut right after the gap still carries the event after it.
	one, err := f.q.Events(ctx, behind.Cursor, 1)
	require.NoError(t, err)
	require.Equal(t, []EventKind{EventGap, EventTransition}, kinds(one.Events))
	next, err := f.q.Events(ctx, one.Cursor, 1)
	require.NoError(t, err)
	require.Equal(t, []EventKind{EventTransition}, kinds(next.Events), "no second gap")

	kept, _ := readEvents(t, f.q, upToDate)
	require.Equal(t, EventGap, kept[0].Kind, "its entry was trimmed too: Redis cannot say whether the next was")
}

// A stream that lost entries a reader had read (a failover to a replica
// that never got them, or a deleted stream) is read again from its start,
// with an EventRewound first, even when its new entries already go past
// the cursor: nothing written since is skipped.
func TestEventsRewindWhenTheStreamLostReadEntries(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := f.ctx
	stream := f.q.ks.streamKey(0)
	require.NoError(t, f.q.EnableEvents(ctx))
	for range 3 {
		_, err := f.q.Enqueue(ctx, "t", nil, nil)
		require.NoError(t, err)
	}
	evs, cursor := readEvents(t, f.q, "")
	require.Len(t, evs, 4)

	// The stream is gone: the reader starts again.
	require.NoError(t, f.rdb.Del(ctx, stream).Err())
	_, err := f.q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "after"})
	require.NoError(t, err)
	got, cursor := readEvents(t, f.q, cursor)
	require.Equal(t, []EventKind{EventRewound, EventTransition}, kinds(got))
	require.Equal(t, "after", got[1].Job)

	// A new master kept the first two entries, and wrote one past the
	// reader's cursor since: the cursor's entry is gone, but not trimmed.
	last := mustStreamID(got[1].ID)
	kept, err := f.rdb.XRange(ctx, stream, "-", "+").Result()
	require.NoError(t, err)
	require.NoError(t, f.rdb.Del(ctx, stream).Err())
	for _, m := range kept[:len(kept)-1] {
		require.NoError(t, f.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: m.ID, Values: m.Values}).Err())
	}
	past := streamID{last.ms, last.seq + 5}
	require.NoError(t, f.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: past.String(),
		Values: []any{"job", "new", "type", "t", "from", "", "to", "pending", "attempt", "0", "at", "1", "worker", ""}}).Err())
	got, _ = readEvents(t, f.q, cursor)
	require.Equal(t, EventRewound, got[0].Kind)
	require.Equal(t, "new", got[len(got)-1].Job, "the new master's entry is read")
}

// Entries a client other than jobkey wrote into the stream are reported
// as EventMalformed, with what they hold, and reading goes on.
func TestEventsReportForgedEntries(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := f.ctx
	stream := f.q.ks.streamKey(0)
	require.NoError(t, f.q.EnableEvents(ctx))
	forged := [][]any{
		{"job", "", "from", "", "to", "pending", "attempt", "0", "at", "1"},
		{"job", "x", "from", "sideways", "to", "pending", "attempt", "0", "at", "1"},
		{"job", "x", "from", "", "to", "", "attempt", "0", "at", "1"},
		{"job", "x", "from", "", "to", "pending", "attempt", "-3", "at", "1"},
		{"job", "x", "from", "", "to", "pending", "attempt", "0", "at", "99999999999999999999"},
		{"job", "x{", "from", "", "to", "pending", "attempt", "0", "at", "1"},
		{"events", "maybe", "at", "1"},
		{"nothing", "here"},
	}
	for _, v := range forged {
		require.NoError(t, f.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: v}).Err())
	}
	_, err := f.q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "real"})
	require.NoError(t, err)
	evs, _ := readEvents(t, f.q, "")
	require.Len(t, evs, 1+len(forged)+1)
	for i, e := range evs[1 : 1+len(forged)] {
		require.Equal(t, EventMalformed, e.Kind, "entry %d", i)
		require.NotEmpty(t, e.Problem, "entry %d", i)
		require.NotEmpty(t, e.Fields, "entry %d", i)
	}
	require.Equal(t, EventTransition, evs[len(evs)-1].Kind)
	require.Equal(t, "real", evs[len(evs)-1].Job)
}

// FollowEvents delivers what comes, blocks while nothing does, and
// returns a cursor that the next FollowEvents resumes from exactly.
func TestFollowEventsResumesWhereItStopped(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2})
	ctx := f.ctx
	require.NoError(t, f.q.EnableEvents(ctx))
	start, err := f.q.EventsCursorNow(ctx)
	require.NoError(t, err)

	var lastPage []Event
	// follow follows from cursor until it got want events; reject: fn
	// refuses the page that brings the count to want, else it takes it and
	// the follower is canceled.
	follow := func(cursor string, want int, reject bool) ([]Event, string) {
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		var got []Event
		stop := errors.New("enough")
		next, err := f.q.FollowEvents(fctx, cursor, func(p EventPage) error {
			got = append(got, p.Events...)
			lastPage = p.Events
			switch {
			case len(got) < want:
			case reject:
				return stop
			default:
				cancel()
			}
			return nil
		})
		if reject {
			require.ErrorIs(t, err, stop)
		} else {
			require.ErrorIs(t, err, context.Canceled)
		}
		return got, next
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		time.Sleep(100 * time.Millisecond) // the follower blocks first
		for i := range 5 {
			_, err := f.q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprint("a", i)})
			require.NoError(t, err)
		}
	})
	got, cursor := follow(start, 5, true)
	wg.Wait()
	require.Len(t, got, 5)
	// The cursor returned is before the page fn refused: the next follower
	// gets it again.
	refused := lastPage
	again, cursor := follow(cursor, len(refused), false)
	require.Equal(t, eventIDs(refused), eventIDs(again))
	for i := range 3 {
		_, err := f.q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprint("b", i)})
		require.NoError(t, err)
	}
	more, _ := follow(cursor, 3, false)
	require.Len(t, more, 3)
	for _, e := range more {
		require.Contains(t, []string{"b0", "b1", "b2"}, e.Job)
	}
}

// FuzzParseEvent: no entry, however forged, panics the reader, and any
// entry is read as one event.
func FuzzParseEvent(f *testing.F) {
	f.Add("job", "x", "from", "", "to", "pending", "attempt", "0", "at", "1")
	f.Add("events", "on", "at", "1", "", "", "", "", "", "")
	f.Add("job", "x", "from", "active", "to", "", "attempt", "99999999999999999999", "at", "-1")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3, k4, v4, k5, v5 string) {
		m := redis.XMessage{ID: "1-1", Values: map[string]any{k1: v1, k2: v2, k3: v3, k4: v4, k5: v5}}
		e := parseEvent(0, m)
		if e.Kind == EventMalformed && e.Problem == "" {
			t.Fatal("a malformed entry says what is wrong")
		}
	})
}

// A follower across a failover that lost the newest entries (and their
// writes): it neither hangs nor skips. It is told the stream rewound, reads
// the new master's stream from its start, and gets every event written
// after the promotion.
func TestFollowEventsAcrossAFailoverMissesNothingNew(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t, 1)
	rdb := s.Client(t, func(o *redis.FailoverOptions) { o.DialTimeout = 300 * time.Millisecond })
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Logger: quietLog()})
	ctx := context.Background()
	require.NoError(t, q.EnableEvents(ctx))
	for i := range 5 {
		_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprint("a", i)})
		require.NoError(t, err)
	}
	require.NoError(t, rdb.Wait(ctx, 1, 5*time.Second).Err())

	var mu sync.Mutex
	var seen []Event
	seenJob := func(id string) bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.ContainsFunc(seen, func(e Event) bool { return e.Job == id })
	}
	fctx, cancel := context.WithCancel(ctx)
	followed := make(chan error, 1)
	go func() {
		_, err := q.FollowEvents(fctx, "", func(p EventPage) error {
			mu.Lock()
			seen = append(seen, p.Events...)
			mu.Unlock()
			return nil
		})
		followed <- err
	}()
	defer func() {
		cancel()
		require.ErrorIs(t, <-followed, context.Canceled)
	}()
	require.Eventually(t, func() bool { return seenJob("a4") }, 10*time.Second, 10*time.Millisecond)

	// Writes the replica never gets: the follower reads them, then the
	// master dies with them.
	resumed, err := s.Replicas[0].Stall(replicaStall)
	require.NoError(t, err)
	t.Cleanup(func() { <-resumed })
	require.NoError(t, s.Master.DropReplicas(ctx))
	for i := range 3 {
		_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprint("lost", i)})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return seenJob("lost2") }, 10*time.Second, 10*time.Millisecond)
	s.Master.Crash()
	_, _, err = s.WaitPromoted(ctx, s.Master, 20*time.Second)
	require.NoError(t, err)

	for i := range 5 {
		id := fmt.Sprint("b", i)
		require.Eventually(t, func() bool {
			_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: id})
			return err == nil || errors.Is(err, ErrJobExists)
		}, 20*time.Second, 50*time.Millisecond, "enqueue %s on the new master", id)
	}
	for i := range 5 {
		require.Eventually(t, func() bool { return seenJob(fmt.Sprint("b", i)) }, 20*time.Second, 10*time.Millisecond, "b%d followed", i)
	}
	mu.Lock()
	defer mu.Unlock()
	rewound := slices.IndexFunc(seen, func(e Event) bool { return e.Kind == EventRewound })
	require.GreaterOrEqual(t, rewound, 0, "the follower was told the stream went back")
	require.Greater(t, rewound, slices.IndexFunc(seen, func(e Event) bool { return e.Job == "lost2" }))
	for _, e := range seen[rewound:] {
		require.NotContains(t, []string{"lost0", "lost1", "lost2"}, e.Job, "lost with the master, as their jobs")
	}
}

// On a cluster each shard's stream lives in its own hash slot: events are
// written beside their jobs, read across the nodes in one Events, and
// FollowEvents blocks on every shard at once.
func TestEventsOnACluster(t *testing.T) {
	t.Parallel()
	cl := redistest.SharedCluster(t)
	rdb := cl.Client(t, nil)
	ctx := context.Background()
	q := queueOn(t, rdb, redistest.Prefix(t), Config{})
	require.NoError(t, q.EnableEvents(ctx))
	batch := make([]JobSpec, 100)
	for i := range batch {
		batch[i] = JobSpec{Type: "t", Opts: &EnqueueOpts{ID: fmt.Sprint("c", i)}}
	}
	_, err := q.EnqueueMany(ctx, batch)
	require.NoError(t, err)
	for range 10 {
		c, err := q.Claim(ctx, "w")
		require.NoError(t, err)
		_, err = q.Complete(ctx, c, nil)
		require.NoError(t, err)
	}
	evs, cursor := readEvents(t, q, "")
	require.Len(t, evs, q.cfg.Shards+100+20)
	checkEventChains(t, q, evs, true)

	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	go func() {
		time.Sleep(200 * time.Millisecond)
		_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "late"})
		require.NoError(t, err)
	}()
	var got []Event
	_, err = q.FollowEvents(fctx, cursor, func(p EventPage) error {
		got = append(got, p.Events...)
		cancel()
		return nil
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Len(t, got, 1)
	require.Equal(t, "late", got[0].Job)
}

// A key of another type where a shard's stream should be is a
// *WrongTypeError that names it, and ends FollowEvents at once rather
// than being tried again for ever.
func TestEventsRefuseAStreamOfAnotherType(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2})
	ctx := f.ctx
	require.NoError(t, f.q.EnableEvents(ctx))
	stream := f.q.ks.streamKey(1)
	require.NoError(t, f.rdb.Del(ctx, stream).Err())
	require.NoError(t, f.rdb.Set(ctx, stream, "not a stream", 0).Err())

	page, err := f.q.Events(ctx, "", 0)
	var wt *WrongTypeError
	require.ErrorAs(t, err, &wt)
	require.Equal(t, stream, wt.Key)
	var shards *ShardsError
	require.ErrorAs(t, err, &shards, "the other shard's events come with it")
	require.Equal(t, []int{1}, shards.Shards)
	require.Equal(t, []EventKind{EventEnabled}, kinds(page.Events))
	_, err = f.q.EventsCursorNow(ctx)
	require.ErrorAs(t, err, &wt)
	require.Equal(t, stream, wt.Key)

	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = f.q.FollowEvents(fctx, "", func(EventPage) error { return nil })
	require.ErrorAs(t, err, &wt, "ended at once, not when ctx ends")
	require.NoError(t, fctx.Err())
}

// Entries deleted after the cursor (XDEL, outside jobkey) while the
// cursor's own entry stays are reported as an EventGap before the first
// entry after them, never skipped in silence.
func TestEventsReportEntriesDeletedAfterTheCursorAsGap(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := f.ctx
	require.NoError(t, f.q.EnableEvents(ctx))
	for _, id := range []string{"a", "b", "c", "d"} {
		_, err := f.q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: id})
		require.NoError(t, err)
	}
	first, err := f.q.Events(ctx, "", 2) // events on, a
	require.NoError(t, err)
	evs, _ := readEvents(t, f.q, first.Cursor)
	require.Equal(t, []string{"b", "c", "d"}, jobsOf(evs))
	require.NoError(t, f.rdb.XDel(ctx, f.q.ks.streamKey(0), evs[1].ID).Err()) // c

	got, _ := readEvents(t, f.q, first.Cursor)
	require.Equal(t, []EventKind{EventTransition, EventGap, EventTransition}, kinds(got))
	require.Equal(t, []string{"b", "", "d"}, jobsOf(got))
	// One event at a time: the gap still comes once, with the event after it.
	var one []Event
	cursor := first.Cursor
	for {
		page, err := f.q.Events(ctx, cursor, 1)
		require.NoError(t, err)
		if len(page.Events) == 0 {
			break
		}
		one = append(one, page.Events...)
		cursor = page.Cursor
	}
	require.Equal(t, kinds(got), kinds(one))
}

func jobsOf(evs []Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Job
	}
	return out
}

// A cursor names the queue it was read from: another queue's (of the
// same shard count, under this prefix or another) is refused with
// ErrInvalid rather than read against this queue's streams, where an
// entry of the same ID (two streams written in the same millisecond)
// would pass for the reader's own and skip every event before it in
// silence. The same queue in another process reads it as its own.
func TestEventsRefuseACursorOfAnotherQueue(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2})
	ctx := f.ctx
	require.NoError(t, f.q.EnableEvents(ctx))
	_, err := f.q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	mine, err := f.q.Events(ctx, "", 1)
	require.NoError(t, err)

	other, err := NewQueue(f.rdb, "other", &Config{Shards: 2, Prefix: f.q.ks.prefix})
	require.NoError(t, err)
	require.NoError(t, other.EnableEvents(ctx))
	_, err = other.Events(ctx, mine.Cursor, 0)
	require.ErrorIs(t, err, ErrInvalid, "another queue's cursor")
	_, err = other.FollowEvents(ctx, mine.Cursor, func(EventPage) error { return nil })
	require.ErrorIs(t, err, ErrInvalid)
	elsewhere, err := NewQueue(f.rdb, "q", &Config{Shards: 2, Prefix: f.q.ks.prefix + "-2"})
	require.NoError(t, err)
	require.NoError(t, elsewhere.EnableEvents(ctx))
	_, err = elsewhere.Events(ctx, mine.Cursor, 0)
	require.ErrorIs(t, err, ErrInvalid, "the same queue name under another prefix")
	theirs, err := other.EventsCursorNow(ctx)
	require.NoError(t, err)
	_, err = f.q.Events(ctx, theirs, 0)
	require.ErrorIs(t, err, ErrInvalid)

	page, err := f.twin(t).Events(ctx, mine.Cursor, 0)
	require.NoError(t, err, "the same queue, another process")
	require.Len(t, page.Events, 2, "the other shard's events on, and the enqueue")
}

// A cursor from anywhere never panics the parse; one it accepts is
// written back as the same IDs, for the same queue.
func FuzzParseEventsCursor(f *testing.F) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled: the parse is pure
	f.Cleanup(func() { rdb.Close() })
	q, err := NewQueue(rdb, "q", &Config{Shards: 3, Prefix: "fuzz"})
	if err != nil {
		f.Fatal(err)
	}
	tag := eventsCursorVersion + q.eventsCursorTag() + ":"
	f.Add("")
	f.Add(tag + ",,")
	f.Add(tag + "1-0,2-5,")
	f.Add(tag + "18446744073709551615-18446744073709551615,0-0,")
	f.Add(tag + "-1-0,,")
	f.Add("e1:" + ",,")
	f.Fuzz(func(t *testing.T, c string) {
		ids, err := q.parseEventsCursor(c)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("%q: %v is not ErrInvalid", c, err)
			}
			return
		}
		again, err := q.parseEventsCursor(q.formatEventsCursor(ids))
		if err != nil || !slices.Equal(ids, again) {
			t.Fatalf("%q: written back as %v, %v", c, again, err)
		}
	})
}
