package jobkey

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/faultproxy"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// The derivation is part of the format: the same inputs give the same ID
// in every process and every later version (a change needs a new tag).
func TestUniqueIDIsStableAcrossVersions(t *testing.T) {
	t.Parallel()
	id, err := UniqueID("email", []byte("hello"), UniqueBy{}, time.Time{})
	require.NoError(t, err)
	require.Equal(t, "u-284244d9863b0130669912321d80db54", id)
	at := time.Date(2026, 12, 2, 10, 30, 0, 0, time.UTC)
	id, err = UniqueID("email", []byte("hello"), UniqueBy{Period: time.Hour}, at)
	require.NoError(t, err)
	require.Equal(t, "u-190c08479bbdbcf6875e389a521bc7c3", id)
	for _, same := range []time.Time{at.Truncate(time.Hour), at.Truncate(time.Hour).Add(time.Hour - time.Millisecond), at.In(time.FixedZone("x", 5*3600+1800))} {
		got, err := UniqueID("email", []byte("hello"), UniqueBy{Period: time.Hour}, same)
		require.NoError(t, err)
		require.Equal(t, id, got, "%v is in the same hour", same)
	}
	next, err := UniqueID("email", []byte("hello"), UniqueBy{Period: time.Hour}, at.Truncate(time.Hour).Add(time.Hour))
	require.NoError(t, err)
	require.NotEqual(t, id, next, "the next hour")
	other, err := UniqueID("email", []byte("hello"), UniqueBy{Period: 2 * time.Hour}, at)
	require.NoError(t, err)
	require.NotEqual(t, id, other, "another period length")
	// Parts are framed: moving a byte from the type to the payload is
	// another job.
	a, err := UniqueID("ab", []byte("c"), UniqueBy{}, time.Time{})
	require.NoError(t, err)
	b, err := UniqueID("a", []byte("bc"), UniqueBy{}, time.Time{})
	require.NoError(t, err)
	require.NotEqual(t, a, b)
	before, err := UniqueID("t", nil, UniqueBy{Period: time.Hour}, time.UnixMilli(-1))
	require.NoError(t, err)
	epoch, err := UniqueID("t", nil, UniqueBy{Period: time.Hour}, time.UnixMilli(0))
	require.NoError(t, err)
	require.NotEqual(t, before, epoch, "the hour before the epoch is its own")
	_, err = UniqueID("t", nil, UniqueBy{Period: time.Microsecond}, at)
	require.ErrorIs(t, err, ErrInvalid)
	for _, bad := range [][]byte{[]byte("not msgpack \xc1"), {0x05}, {0x80, 0x80}, nil} {
		_, err = UniqueID("t", bad, UniqueBy{Fields: []string{"a"}}, at)
		require.ErrorIs(t, err, ErrInvalid, "%x", bad)
	}
}

type uniqueArgs struct {
	Customer string         `msgpack:"customer"`
	Event    int64          `msgpack:"event"`
	Request  string         `msgpack:"request"`
	Tags     map[string]int `msgpack:"tags"`
}

func (uniqueArgs) Kind() string { return "deliver" }

// The same fields in another order, of other integer sizes.
type uniqueArgsReordered struct {
	Tags     map[string]int8 `msgpack:"tags"`
	Event    int8            `msgpack:"event"`
	Customer string          `msgpack:"customer"`
}

func (uniqueArgsReordered) Kind() string { return "deliver" }

