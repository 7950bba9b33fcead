package jobkey

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/faultproxy"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// readEvents reads every event of q after cursor, page by page.
func readEvents(t eventsT, q *Queue, cursor string) ([]Event, string) {
	t.Helper()
	var all []Event
	for {
		page, err := q.Events(context.Background(), cursor, 50)
		require.NoError(t, err)
		all = append(all, page.Events...)
		if len(page.Events) == 0 {
			return all, page.Cursor
		}
		cursor = page.Cursor
	}
}

// step is an event as a test expects it.
type step struct {
	kind     EventKind
	job      string
	from, to State
	attempt  int
	worker   string
}

func steps(evs []Event) []step {
	out := make([]step, len(evs))
	for i, e := range evs {
		out[i] = step{e.Kind, e.Job, e.From, e.To, e.Attempt, e.Worker}
	}
	return out
}

// Every transition of every path appends its one event, in order, with
// the transaction's time; a lease renewal and an Update append none.
func TestEventsRecordEveryTransitionOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := f.ctx
	require.NoError(t, f.q.EnableEvents(ctx))
	j, err := f.q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "j"})
	require.NoError(t, err)
	c, err := f.q.Claim(ctx, "w1")
	require.NoError(t, err)
	c, err = f.q.Extend(ctx, c)
	require.NoError(t, err)
	failed, err := f.q.Fail(ctx, c, errors.New("x"))
	require.NoError(t, err)
	f.clock.Advance(time.Hour)
	c, err = f.q.Claim(ctx, "w2")
	require.NoError(t, err)
	done, err := f.q.Complete(ctx, c, nil)
	require.NoError(t, err)
	_, err = f.q.Update(ctx, "j", func(j *Job) error { j.Meta = map[string]string{"a": "b"}; return nil })
	require.NoError(t, err)
	_, err = f.q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "k"})
	require.NoError(t, err)
	_, err = f.q.Cancel(ctx, "k")
	require.NoError(t, err)
	_, err = f.q.Retry(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, f.q.Delete(ctx, "k"))
	// A claim that finds a run's lease gone takes the job over: a new run.
	_, err = f.q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "l"})
	require.NoError(t, err)
	_, err = f.q.Claim(ctx, "w3")
	require.NoError(t, err)
	f.clock.Advance(time.Hour)
	_, err = f.q.Claim(ctx, "w4")
	require.NoError(t, err)

	evs, _ := readEvents(t, f.q, "")
	require.Equal(t, []step{
		{kind: EventEnabled},
		{EventTransition, "j", 0, StatePending, 0, ""},
		{EventTransition, "j", StatePending, StateActive, 1, "w1"},
		{EventTransition, "j", StateActive, StatePending, 1, "w1"},
		{EventTransition, "j", StatePending, StateActive, 2, "w2"},
		{EventTransition, "j", StateActive, StateSucceeded, 2, "w2"},
		{EventTransition, "k", 0, StatePending, 0, ""},
		{EventTransition, "k", StatePending, StateCanceled, 0, ""},
		{EventTransition, "k", StateCanceled, StatePending, 0, ""},
		{EventTransition, "k", StatePending, 0, 0, ""},
		{EventTransition, "l", 0, StatePending, 0, ""},
		{EventTransition, "l", StatePending, StateActive, 1, "w3"},
		{EventTransition, "l", StateActive, StateActive, 2, "w4"},
	}, steps(evs))
	require.True(t, evs[1].At.Equal(j.UpdatedAt), "the enqueue's time")
	require.True(t, evs[3].At.Equal(failed.UpdatedAt), "the failure's time")
	require.True(t, evs[5].At.Equal(done.UpdatedAt), "the completion's time")
	for _, e := range evs[1:] {
		require.Equal(t, "t", e.Type)
		require.NotEmpty(t, e.ID)
	}
}

// A queue whose events are off writes no stream, and DisableEvents stops
// them: its entry is the last of the stream.
func TestEventsOffWriteNothing(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := f.ctx
	_, err := f.q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	_, err = f.q.Claim(ctx, "w")
	require.NoError(t, err)
	n, err := f.rdb.Exists(ctx, f.q.ks.streamKey(0)).Result()
	require.NoError(t, err)
	require.Zero(t, n, "no stream while events are off")

	require.NoError(t, f.q.EnableEvents(ctx))
	require.NoError(t, f.q.EnableEvents(ctx), "on already: nothing written")
	_, err = f.q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	require.NoError(t, f.q.DisableEvents(ctx))
	_, err = f.q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	_, err = f.q.Claim(ctx, "w")
	require.NoError(t, err)
	evs, _ := readEvents(t, f.q, "")
	require.Equal(t, []EventKind{EventEnabled, EventTransition, EventDisabled}, kinds(evs))
}

func kinds(evs []Event) []EventKind {
	out := make([]EventKind, len(evs))
	for i, e := range evs {
		out[i] = e.Kind
	}
	return out
}