// Typed arguments are hashed in a canonical encoding: field order, map
// order and integer sizes do not count, and fields left out of
// UniqueBy.Fields do not either.
func TestUniqueArgsIDIsCanonical(t *testing.T) {
	t.Parallel()
	tags := map[string]int{}
	for i := range 20 {
		tags[fmt.Sprint("t", i)] = i
	}
	a := uniqueArgs{Customer: "c1", Event: 7, Request: "r1", Tags: tags}
	by := UniqueBy{Fields: []string{"customer", "event", "tags"}}
	want, err := UniqueArgsID(a, by, time.Time{})
	require.NoError(t, err)
	for range 5 { // map iteration order differs run to run
		tags8 := map[string]int8{}
		for k, v := range tags {
			tags8[k] = int8(v)
		}
		got, err := UniqueArgsID(uniqueArgsReordered{Customer: "c1", Event: 7, Tags: tags8}, by, time.Time{})
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	a.Request = "r2"
	got, err := UniqueArgsID(a, by, time.Time{})
	require.NoError(t, err)
	require.Equal(t, want, got, "Request is not a field that counts")
	a.Event = 8
	got, err = UniqueArgsID(a, by, time.Time{})
	require.NoError(t, err)
	require.NotEqual(t, want, got)
	// Enqueue of the args' bytes with Fields derives the same ID.
	a.Event = 7
	payload, err := msgpack.Marshal(a)
	require.NoError(t, err)
	raw, err := UniqueID("deliver", payload, by, time.Time{})
	require.NoError(t, err)
	require.Equal(t, want, raw)
}

func TestIfExistsDecidesByState(t *testing.T) {
	t.Parallel()
	R, K, P := conflictRefuse, conflictKeep, conflictReplace
	want := map[IfExists][5]conflict{ // pending, active, succeeded, failed, canceled
		IfExistsRefuse:          {R, R, R, R, R},
		IfExistsKeep:            {K, K, K, K, K},
		IfExistsReplaceFinished: {K, K, P, P, P},
		IfExistsReplace:         {P, R, P, P, P},
	}
	for p, row := range want {
		for s := StatePending; s <= StateCanceled; s++ {
			require.Equal(t, row[s-1], p.on(s), "%s on %s", p, s)
		}
		require.NotEqual(t, conflictReplace, p.on(State(9)), "an unknown state is never written over")
		back, err := ParseIfExists(p.String())
		require.NoError(t, err)
		require.Equal(t, p, back)
	}
	_, err := ParseIfExists("overwrite")
	require.ErrorIs(t, err, ErrInvalid)
}

func TestEnqueueIfExistsKeepReturnsTheStoredJob(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	first, err := f.q.Enqueue(f.ctx, "t", []byte("a"), &EnqueueOpts{ID: "x"})
	require.NoError(t, err)
	_, err = f.q.Enqueue(f.ctx, "t", []byte("b"), &EnqueueOpts{ID: "x"})
	require.ErrorIs(t, err, ErrJobExists, "refused by default")
	for _, p := range []IfExists{IfExistsKeep, IfExistsReplaceFinished} {
		got, err := f.q.Enqueue(f.ctx, "t", []byte("b"), &EnqueueOpts{ID: "x", IfExists: p})
		require.NoError(t, err, p)
		require.Equal(t, []byte("a"), got.Payload, p)
		require.Equal(t, first.Rev, got.Rev, "%s wrote nothing", p)
	}
	jobs, err := f.q.EnqueueMany(f.ctx, []JobSpec{{Type: "t", Opts: &EnqueueOpts{ID: "x", IfExists: IfExistsKeep}}, {Type: "t", Opts: &EnqueueOpts{ID: "y", IfExists: IfExistsKeep}}})
	require.NoError(t, err, "a job kept is no error of the batch")
	require.Equal(t, []byte("a"), jobs[0].Payload)
	require.Equal(t, "y", jobs[1].ID)
}

func TestEnqueueReplaceFinishedStartsANewRun(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", []byte("a"), &EnqueueOpts{ID: "x"})
	require.NoError(t, err)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	done, err := f.q.Complete(f.ctx, c, []byte("result"))
	require.NoError(t, err)
	_, err = f.q.Enqueue(f.ctx, "t", []byte("b"), &EnqueueOpts{ID: "x"})
	require.ErrorIs(t, err, ErrJobExists, "the ID is taken for the job's retention by default")
	f.clock.Advance(time.Second)
	again, err := f.q.Enqueue(f.ctx, "t2", []byte("b"), &EnqueueOpts{ID: "x", IfExists: IfExistsReplaceFinished, Priority: 3})
	require.NoError(t, err)
	require.Equal(t, StatePending, again.State)
	require.Equal(t, "t2", again.Type)
	require.Equal(t, []byte("b"), again.Payload)
	require.Equal(t, 3, again.Priority)
	require.Zero(t, again.Attempt)
	require.Nil(t, again.Result)
	require.Equal(t, f.clock.Now(), again.CreatedAt)
	require.Equal(t, done.Rev+1, again.Rev)
	require.Equal(t, done.LeaseToken, again.LeaseToken, "the last run's lease is kept")
	f.requireIndexed(t, again)
	ttl, err := f.rdb.PTTL(f.ctx, f.q.ks.jobKey(0, "x")).Result()
	require.NoError(t, err)
	require.Less(t, ttl, time.Duration(0), "a pending job does not expire")
	got, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, "x", got.ID)
	require.Equal(t, 1, got.Attempt)
	require.NotEqual(t, j.LeaseToken, got.LeaseToken)
	verifyClean(t, f, "after a replace")
}

func TestEnqueueReplaceDebouncesAPendingJob(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	_, err := f.q.Enqueue(f.ctx, "t", []byte("a"), &EnqueueOpts{ID: "x", Delay: time.Minute})
	require.NoError(t, err)
	f.clock.Advance(50 * time.Second)
	j, err := f.q.Enqueue(f.ctx, "t", []byte("b"), &EnqueueOpts{ID: "x", Delay: time.Minute, IfExists: IfExistsReplace})
	require.NoError(t, err)
	require.Equal(t, []byte("b"), j.Payload)
	require.Equal(t, f.clock.Now().Add(time.Minute), j.RunAt, "the run is pushed back")
	f.requireIndexed(t, j)
	f.clock.Advance(50 * time.Second)
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob, "not due at the first enqueue's RunAt")
	f.clock.Advance(10 * time.Second)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, []byte("b"), c.Payload)
	_, err = f.q.Enqueue(f.ctx, "t", []byte("c"), &EnqueueOpts{ID: "x", IfExists: IfExistsReplace})
	var je *JobExistsError
	require.ErrorAs(t, err, &je, "an active job is never replaced")
	require.Equal(t, StateActive, je.Job.State)
	// Within a batch the last enqueue of an ID wins.
	jobs, err := f.q.EnqueueMany(f.ctx, []JobSpec{
		{Type: "t", Payload: []byte("1"), Opts: &EnqueueOpts{ID: "y", IfExists: IfExistsReplace}},
		{Type: "t", Payload: []byte("2"), Opts: &EnqueueOpts{ID: "y", IfExists: IfExistsReplace}},
	})
	require.NoError(t, err)
	require.Equal(t, []byte("2"), jobs[1].Payload)
	stored, err := f.q.Get(f.ctx, "y")
	require.NoError(t, err)
	require.Equal(t, []byte("2"), stored.Payload)
	verifyClean(t, f, "after a debounce")
}

// A job canceled while it ran keeps its last run's lease: the job that
// replaces it is not claimable before that lease ends, so it never runs
// beside the handler that may still be stopping.
func TestReplacedJobWaitsForItsLastRunsLease(t *testing.T) {
	t.Parallel()
	for _, p := range []IfExists{IfExistsReplaceFinished, IfExistsReplace} {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			f := setup(t, &Config{Lease: time.Minute})
			_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "x"})
			require.NoError(t, err)
			c, err := f.q.Claim(f.ctx, "w")
			require.NoError(t, err)
			_, err = f.q.Cancel(f.ctx, "x")
			require.NoError(t, err)
			if p == IfExistsReplace { // a pending job whose last run may go on
				_, err = f.q.Retry(f.ctx, "x")
				require.NoError(t, err)
			}
			j, err := f.q.Enqueue(f.ctx, "t", []byte("new"), &EnqueueOpts{ID: "x", IfExists: p})
			require.NoError(t, err)
			require.Equal(t, c.LeaseUntil, j.RunAt, "due when the canceled run's lease ends")
			require.Equal(t, c.LeaseUntil, j.LeaseUntil)
			f.requireIndexed(t, j)
			f.clock.Advance(time.Minute - time.Millisecond)
			_, err = f.q.Claim(f.ctx, "w")
			require.ErrorIs(t, err, ErrNoJob, "the canceled run's lease still holds")
			f.clock.Advance(time.Millisecond)
			got, err := f.q.Claim(f.ctx, "w")
			require.NoError(t, err)
			require.Equal(t, []byte("new"), got.Payload)
		})
	}
}