// The stream adds no round trip to any transition: each call makes as
// many with events on as off. A process that did not see the events go
// on pays one round trip more, once per shard, to check the stream's type
// before its first event.
func TestEventsAddNoRoundTrip(t *testing.T) {
	t.Parallel()
	off, on := setup(t, nil), setup(t, nil)
	require.NoError(t, on.q.EnableEvents(on.ctx))
	ops := []struct {
		name string
		op   func(f *fixture, held **Job) error
	}{
		{"Enqueue", func(f *fixture, _ **Job) error { _, err := f.q.Enqueue(f.ctx, "t", nil, nil); return err }},
		{"EnqueueMany(20)", func(f *fixture, _ **Job) error {
			batch := make([]JobSpec, 20)
			for i := range batch {
				batch[i].Type = "t"
			}
			_, err := f.q.EnqueueMany(f.ctx, batch)
			return err
		}},
		{"Claim", func(f *fixture, h **Job) (err error) { *h, err = f.q.Claim(f.ctx, "w"); return }},
		{"Extend", func(f *fixture, h **Job) (err error) { *h, err = f.q.Extend(f.ctx, *h); return }},
		{"Complete", func(f *fixture, h **Job) error { _, err := f.q.Complete(f.ctx, *h, nil); return err }},
		{"Claim 2", func(f *fixture, h **Job) (err error) { *h, err = f.q.Claim(f.ctx, "w"); return }},
		{"Fail", func(f *fixture, h **Job) error { _, err := f.q.Fail(f.ctx, *h, errors.New("x")); return err }},
		{"Cancel", func(f *fixture, h **Job) error { _, err := f.q.Cancel(f.ctx, (*h).ID); return err }},
		{"Retry", func(f *fixture, h **Job) error { _, err := f.q.Retry(f.ctx, (*h).ID); return err }},
		{"Delete", func(f *fixture, h **Job) error { return f.q.Delete(f.ctx, (*h).ID) }},
		{"CancelPending", func(f *fixture, _ **Job) error { _, err := f.q.CancelPending(f.ctx, ""); return err }},
	}
	var hOff, hOn *Job
	for _, o := range ops {
		off.hook.Reset()
		require.NoError(t, o.op(off, &hOff), o.name)
		on.hook.Reset()
		require.NoError(t, o.op(on, &hOn), o.name)
		require.Equal(t, off.hook.RTT.Load(), on.hook.RTT.Load(), "%s: round trips with events on", o.name)
		t.Logf("%-16s %d round trips; commands off %d, on %d", o.name, on.hook.RTT.Load(), off.hook.Cmds.Load(), on.hook.Cmds.Load())
	}
	evs, _ := readEvents(t, on.q, "")
	// Enabled; 21 enqueues; a claim and its completion; a claim and its
	// failure; a cancel, retry and delete; 19 pending jobs canceled.
	require.Len(t, evs, 1+21+2+2+3+19, "enabled, then one per transition")

	// Another process learns the events are on from its first
	// transaction, which checks the stream's type in one more round trip.
	other := on.twin(t)
	require.NoError(t, other.check(on.ctx, true), "the one-time checks, outside the count")
	on.hook.Reset()
	_, err := other.Enqueue(on.ctx, "t", nil, nil)
	require.NoError(t, err)
	require.EqualValues(t, 3, on.hook.RTT.Load(), "first transition of a process that did not see EnableEvents")
	on.hook.Reset()
	_, err = other.Enqueue(on.ctx, "t", nil, nil)
	require.NoError(t, err)
	require.EqualValues(t, 2, on.hook.RTT.Load(), "then as an Enqueue")
}

// Writers run transitions while the events are switched on and off
// again and again: no event lands while they are off, and while they are
// on each job's events chain up, from state to state, to the state the job
// ends in.
func TestEventsToggledUnderWritersNeverDisagreeWithJobs(t *testing.T) {
	t.Parallel()
	q := realQueue(t, &Config{Shards: 2, Lease: time.Minute, Backoff: func(int) time.Duration { return 0 }, Logger: quietLog()})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const jobs = 40
	for i := range jobs {
		_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprint("j", i), MaxAttempts: 1000})
		require.NoError(t, err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var transitions atomic.Int64
	for w := range 4 {
		wg.Go(func() {
			for !stop.Load() {
				c, err := q.Claim(ctx, fmt.Sprint("w", w))
				if errors.Is(err, ErrNoJob) {
					continue
				}
				if !errors.Is(err, ErrConflict) {
					require.NoError(t, err)
				}
				if c == nil {
					continue
				}
				transitions.Add(1)
				switch rand.IntN(3) {
				case 0:
					_, err = q.Fail(ctx, c, errors.New("again"))
				case 1:
					_, err = q.Release(ctx, c)
				default:
					_, err = q.Complete(ctx, c, nil)
					if err == nil {
						_, err = q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: c.ID, MaxAttempts: 1000, IfExists: IfExistsReplaceFinished})
						transitions.Add(1)
					}
				}
				require.NoError(t, err)
				transitions.Add(1)
			}
		})
	}
	for i := range 30 {
		if i%2 == 0 {
			require.NoError(t, q.EnableEvents(ctx))
		} else {
			require.NoError(t, q.DisableEvents(ctx))
		}
		time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
	}
	require.NoError(t, q.EnableEvents(ctx))
	time.Sleep(50 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	require.Greater(t, transitions.Load(), int64(100), "the writers ran")

	evs, _ := readEvents(t, q, "")
	checkEventChains(t, q, evs, false)
}