// A keyed pending job listed as waiting for its key leaves the listing
// when it is replaced, and the key's value stays true to its jobs.
func TestEnqueueReplaceOfAWaitingKeyedJob(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: time.Minute, ClaimWindow: 1})
	ca, b := claimWithWaiterBehind(t, f)
	j, err := f.q.Enqueue(f.ctx, "t", []byte("b2"), &EnqueueOpts{ID: b.ID, ConcurrencyKey: "k", IfExists: IfExistsReplace})
	require.NoError(t, err)
	require.Equal(t, []byte("b2"), j.Payload)
	info, err := f.q.Concurrency(f.ctx, "k")
	require.NoError(t, err)
	require.Zero(t, info.Waiting, "the replaced job's listing went")
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob, "the new job waits for a's slot too")
	_, err = f.q.Complete(f.ctx, ca, nil)
	require.NoError(t, err)
	got, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, []byte("b2"), got.Payload)
	verifyClean(t, f, "after replacing a waiting keyed job")
}

// A claim that found a job's key full moved its entry past its RunAt
// (park). A replace takes the job off the waiting list, so its entry goes
// back to the new job's RunAt even when that RunAt is the one stored (a
// fixed RunAt, or the same millisecond): the job is due then, and a claim
// lists it again if its key is still full, or takes it when it has no key.
func TestEnqueueReplaceOfAParkedJobIsDueAtItsRunAt(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"", "k"} {
		t.Run("key "+strconv.Quote(key), func(t *testing.T) {
			t.Parallel()
			f := setup(t, &Config{Lease: time.Minute, ClaimWindow: 1})
			ca, b := claimWithWaiterBehind(t, f)
			j, err := f.q.Enqueue(f.ctx, "t", []byte("b2"), &EnqueueOpts{ID: b.ID, RunAt: b.RunAt, ConcurrencyKey: key, IfExists: IfExistsReplace})
			require.NoError(t, err)
			require.Equal(t, b.RunAt, j.RunAt)
			f.requireIndexed(t, j)
			st, err := f.q.Stats(f.ctx)
			require.NoError(t, err)
			require.EqualValues(t, 1, st.Due, "the replaced job is due at its RunAt")
			got, err := f.q.Claim(f.ctx, "w")
			if key == "" {
				require.NoError(t, err, "with no key, nothing holds it back")
				require.Equal(t, []byte("b2"), got.Payload)
				_, err = f.q.Complete(f.ctx, got, nil)
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, ErrNoJob, "its key is still full")
				info, err := f.q.Concurrency(f.ctx, key)
				require.NoError(t, err)
				require.Equal(t, 1, info.Waiting, "the claim listed it again")
			}
			_, err = f.q.Complete(f.ctx, ca, nil)
			require.NoError(t, err)
			verifyClean(t, f, "after replacing a parked job")
		})
	}
}