// eventsT is what checkEventChains needs of a test: a *testing.T or a
// *rapid.T.
type eventsT interface {
	require.TestingT
	Helper()
}

// checkEventChains holds what the events of q must say: none while a
// shard's events are off; while on, each job's events chain up from state
// to state, and the last says the state the job is in (missing: deleted).
// always says the events were on from before the first job: then every
// run a job's History records has the event that started it.
func checkEventChains(t eventsT, q *Queue, evs []Event, always bool) {
	t.Helper()
	ctx := context.Background()
	on := map[int]bool{}
	known := map[string]State{} // the job's state after its last event, while its shard stayed on
	starts := map[string][]step{}
	for _, e := range evs {
		switch e.Kind {
		case EventEnabled, EventDisabled:
			on[e.Shard] = e.Kind == EventEnabled
			for id := range known {
				if _, s := q.ks.jobKeyOf(id); s == e.Shard {
					delete(known, id)
				}
			}
		case EventTransition:
			require.True(t, on[e.Shard], "event %s of %s while shard %d was off", e.ID, e.Job, e.Shard)
			if was, ok := known[e.Job]; ok {
				require.Equal(t, was, e.From, "event %s of %s: a transition in between has no event", e.ID, e.Job)
			} else if always {
				require.Zero(t, e.From, "event %s of %s: the first is its enqueue", e.ID, e.Job)
			}
			known[e.Job] = e.To
			if e.To == StateActive {
				starts[e.Job] = append(starts[e.Job], step{attempt: e.Attempt, worker: e.Worker})
			}
		default:
			require.Fail(t, "unexpected event", "%+v", e)
		}
	}
	for id, s := range known {
		j, err := q.Get(ctx, id)
		if s == 0 {
			require.ErrorIs(t, err, ErrNotFound, "%s: its last event says it was deleted", id)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, s, j.State, "%s: its last event says where it is", id)
		if !always {
			continue
		}
		for _, r := range j.History {
			require.Contains(t, starts[id], step{attempt: r.Attempt, worker: r.Worker}, "%s: the run of attempt %d has the event that started it", id, r.Attempt)
		}
		if j.State == StateActive {
			require.Contains(t, starts[id], step{attempt: j.Attempt, worker: j.LeaseOwner}, "%s: its run has its event", id)
		}
	}
}

// An EXEC whose reply is lost landed with its events; the retry that
// recognises its own write writes nothing, and no event twice.
func TestEventsOfLostRepliesAreWrittenOnce(t *testing.T) {
	t.Parallel()
	cut, proxy := proxied(t)
	q := queueOn(t, cut, fmt.Sprint("ev-lost-", rand.Int64()), Config{})
	ctx := context.Background()
	require.NoError(t, q.EnableEvents(ctx))
	proxy.Set(faultproxy.Faults{ExecCutProb: 1})
	_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "x"})
	proxy.Set(faultproxy.Faults{})
	require.ErrorIs(t, err, ErrOutcomeUnknown)
	_, err = q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "x"})
	require.ErrorIs(t, err, ErrJobExists, "the retry finds the job, and writes nothing")
	c, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	proxy.Set(faultproxy.Faults{ExecCutProb: 1})
	_, err = q.Complete(ctx, c, []byte("r"))
	proxy.Set(faultproxy.Faults{})
	require.ErrorIs(t, err, ErrOutcomeUnknown)
	_, err = q.Complete(ctx, c, []byte("r"))
	require.NoError(t, err, "the retry recognises its own completion")
	require.NotZero(t, proxy.Counts().ExecCuts)

	evs, _ := readEvents(t, q, "")
	require.Equal(t, []step{
		{kind: EventEnabled},
		{EventTransition, "x", 0, StatePending, 0, ""},
		{EventTransition, "x", StatePending, StateActive, 1, "w"},
		{EventTransition, "x", StateActive, StateSucceeded, 1, "w"},
	}, steps(evs))
}

// With events on, the lines that write need +xadd, and the reader's
// +xinfo|stream +xrange +xread +multi +exec (README). A line without
// +xadd has its transitions refused whole: no write lands without its
// event.
func TestLeastPrivilegeWithEvents(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	cfg := &Config{Backoff: func(int) time.Duration { return 0 }}
	root, err := NewQueue(redistest.ClientFor(t, srv.URL(), nil), "q", cfg)
	require.NoError(t, err)
	for _, line := range []string{aclProducer, aclWorker, aclAdmin} {
		createUser(t, line, aclEvents, srv.Addr)
	}
	createUser(t, aclReader, aclEventsReader, srv.Addr)
	admin, err := NewQueue(asUser(t, srv.URL(), aclAdmin), "q", cfg)
	require.NoError(t, err)
	produce(t, root, "first") // the queue exists before the admin's EnableEvents
	require.NoError(t, admin.EnableEvents(ctx))
	producer, err := NewQueue(asUser(t, srv.URL(), aclProducer), "q", cfg)
	require.NoError(t, err)
	produce(t, producer, "p")
	worker, err := NewQueue(asUser(t, srv.URL(), aclWorker), "q", cfg)
	require.NoError(t, err)
	work(t, worker)
	_, err = admin.CancelPending(ctx, "")
	require.NoError(t, err)
	reader, err := NewQueue(asUser(t, srv.URL(), aclReader), "q", cfg)
	require.NoError(t, err)
	evs, cursor := readEvents(t, reader, "")
	require.Greater(t, len(evs), 5)
	fctx, cancel := context.WithTimeout(ctx, 2*followBlock)
	defer cancel()
	_, err = reader.FollowEvents(fctx, cursor, func(EventPage) error { return nil })
	require.ErrorIs(t, err, context.DeadlineExceeded, "XREAD BLOCK, then nothing")
	requireNothingRefused(t, srv.Addr)

	// Without +xadd the enqueue is refused whole: nothing written.
	createUser(t, aclProducer, "", srv.Addr)
	bare, err := NewQueue(asUser(t, srv.URL(), aclProducer), "q", cfg)
	require.NoError(t, err)
	_, err = bare.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "bare"})
	require.ErrorContains(t, err, "NOPERM")
	_, err = root.Get(ctx, "bare")
	require.ErrorIs(t, err, ErrNotFound, "no write without its event")
}

// A stream whose IDs a hostile client exhausted (an entry with the
// largest ID) makes the XADD fail in EXEC: the one way a transition can
// land without its event. It is reported, with every command's result,
// never silent; deleting the stream mends it.
func TestEventsOnAnExhaustedStreamAreReported(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := f.ctx
	stream := f.q.ks.streamKey(0)
	require.NoError(t, f.q.EnableEvents(ctx))
	require.NoError(t, f.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: "18446744073709551615-18446744073709551615", Values: []any{"x", "y"}}).Err())
	_, err := f.q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "e"})
	var se *StepError
	require.ErrorAs(t, err, &se)
	require.ErrorIs(t, err, ErrStep)
	require.ErrorContains(t, err, "xadd")
	require.ErrorContains(t, err, "exhausted")

	require.NoError(t, f.rdb.Del(ctx, stream).Err())
	_, err = f.q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "f"})
	require.NoError(t, err)
	evs, _ := readEvents(t, f.q, "")
	require.Equal(t, []step{{EventTransition, "f", 0, StatePending, 0, ""}}, steps(evs))
}

// Work's paths write their events too: a periodic job's tick, a run that
// fails and is retried, and the completion fused with the next claim
// (group commit). Every job's events chain up to its state, and each run
// in its History has the event that started it.
func TestEventsOfWorkChainUpToEveryJob(t *testing.T) {
	t.Parallel()
	q := realQueue(t, &Config{Backoff: func(int) time.Duration { return 0 }, Logger: quietLog()})
	ctx := context.Background()
	require.NoError(t, q.EnableEvents(ctx))
	const jobs = 60
	for i := range jobs {
		_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprint("w", i)})
		require.NoError(t, err)
	}
	var runs atomic.Int64
	stop := startWork(t, q, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
		if runs.Add(1)%3 == 0 && j.Attempt == 1 {
			return nil, errors.New("once more")
		}
		return nil, nil
	}), &WorkOpts{Concurrency: 4, PollInterval: 20 * time.Millisecond,
		Periodic: []PeriodicJob{{Name: "tick", Schedule: Every(100 * time.Millisecond), Type: "t"}}})
	waitFor(t, "every job done", func() bool {
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		return st.Succeeded >= jobs+2 && st.Pending == 0 && st.Active == 0
	})
	stop()
	evs, _ := readEvents(t, q, "")
	checkEventChains(t, q, evs, true)
	ticks := 0
	for _, e := range evs {
		if e.Kind == EventTransition && e.From == 0 && !strings.HasPrefix(e.Job, "w") {
			ticks++
		}
	}
	require.GreaterOrEqual(t, ticks, 2, "the periodic ticks' enqueues")
}