// UniqueBy derives the ID in the enqueue: once per period, from the
// fields that count, in the concurrency key's shard.
func TestEnqueueUniqueByDerivesTheID(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	by := &UniqueBy{Fields: []string{"customer", "event"}, Period: time.Hour}
	a := uniqueArgs{Customer: "c1", Event: 1, Request: "r1"}
	j, err := EnqueueArgs(f.ctx, f.q, a, &EnqueueOpts{UniqueBy: by, ConcurrencyKey: "c1"})
	require.NoError(t, err)
	base, err := UniqueArgsID(a, *by, f.clock.Now())
	require.NoError(t, err)
	want, err := f.q.IDFor("c1", base)
	require.NoError(t, err)
	require.Equal(t, want, j.ID)
	a.Request = "r2"
	again, err := EnqueueArgs(f.ctx, f.q, a, &EnqueueOpts{UniqueBy: by, ConcurrencyKey: "c1", IfExists: IfExistsKeep})
	require.NoError(t, err)
	require.Equal(t, j.ID, again.ID)
	require.Equal(t, j.Payload, again.Payload, "kept: the first request's job")
	// A typed batch: the same work twice, and the job stored, meet under
	// the one ID; the batch's repeat is decided on the job then stored.
	many, err := EnqueueArgsMany(f.ctx, f.q, []ArgsSpec[uniqueArgs]{
		{Args: uniqueArgs{Customer: "c1", Event: 1, Request: "r3"}, Opts: &EnqueueOpts{UniqueBy: by, ConcurrencyKey: "c1", IfExists: IfExistsKeep}},
		{Args: uniqueArgs{Customer: "c1", Event: 2, Request: "r4"}, Opts: &EnqueueOpts{UniqueBy: by, ConcurrencyKey: "c1", IfExists: IfExistsKeep}},
		{Args: uniqueArgs{Customer: "c1", Event: 2, Request: "r5"}, Opts: &EnqueueOpts{UniqueBy: by, ConcurrencyKey: "c1", IfExists: IfExistsKeep}},
	})
	require.NoError(t, err)
	require.Equal(t, j.ID, many[0].ID)
	require.Equal(t, j.Payload, many[0].Payload, "kept")
	require.Equal(t, many[1].ID, many[2].ID)
	require.NotEqual(t, j.ID, many[1].ID)
	first, err := DecodeArgs[uniqueArgs](many[2])
	require.NoError(t, err)
	require.Equal(t, "r4", first.Request, "the repeat kept the batch's first")
	f.clock.Advance(time.Hour)
	next, err := EnqueueArgs(f.ctx, f.q, a, &EnqueueOpts{UniqueBy: by, ConcurrencyKey: "c1"})
	require.NoError(t, err)
	require.NotEqual(t, j.ID, next.ID, "the next hour's job")
	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{UniqueBy: by, ID: "x"})
	require.ErrorIs(t, err, ErrInvalid, "ID and UniqueBy both")
	_, err = f.q.Enqueue(f.ctx, "t", []byte("plain bytes"), &EnqueueOpts{UniqueBy: by})
	require.ErrorIs(t, err, ErrInvalid, "Fields of a payload that is not msgpack")
	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{IfExists: 9})
	require.ErrorIs(t, err, ErrInvalid)
	// A tick's ID and its refusal are its schedule's.
	for _, o := range []*EnqueueOpts{{UniqueBy: by}, {IfExists: IfExistsReplace}} {
		err = f.q.validPeriodic([]PeriodicJob{{Name: "p", Schedule: Every(time.Minute), Type: "t", Opts: o}}, f.clock.Now())
		require.ErrorIs(t, err, ErrInvalid)
	}
}

// An enqueue whose EXEC reply was lost, retried, is decided again on what
// it wrote: the job is there once, and still waits for the lease of the
// run it replaced.
func TestReplaceWithLostExecReplyKeepsTheLastRunRule(t *testing.T) {
	t.Parallel()
	cut, proxy := proxied(t)
	q := queueOn(t, cut, redistest.Prefix(t), Config{Lease: 10 * time.Second})
	ctx := context.Background()
	_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "x"})
	require.NoError(t, err)
	c, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	_, err = q.Cancel(ctx, "x")
	require.NoError(t, err)
	for _, p := range []IfExists{IfExistsReplaceFinished, IfExistsReplace} {
		proxy.Set(faultproxy.Faults{ExecCutProb: 1})
		_, err = q.Enqueue(ctx, "t", []byte("new"), &EnqueueOpts{ID: "x", IfExists: p})
		proxy.Set(faultproxy.Faults{})
		require.ErrorIs(t, err, ErrOutcomeUnknown, "%s: the reply was lost", p)
		require.NotZero(t, proxy.Counts().ExecCuts)
		stored, err := q.Get(ctx, "x")
		require.NoError(t, err)
		require.Equal(t, StatePending, stored.State, "%s: the EXEC landed", p)
		require.Equal(t, c.LeaseUntil, stored.RunAt, p)
		j, err := q.Enqueue(ctx, "t", []byte("new"), &EnqueueOpts{ID: "x", IfExists: p})
		require.NoError(t, err, "%s: the retry finds its own job", p)
		require.Equal(t, []byte("new"), j.Payload)
		require.False(t, j.RunAt.Before(c.LeaseUntil), "%s: the retry keeps the job waiting for the lease", p)
		_, err = q.Claim(ctx, "w")
		require.ErrorIs(t, err, ErrNoJob, "%s: nothing claimable while the canceled run's lease holds", p)
		_, err = q.Cancel(ctx, "x") // finished again for the next policy
		require.NoError(t, err)
	}
}