// A plan that writes a job's new state without the transition
// decider.move records is refused while events are on: it would land
// without its event.
func TestEventsRefuseAWriteWithoutItsTransition(t *testing.T) {
	t.Parallel()
	cur := &Job{ID: "x", Type: "t", State: StatePending}
	next := &Job{ID: "x", Type: "t", State: StateCanceled}
	keys := []string{"k"}
	r := &casRead{jobs: []*Job{cur}}
	p := &casPlan{writes: []casWrite{{key: "k", job: next}}}
	require.ErrorContains(t, unplanned(keys, r, p), "without the transition")
	var ip indexPlan
	(&decider{ks: newKeyspace("p", "q", 1)}).move(&ip, 0, "x", cur, next, "")
	p.index(&ip)
	require.NoError(t, unplanned(keys, r, p))
	same := &Job{ID: "x", Type: "t", State: StatePending, Meta: map[string]string{"a": "b"}}
	require.NoError(t, unplanned(keys, r, &casPlan{writes: []casWrite{{key: "k", job: same}}}), "no transition: nothing to plan")
}

// The writes of a batch and of the caller's own transaction are
// transitions like any: a batch's jobs, its callback written in the last
// job's EXEC, a chain's step ended by a failed one, and a job enqueued
// and completed with the caller's keys each have their event.
func TestEventsOfBatchesChainsAndCallersTransactions(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := f.ctx
	require.NoError(t, f.q.EnableEvents(ctx))
	_, ids, err := f.q.EnqueueBatch(ctx, []JobSpec{{Type: "part"}, {Type: "part"}}, JobSpec{Type: "whole"}, &BatchOpts{ID: "b1"})
	require.NoError(t, err)
	for range ids {
		c, err := f.q.Claim(ctx, "w")
		require.NoError(t, err)
		_, err = f.q.Complete(ctx, c, nil)
		require.NoError(t, err)
	}
	steps3, err := f.q.EnqueueChain(ctx, []JobSpec{{Type: "s1", Opts: &EnqueueOpts{MaxAttempts: 1}}, {Type: "s2"}, {Type: "s3"}}, nil)
	require.NoError(t, err)
	c, err := f.q.Claim(ctx, "w")
	require.NoError(t, err)
	if c.ID == "b1" { // the callback, due first
		_, err = f.q.Complete(ctx, c, nil)
		require.NoError(t, err)
		c, err = f.q.Claim(ctx, "w")
		require.NoError(t, err)
	}
	require.Equal(t, steps3[0], c.ID)
	_, err = f.q.Fail(ctx, c, errors.New("boom"))
	require.NoError(t, err)
	key := TxKey{Key: "orders-" + f.q.ks.prefix, Type: KeyHash}
	tj, err := f.q.EnqueueTx(ctx, "confirm", nil, &EnqueueOpts{ID: "tx1"}, []TxKey{key}, func(tx *Tx) error {
		tx.HSet(key.Key, "o1", "confirming")
		return nil
	})
	require.NoError(t, err)

	evs, _ := readEvents(t, f.q, "")
	got := map[string][]step{}
	for _, e := range evs[1:] {
		got[e.Job] = append(got[e.Job], step{e.Kind, e.Job, e.From, e.To, e.Attempt, e.Worker})
	}
	for _, id := range ids {
		require.Equal(t, []State{0, StatePending, StateActive}, fromStates(got[id]), id)
	}
	require.Equal(t, step{EventTransition, "b1", 0, StatePending, 0, ""}, got["b1"][0], "the callback, written by the last job's EXEC")
	require.Equal(t, step{EventTransition, steps3[0], StateActive, StateFailed, 1, "w"}, got[steps3[0]][2])
	for _, id := range steps3[1:] {
		require.Equal(t, []step{{EventTransition, id, 0, StateCanceled, 0, ""}}, got[id], "a step ended by the failed one, in its EXEC")
	}
	require.Equal(t, []step{{EventTransition, tj.ID, 0, StatePending, 0, ""}}, got[tj.ID])
	m := f.q.Metrics()
	require.EqualValues(t, len(evs)-1, m.EventsAppended, "every transition's event, counted once (not the 'events on' entry)")
	require.EqualValues(t, 1+len(steps3)-1, m.BatchCallbacks, "the batch's callback and the chain's two later steps")
}

func fromStates(s []step) []State {
	out := make([]State, len(s))
	for i, x := range s {
		out[i] = x.from
	}
	return out
}