// Many producers enqueue one ID at once, replacing it as it finishes or
// while it waits, and an operator cancels it while it runs: its handler
// never runs beside another run of it, and the stored job stays sound.
func TestSameIDEnqueuedConcurrentlyNeverRunsTwiceAtOnce(t *testing.T) {
	t.Parallel()
	q := realQueue(t, &Config{Lease: time.Second, Logger: quietLog()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var running, overlaps, runs atomic.Int64
	h := HandlerFunc(func(hctx context.Context, j *Job) ([]byte, error) {
		if running.Add(1) > 1 {
			overlaps.Add(1)
		}
		runs.Add(1)
		// It stops slowly once canceled: still within its lease.
		select {
		case <-hctx.Done():
			time.Sleep(200 * time.Millisecond)
		case <-time.After(time.Duration(rand.IntN(30)) * time.Millisecond):
		}
		running.Add(-1)
		return nil, hctx.Err()
	})
	stop := startWork(t, q, h, &WorkOpts{Concurrency: 4, PollInterval: 20 * time.Millisecond})
	defer stop()
	deadline := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	var written atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			p := []IfExists{IfExistsReplaceFinished, IfExistsReplace, IfExistsKeep}[g%3]
			for n := 0; time.Now().Before(deadline); n++ {
				_, err := q.Enqueue(ctx, "t", fmt.Appendf(nil, "%d/%d", g, n), &EnqueueOpts{ID: "x", IfExists: p})
				if err != nil && !errors.Is(err, ErrJobExists) {
					require.NoError(t, err)
				}
				if err == nil {
					written.Add(1)
				}
				time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
			}
		})
	}
	wg.Go(func() {
		for time.Now().Before(deadline) {
			time.Sleep(time.Duration(50+rand.IntN(100)) * time.Millisecond)
			if _, err := q.Cancel(ctx, "x"); err != nil && !errors.Is(err, ErrState) && !errors.Is(err, ErrNotFound) {
				require.NoError(t, err)
			}
		}
	})
	wg.Wait()
	stop()
	t.Logf("%d runs, %d enqueues answered with a job", runs.Load(), written.Load())
	require.Zero(t, overlaps.Load(), "two runs of the job at once")
	require.Greater(t, runs.Load(), int64(1), "the job was replaced and ran again")
	_, err := q.Get(context.Background(), "x")
	require.NoError(t, err)
	rep, err := q.Verify(context.Background(), nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings)
}

// UniqueBy decodes the caller's payload to select its fields: any bytes
// give an ID or ErrInvalid, never a panic, and the same bytes the same ID.
func FuzzUniqueIDFields(f *testing.F) {
	for _, seed := range []any{
		map[string]any{"customer": "c1", "event": 7},
		map[string]any{"a": []any{1, "x", map[string]any{"n": nil}}, "b": 1.5},
		uniqueArgs{Customer: "c", Event: -1, Tags: map[string]int{"x": 1}},
		[]int{1, 2},
	} {
		b, err := msgpack.Marshal(seed)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add([]byte{0xdf, 0xff, 0xff, 0xff, 0xff}) // a map header that claims 4G entries
	f.Fuzz(func(t *testing.T, payload []byte) {
		by := UniqueBy{Fields: []string{"customer", "event", "a"}}
		id, err := UniqueID("t", payload, by, time.Time{})
		if err != nil {
			require.ErrorIs(t, err, ErrInvalid)
			return
		}
		again, err := UniqueID("t", payload, by, time.Time{})
		require.NoError(t, err)
		require.Equal(t, id, again)
		require.NoError(t, validID(id))
	})
}

// A replace is decided without Redis: the new job, its times from the
// read, the stored job's last-run lease kept, and not due before it ends.
func TestReplacingKeepsTheLastRunsLease(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	cur := &Job{ID: "x", State: StateCanceled, Attempt: 2, LastError: "boom", Result: []byte("r"),
		LeaseOwner: "w", LeaseUntil: now.Add(30 * time.Second), LeaseToken: 42}
	for _, c := range []struct {
		name string
		in   enqueueIn
		want time.Time
	}{
		{"due now", enqueueIn{}, cur.LeaseUntil},
		{"delayed past the lease", enqueueIn{delay: time.Minute}, now.Add(time.Minute)},
		{"RunAt fixed before the lease", enqueueIn{fixed: true, runAt: now.Add(-time.Hour)}, cur.LeaseUntil},
		{"RunAt fixed after it", enqueueIn{fixed: true, runAt: now.Add(time.Hour)}, now.Add(time.Hour)},
	} {
		in := c.in
		in.job = &Job{ID: "x", Type: "t", Payload: []byte("new"), State: StatePending, MaxAttempts: 3}
		j := replacing(&in, cur, now)
		require.Equal(t, c.want, j.RunAt, c.name)
		require.Equal(t, now, j.CreatedAt, c.name)
		require.Equal(t, StatePending, j.State, c.name)
		require.Zero(t, j.Attempt, c.name)
		require.Empty(t, j.LastError, c.name)
		require.Nil(t, j.Result, c.name)
		require.Equal(t, "w", j.LeaseOwner, c.name)
		require.Equal(t, cur.LeaseUntil, j.LeaseUntil, c.name)
		require.EqualValues(t, 42, j.LeaseToken, c.name)
		require.Same(t, in.job, j, c.name)
	}
}

// A replace keeps the old run's lease token (its lease is the last run's),
// but the job is new: the old run's holder sending its Fail or snooze again
// finds no write of its own there (no History, LastError or snooze of that
// run) and gets ErrLeaseLost, writing nothing. Before the replace, the
// same call is a retry after a lost reply and finds its own write.
func TestReplacedJobRefusesTheOldRunsRepeatedFailAndSnooze(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cause error
	}{
		{"fail", errors.New("x")},
		{"snooze", Snooze(0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, &Config{MaxSnoozes: 1})
			_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "x", MaxAttempts: 3})
			require.NoError(t, err)
			c, err := f.q.Claim(f.ctx, "w")
			require.NoError(t, err)
			ended, err := f.q.Fail(f.ctx, c, tc.cause)
			require.NoError(t, err)
			require.Equal(t, StatePending, ended.State)
			again, err := f.q.Fail(f.ctx, c, tc.cause)
			require.NoError(t, err, "a retry after a lost reply finds its own write")
			require.Equal(t, ended.Rev, again.Rev)

			j, err := f.q.Enqueue(f.ctx, "t", []byte("new"), &EnqueueOpts{ID: "x", IfExists: IfExistsReplace})
			require.NoError(t, err)
			require.Equal(t, c.LeaseToken, j.LeaseToken, "the last run's lease is kept")
			require.Zero(t, j.Snoozes)
			require.Empty(t, j.History)
			require.Empty(t, j.LastError)

			_, err = f.q.Fail(f.ctx, c, tc.cause)
			require.ErrorIs(t, err, ErrLeaseLost, "the old run's write is not the new job's")
			got, err := f.q.Get(f.ctx, "x")
			require.NoError(t, err)
			require.Equal(t, j.Rev, got.Rev, "nothing written")
			require.Equal(t, StatePending, got.State)
			require.Zero(t, got.Snoozes)
			require.Empty(t, got.History)
			f.requireIndexed(t, got)
		})
	}
}