// Every write path the library has, with events on from the start: each
// job in Redis has events, the last of which says the state it is in,
// and each chains up from its enqueue through every run its History
// records. A path that wrote a job without its event leaves a job with
// none, or a chain that skips a state.
func TestEventsOfEveryWritePathChainUpToEveryJob(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 3})
	ctx, q := f.ctx, f.q
	require.NoError(t, q.EnableEvents(ctx))
	enq := func(id, typ string, o *EnqueueOpts) *Job {
		t.Helper()
		if o == nil {
			o = &EnqueueOpts{}
		}
		o.ID = id
		j, err := q.Enqueue(ctx, typ, nil, o)
		require.NoError(t, err)
		return j
	}
	claim := func(id string) *Job {
		t.Helper()
		c, err := q.Claim(ctx, "w-"+id)
		require.NoError(t, err)
		require.Equal(t, id, c.ID, "only %s is due", id)
		return c
	}
	// EnqueueMany, then a claim and Complete, Fail, Release, ReleaseAfter,
	// Snooze and RetryAfter, and Cancel of a run, one job at a time.
	_, err := q.EnqueueMany(ctx, []JobSpec{{Type: "m", Opts: &EnqueueOpts{ID: "m1", Delay: time.Hour}}, {Type: "m", Opts: &EnqueueOpts{ID: "m2", Delay: time.Hour}}})
	require.NoError(t, err)
	enq("complete", "t", nil)
	_, err = q.Complete(ctx, claim("complete"), nil)
	require.NoError(t, err)
	enq("fail", "t", &EnqueueOpts{MaxAttempts: 1})
	_, err = q.Fail(ctx, claim("fail"), errors.New("x"))
	require.NoError(t, err)
	enq("release", "t", nil)
	_, err = q.Release(ctx, claim("release"))
	require.NoError(t, err)
	_, err = q.ReleaseAfter(ctx, claim("release"), time.Hour)
	require.NoError(t, err)
	enq("snooze", "t", nil)
	_, err = q.Fail(ctx, claim("snooze"), Snooze(time.Hour))
	require.NoError(t, err)
	enq("after", "t", nil)
	_, err = q.Fail(ctx, claim("after"), RetryAfter(time.Hour, errors.New("busy")))
	require.NoError(t, err)
	enq("cancelrun", "t", nil)
	claim("cancelrun")
	_, err = q.Cancel(ctx, "cancelrun")
	require.NoError(t, err)
	// ClaimMany and CompleteMany; a lease that ran out, taken over.
	enq("many1", "t", nil)
	enq("many2", "t", nil)
	cs, err := q.ClaimMany(ctx, "wm", 2)
	require.NoError(t, err)
	require.Len(t, cs, 2)
	_, err = q.CompleteMany(ctx, cs, nil)
	require.NoError(t, err)
	enq("lapsed", "t", nil)
	paused := claim("lapsed")
	f.clock.Advance(time.Hour - time.Minute)
	claim("lapsed")
	// The process paused past its lease writes nothing, and no event.
	_, err = q.Complete(ctx, paused, nil)
	require.ErrorIs(t, err, ErrLeaseLost)
	// Replace a finished job; UniqueBy; Retry, RetryFailed, Update.
	enq("complete", "t2", &EnqueueOpts{IfExists: IfExistsReplaceFinished, Delay: time.Hour})
	u, err := q.Enqueue(ctx, "u", []byte("same"), &EnqueueOpts{UniqueBy: &UniqueBy{}, Delay: time.Hour})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "u", []byte("same"), &EnqueueOpts{UniqueBy: &UniqueBy{}, IfExists: IfExistsKeep})
	require.NoError(t, err)
	_, err = q.Retry(ctx, "fail")
	require.NoError(t, err)
	_, err = q.Cancel(ctx, "fail")
	require.NoError(t, err)
	_, err = q.Update(ctx, u.ID, func(j *Job) error { j.Meta = map[string]string{"k": "v"}; return nil })
	require.NoError(t, err)
	// The bulk actions, Delete and DeleteIn.
	enq("bulkfail", "bf", &EnqueueOpts{MaxAttempts: 1})
	_, err = q.Fail(ctx, claim("bulkfail"), errors.New("x"))
	require.NoError(t, err)
	_, err = q.RetryFailed(ctx, "bf")
	require.NoError(t, err)
	_, err = q.CancelPending(ctx, "m")
	require.NoError(t, err)
	_, err = q.DeleteFinished(ctx, StateCanceled, "m")
	require.NoError(t, err)
	require.NoError(t, q.Delete(ctx, "many1"))
	require.NoError(t, q.DeleteIn(ctx, "many2", StateSucceeded))
	// The caller's transaction: EnqueueTx, and CompleteTx.
	key := TxKey{Key: "orders-" + q.ks.prefix, Type: KeyHash}
	_, err = q.EnqueueTx(ctx, "tx", nil, &EnqueueOpts{ID: "tx"}, []TxKey{key}, func(tx *Tx) error { tx.HSet(key.Key, "o", "1"); return nil })
	require.NoError(t, err)
	c, err := q.Claim(ctx, "wtx")
	require.NoError(t, err)
	_, err = q.CompleteTx(ctx, c, nil, []TxKey{key}, func(tx *Tx) error { tx.HSet(key.Key, "o", "2"); return nil })
	require.NoError(t, err)
	// Verify's repair and Trim write no job: they have no events.
	_, err = q.Verify(ctx, &VerifyOpts{Fix: true, Keys: true})
	require.NoError(t, err)
	_, err = q.Trim(ctx)
	require.NoError(t, err)

	evs, _ := readEvents(t, q, "")
	checkEventChains(t, q, evs, true)
	last := map[string]State{}
	for _, e := range evs {
		if e.Kind == EventTransition {
			last[e.Job] = e.To
		}
	}
	for _, s := range []State{StatePending, StateActive, StateSucceeded, StateFailed, StateCanceled} {
		page, err := q.List(ctx, ListOpts{State: s, Limit: 1000})
		require.NoError(t, err)
		require.Empty(t, page.Unreadable)
		for _, j := range page.Jobs {
			got, ok := last[j.ID]
			require.True(t, ok, "%s (%s) has no event", j.ID, s)
			require.Equal(t, s, got, "%s: its last event says where it is", j.ID)
		}
	}
}

// An EnableEvents that could not turn one shard on says which, with the
// key's type error, and turns the others on: their transitions have
// events, the failed shard's have none; a second EnableEvents, once the
// key is right, finishes it.
func TestEnableEventsPartlyDoneNamesTheShardsLeft(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 3})
	ctx, q := f.ctx, f.q
	flag := q.ks.eventsKey(1)
	require.NoError(t, f.rdb.HSet(ctx, flag, "x", "y").Err())
	err := q.EnableEvents(ctx)
	var se *ShardsError
	require.ErrorAs(t, err, &se)
	require.Equal(t, []int{1}, se.Shards)
	var wt *WrongTypeError
	require.ErrorAs(t, err, &wt)
	require.Equal(t, flag, wt.Key)
	for s := range 3 {
		n, err := f.rdb.Exists(ctx, q.ks.eventsKey(s)).Result()
		require.NoError(t, err)
		require.Equal(t, int64(1), n, "shard %d: on, or the hash left as it was", s)
	}
	n, err := f.rdb.Exists(ctx, q.ks.streamKey(1)).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the failed shard's stream was not written")
	require.NoError(t, f.rdb.Del(ctx, flag).Err())
	require.NoError(t, q.EnableEvents(ctx))
	evs, _ := readEvents(t, q, "")
	require.Equal(t, []EventKind{EventEnabled, EventEnabled, EventEnabled}, kinds(evs), "each shard's once")
}

// Work under lost EXEC replies and reset connections, events on: every
// run, retry, takeover and batch callback has its event once, and every
// job's events chain up to its state. A retry that wrote an event again,
// or a write that landed without one, breaks a chain.
func TestEventsOfWorkUnderLostRepliesChainUpToEveryJob(t *testing.T) {
	t.Parallel()
	q, direct, proxy := lostRepliesPair(t, "ev-work-lost")
	ctx := context.Background()
	const jobs = 40
	for i := range jobs {
		_, err := direct.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprint("j", i), MaxAttempts: 5})
		require.NoError(t, err)
	}
	_, _, err := direct.EnqueueBatch(ctx, []JobSpec{{Type: "t"}, {Type: "t"}, {Type: "t"}}, JobSpec{Type: "t"}, &BatchOpts{ID: "cb"})
	require.NoError(t, err)
	var runs atomic.Int64
	proxy.Set(faultproxy.Faults{ExecCutProb: 0.2, ResetProb: 0.002})
	stop := startWork(t, q, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
		if runs.Add(1)%4 == 0 && j.Attempt == 1 {
			return nil, errors.New("once more")
		}
		return nil, nil
	}), &WorkOpts{Concurrency: 4, PollInterval: 20 * time.Millisecond})
	waitForIn(t, 60*time.Second, "every job done", func() bool {
		st, err := direct.Stats(ctx)
		require.NoError(t, err)
		// A job that failed for good never succeeds: said at once, with
		// the counts, rather than as a timeout a minute later.
		require.Zero(t, st.Failed, "a job spent its 5 attempts: %+v", st)
		return st.Succeeded >= jobs+4 && st.Pending == 0 && st.Active == 0
	})
	proxy.Set(faultproxy.Faults{})
	stop()
	require.NotZero(t, proxy.Counts().ExecCuts)
	evs, _ := readEvents(t, direct, "")
	checkEventChains(t, direct, evs, true)
	enqueues := map[string]int{}
	for _, e := range evs {
		if e.Kind == EventTransition && e.From == 0 {
			enqueues[e.Job]++
		}
	}
	require.Len(t, enqueues, jobs+4)
	for id, n := range enqueues {
		require.Equal(t, 1, n, "%s enqueued once", id)
	}
}

// On a cluster, with the events toggled by another process (whose flags
// the writers learn only from their own reads under WATCH), every job's
// events still chain up while its shard was on.
func TestEventsToggledByAnotherProcessOnAClusterNeverDisagreeWithJobs(t *testing.T) {
	t.Parallel()
	cl := redistest.SharedCluster(t)
	prefix := redistest.Prefix(t)
	cfg := Config{Shards: 3, Backoff: func(int) time.Duration { return 0 }, Logger: quietLog()}
	q := queueOn(t, cl.Client(t, nil), prefix, cfg)
	toggler := queueOn(t, cl.Client(t, nil), prefix, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 30 {
		_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprint("j", i), MaxAttempts: 1000})
		require.NoError(t, err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Go(func() {
			for !stop.Load() {
				c, err := q.Claim(ctx, fmt.Sprint("w", w))
				if errors.Is(err, ErrNoJob) || errors.Is(err, ErrConflict) {
					continue
				}
				require.NoError(t, err)
				if rand.IntN(2) == 0 {
					_, err = q.Release(ctx, c)
				} else {
					_, err = q.Fail(ctx, c, errors.New("again"))
				}
				require.NoError(t, err)
			}
		})
	}
	for i := range 20 {
		if i%2 == 0 {
			require.NoError(t, toggler.EnableEvents(ctx))
		} else {
			require.NoError(t, toggler.DisableEvents(ctx))
		}
		time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
	}
	require.NoError(t, toggler.EnableEvents(ctx))
	time.Sleep(100 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	evs, _ := readEvents(t, toggler, "")
	checkEventChains(t, toggler, evs, false)
}

// With events on, a key of another type in a shard's stream's place
// refuses the transition whole, before MULTI, with a *WrongTypeError,
// in a process that has seen the events on and in one that has not
// (which checks the stream once it reads the flag): the job is not
// written without its event.
func TestEventsOnAStreamOfAnotherTypeRefuseTheWriteWhole(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := f.ctx
	require.NoError(t, f.q.EnableEvents(ctx))
	stream := f.q.ks.streamKey(0)
	require.NoError(t, f.rdb.Del(ctx, stream).Err())
	require.NoError(t, f.rdb.HSet(ctx, stream, "not", "a stream").Err())
	for name, q := range map[string]*Queue{"seen": f.q, "fresh": f.twin(t)} {
		_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "x-" + name})
		var wt *WrongTypeError
		require.ErrorAs(t, err, &wt, name)
		require.Equal(t, stream, wt.Key, name)
		_, err = f.q.Get(ctx, "x-"+name)
		require.ErrorIs(t, err, ErrNotFound, "%s: nothing written", name)
	}
}

// A chain run to its end: each step is written, with its enqueue event,
// by the EXEC that completes the step before it, and every step's events
// chain up to its state.
func TestEventsOfAChainRunToItsEnd(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 3})
	ctx := f.ctx
	require.NoError(t, f.q.EnableEvents(ctx))
	ids, err := f.q.EnqueueChain(ctx, []JobSpec{{Type: "s1"}, {Type: "s2"}, {Type: "s3"}}, nil)
	require.NoError(t, err)
	for _, id := range ids {
		c, err := f.q.Claim(ctx, "w")
		require.NoError(t, err)
		require.Equal(t, id, c.ID)
		_, err = f.q.Complete(ctx, c, nil)
		require.NoError(t, err)
	}
	evs, _ := readEvents(t, f.q, "")
	checkEventChains(t, f.q, evs, true)
	got := map[string][]State{}
	for _, e := range evs {
		if e.Kind == EventTransition {
			got[e.Job] = append(got[e.Job], e.To)
		}
	}
	for _, id := range ids {
		require.Equal(t, []State{StatePending, StateActive, StateSucceeded}, got[id], id)
	}
}

// Processes whose clocks disagree write events by Redis's clock: each
// event's time is its job's UpdatedAt, Redis's now, not the writer's, and
// a shard's events are in the order of their times.
func TestEventsOfSkewedProcessesAreTimedByRedis(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	ahead := skewedQueue(t, prefix, time.Hour, Config{})
	behind := skewedQueue(t, prefix, -time.Hour, Config{})
	require.NoError(t, ahead.EnableEvents(ctx))
	server, err := redistest.Client(t, nil).Time(ctx).Result()
	require.NoError(t, err)
	j, err := ahead.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "j"})
	require.NoError(t, err)
	c, err := behind.Claim(ctx, "behind")
	require.NoError(t, err)
	done, err := ahead.Complete(ctx, c, nil)
	require.NoError(t, err)

	evs, _ := readEvents(t, behind, "")
	require.Len(t, evs, 4)
	for i, want := range []time.Time{j.UpdatedAt, c.UpdatedAt, done.UpdatedAt} {
		e := evs[1+i]
		require.True(t, e.At.Equal(want), "event %d at %v, its job's write at %v", i, e.At, want)
		require.WithinDuration(t, server, e.At, 5*time.Second, "Redis's clock, not the writer's")
		require.False(t, e.At.Before(evs[i].At), "in order of time")
	}
}
