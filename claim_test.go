package jobkey

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A job whose ID sits in two indexes (a stray entry) is handed out once by
// one claim batch, and the stray entry is put right.
func TestClaimManyHandsOutEachJobOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "twice"})
	require.NoError(t, err)
	keys := f.q.Keys(j.ID)
	require.NoError(t, f.rdb.ZAdd(f.ctx, keys.Leased, redis.Z{Score: 1, Member: j.ID}).Err())

	got, err := f.q.ClaimMany(f.ctx, "w", 8)
	require.NoError(t, err)
	require.Len(t, got, 1, "one job, one claim")
	f.requireIndexed(t, got[0])
	_, err = f.q.ClaimMany(f.ctx, "w", 8)
	require.ErrorIs(t, err, ErrNoJob)
}

// The engine refuses a transaction that names one key twice: two decisions
// about one value in one EXEC would undo each other.
func TestCASRefusesRepeatedKey(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	key, _ := f.q.ks.jobKeyOf("k")
	f.hook.Reset()
	_, _, err := f.q.run(f.ctx, &casTxn{keys: []string{key, key}, decide: func(*casRead) (*casPlan, error) {
		t.Fatal("decided")
		return nil, nil
	}})
	require.ErrorContains(t, err, "twice")
	require.Zero(t, f.hook.RTT.Load(), "refused before any round trip")
}

// A pending job with no attempt left (MaxAttempts lowered below what it
// used) is failed by the claim that meets it, not run;
// Update refuses to lower MaxAttempts below the attempts made.
func TestClaimFailsPendingJobWithNoAttemptLeft(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{MaxAttempts: 5})
	require.NoError(t, err)
	for range 3 {
		c, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		_, err = f.q.Fail(f.ctx, c, fmt.Errorf("attempt %d", c.Attempt))
		require.NoError(t, err)
		f.clock.Advance(time.Hour)
	}
	_, err = f.q.Update(f.ctx, j.ID, func(j *Job) error { j.MaxAttempts = 2; return nil })
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "at least the 3 attempts made")
	_, err = f.q.Update(f.ctx, j.ID, func(j *Job) error { j.MaxAttempts = 3; return nil })
	require.NoError(t, err, "no attempt left is allowed")

	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob)
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, StateFailed, got.State)
	require.Equal(t, 3, got.Attempt)
	require.Contains(t, got.LastError, "no attempt left")
	f.requireIndexed(t, got)
}

// Dead jobs (expired leases on their last attempt) ahead of a runnable one
// are failed on the way, and the claim goes on to the runnable job instead
// of answering that nothing is due.
func TestClaimGoesPastDeadJobs(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	const dead = 200
	batch := make([]JobSpec, dead)
	for i := range batch {
		batch[i] = JobSpec{Type: "dead", Opts: &EnqueueOpts{MaxAttempts: 1}}
	}
	_, err := f.q.EnqueueMany(f.ctx, batch)
	require.NoError(t, err)
	for range dead / 50 {
		_, err := f.q.ClaimMany(f.ctx, "gone", 50) // and never heard from again
		require.NoError(t, err)
	}
	f.clock.Advance(time.Second)
	live, err := f.q.Enqueue(f.ctx, "live", nil, &EnqueueOpts{MaxAttempts: 2})
	require.NoError(t, err)
	_, err = f.q.Claim(f.ctx, "gone") // its lease ends after all the dead ones'
	require.NoError(t, err)
	f.clock.Advance(time.Minute) // every lease has run out

	got, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err, "a runnable job is due behind the dead ones")
	require.Equal(t, live.ID, got.ID)
	require.Equal(t, 2, got.Attempt)
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, dead, st.Failed, "the dead ones were failed on the way")
}

func TestExpiredLastAttemptFails(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{MaxAttempts: 1})
	require.NoError(t, err)
	_, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	f.clock.Advance(time.Minute)
	_, err = f.q.Claim(f.ctx, "w2")
	require.ErrorIs(t, err, ErrNoJob)
	got, err := f.q.Get(f.ctx, j.ID)
	require.NoError(t, err)
	require.Equal(t, StateFailed, got.State)
	require.Contains(t, got.LastError, "attempt 1/1")
	require.Contains(t, got.LastError, "expired")
	f.requireIndexed(t, got)
}

// A hint that disagrees with its value is put right by the claimer that
// finds it, in the same EXEC.
func TestClaimRepairsTamperedHints(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ready := f.q.ks.index(0, idxReady)
	now := toMillis(f.clock.Now())

	// A member whose job does not exist.
	require.NoError(t, f.rdb.ZAdd(f.ctx, ready, redis.Z{Score: float64(now), Member: "ghost"}).Err())
	// A job that is scheduled later, but whose entry says due.
	later, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "later", Delay: time.Hour})
	require.NoError(t, err)
	require.NoError(t, f.rdb.ZAdd(f.ctx, ready, redis.Z{Score: float64(now - 1000), Member: "later"}).Err())
	// A succeeded job whose ID was put back into ready.
	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "done", Delay: 2 * time.Hour})
	require.NoError(t, err)
	f.clock.Advance(2 * time.Hour)
	d, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	d, err = f.q.Complete(f.ctx, d, nil)
	require.NoError(t, err)
	require.NoError(t, f.rdb.ZAdd(f.ctx, ready, redis.Z{Score: float64(now), Member: "done"}).Err())
	f.clock.Advance(-2 * time.Hour)

	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob)
	_, err = f.rdb.ZScore(f.ctx, ready, "ghost").Result()
	require.ErrorIs(t, err, redis.Nil, "the entry without a job is gone")
	f.requireIndexed(t, later)
	f.requireIndexed(t, d)
}

func TestClaimManyCompleteMany(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2})
	batch := make([]JobSpec, 40)
	for i := range batch {
		batch[i] = JobSpec{Type: "t", Payload: []byte{byte(i)}}
	}
	_, err := f.q.EnqueueMany(f.ctx, batch)
	require.NoError(t, err)

	f.hook.Reset()
	got, err := f.q.ClaimMany(f.ctx, "w", 32)
	require.NoError(t, err)
	require.Len(t, got, 32)
	require.EqualValues(t, 3, f.hook.RTT.Load())
	for _, j := range got {
		require.Equal(t, StateActive, j.State)
		f.requireIndexed(t, j)
	}

	// One lease is lost before the batch completes: only that job fails.
	const victim = 5
	_, err = f.q.update(f.ctx, got[victim].ID, nil, func(cur *Job, _ time.Time) (*Job, error) {
		cur.Attempt++
		cur.LeaseOwner = "thief"
		cur.LeaseToken = newToken()
		return cur, nil
	}, "")
	require.NoError(t, err)
	results := make([][]byte, len(got))
	for i := range results {
		results[i] = []byte(fmt.Sprint(i))
	}
	f.hook.Reset()
	done, err := f.q.CompleteMany(f.ctx, got, results)
	errs := jobErrs(t, err, len(got))
	require.EqualValues(t, 2, f.hook.RTT.Load())
	for i, j := range got {
		if i == victim {
			require.ErrorIs(t, errs[i], ErrLeaseLost)
			continue
		}
		require.NoError(t, errs[i])
		require.Equal(t, StateSucceeded, done[i].State)
		require.Equal(t, results[i], done[i].Result)
		f.requireIndexed(t, j)
	}
	// Retried after a lost reply: no-op successes, nothing rewritten.
	again, err := f.q.CompleteMany(f.ctx, got, results)
	errs = jobErrs(t, err, len(got))
	for i := range got {
		if i != victim {
			require.NoError(t, errs[i])
			require.Equal(t, done[i].Rev, again[i].Rev)
		}
	}
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 31, st.Succeeded)
	require.EqualValues(t, 1, st.Active)
	require.EqualValues(t, 8, st.Pending)

	_, err = f.q.ClaimMany(f.ctx, "w", 0)
	require.Error(t, err)
	_, err = f.q.CompleteMany(f.ctx, []*Job{got[0], got[0]}, nil)
	require.ErrorContains(t, err, "appears twice")
}

// Unreadable values at job keys: Get reports them, Claim sets them aside
// without looping and without touching their bytes, the other jobs keep
// flowing, and Stats counts them.
func TestCorruptValuesAreSetAsideAndKept(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2})
	golden, err := os.ReadFile(filepath.Join("testdata", "job-v1.0.msgpack"))
	require.NoError(t, err)
	newer := bytes.Clone(golden)
	newer[3] = 2 // format major version 2
	bad := map[string][]byte{
		"truncated":   golden[:len(golden)/2],
		"array32":     binary.BigEndian.AppendUint32([]byte{0xdd}, 0xffffffff),
		"bin32":       append(bytes.Clone(golden[:7]), 0xa0, 0xa0, 0xc6, 0xff, 0xff, 0xff, 0xff),
		"garbage":     []byte("{\"json\": \"not msgpack\"}"),
		"empty":       {},
		"trailing":    append(bytes.Clone(golden), 0),
		"newerFormat": newer,
	}
	now := toMillis(f.clock.Now())
	for id, b := range bad {
		keys := f.q.Keys(id)
		require.NoError(t, f.rdb.Set(f.ctx, keys.Job, b, 0).Err())
		require.NoError(t, f.rdb.ZAdd(f.ctx, keys.Ready, redis.Z{Score: float64(now), Member: id}).Err())
	}
	listKeys := f.q.Keys("a-list") // a job key of another Redis type
	require.NoError(t, f.rdb.RPush(f.ctx, listKeys.Job, "x").Err())
	require.NoError(t, f.rdb.ZAdd(f.ctx, listKeys.Ready, redis.Z{Score: float64(now), Member: "a-list"}).Err())

	var good []string
	for i := range 5 {
		j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("good-%d", i)})
		require.NoError(t, err)
		good = append(good, j.ID)
	}

	for id := range bad {
		_, err := f.q.Get(f.ctx, id)
		if id == "newerFormat" {
			require.ErrorIs(t, err, ErrUnsupportedFormat, id)
		} else {
			require.ErrorIs(t, err, ErrCorrupt, id)
		}
	}
	_, err = f.q.Get(f.ctx, "a-list")
	require.ErrorIs(t, err, ErrWrongType)

	var claimed []string
	for {
		j, err := f.q.Claim(f.ctx, "w")
		if errors.Is(err, ErrNoJob) {
			break
		}
		require.NoError(t, err)
		claimed = append(claimed, j.ID)
		require.Less(t, len(claimed), 10, "claims must not loop")
	}
	sort.Strings(claimed)
	require.Equal(t, good, claimed, "the good jobs flowed")

	for id, b := range bad {
		got, err := f.rdb.Get(f.ctx, f.q.Keys(id).Job).Bytes()
		require.NoError(t, err)
		require.Equal(t, b, got, "%s: the bytes are kept untouched", id)
	}
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, len(bad), st.Corrupt, "the corrupt ones and the list, not the newer format")
	require.EqualValues(t, 1, st.Pending, "the newer-format job stays where newer workers will find it")
	require.EqualValues(t, 1, st.Newer, "and its sighting is counted")
	require.EqualValues(t, 5, st.Active)
	idx, _ := f.indexOf(t, "newerFormat")
	require.Equal(t, idxReady, idx)
}

// ClaimMany returns the jobs that an earlier round of the same call claimed
// (their EXEC committed), even when a later round fails. Dropped, they would
// be jobs active under the caller's name while the caller is told that
// nothing was claimed: nobody would run them, each would wait out a whole
// lease and spend its attempt, and with MaxAttempts 1 fail for good without
// ever having run.
func TestClaimManyKeepsJobsOfEarlierRounds(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	var reads atomic.Int32
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		// The second read of the due entries (round 2 of the same
		// ClaimMany) meets a network error, as a blip or an ending ctx
		// would make it.
		if has(cmds, "zrangebyscore", ":ready") && reads.Add(1) == 2 {
			return errors.New("injected: connection reset")
		}
		return nil
	}))
	const lease = 300 * time.Millisecond
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Lease: lease})
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{MaxAttempts: 1})
	require.NoError(t, err)

	// Two wanted, one due: round 1 claims j, round 2 looks for another.
	got, err := q.ClaimMany(ctx, "w", 2)
	stored, gerr := q.Get(ctx, j.ID)
	require.NoError(t, gerr)
	t.Logf("ClaimMany returned %d jobs, err %v; stored job: %s attempt %d owner %q",
		len(got), err, stored.State, stored.Attempt, stored.LeaseOwner)
	require.Equal(t, StateActive, stored.State, "precondition: round 1 committed its claim")

	// What the caller cannot see: once the lease runs out, the next claim
	// fails the job for good (its only attempt was spent), and it never ran.
	time.Sleep(lease + 50*time.Millisecond)
	_, cerr := q.Claim(ctx, "next")
	after, gerr := q.Get(ctx, j.ID)
	require.NoError(t, gerr)
	t.Logf("after the lease: Claim -> %v; job %s, LastError %q", cerr, after.State, after.LastError)

	require.NoError(t, err, "ClaimMany claimed %q (it is active under %q, attempt %d) but returned an error and no job",
		j.ID, stored.LeaseOwner, stored.Attempt)
	require.Len(t, got, 1)
}

// The same through group commit: concurrent Claim calls that share a flush
// go through claimBatch, and a caller whose job was claimed in round 1 gets
// that job, not round 2's error. In Work, that slot would otherwise log
// "claim failed" while the job sat leased to nobody until its lease ran out.
func TestGroupClaimKeepsJobsOfEarlierRounds(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	other := redistest.Client(t, nil)
	prefix := redistest.Prefix(t)
	const lease = 300 * time.Millisecond
	producer := queueOn(t, other, prefix, Config{Lease: lease})

	leaderIn := make(chan struct{})
	releaseLeader := make(chan struct{})
	var reads atomic.Int32
	var jobID atomic.Value
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		if !has(cmds, "zrangebyscore", ":ready") {
			return nil
		}
		switch reads.Add(1) {
		case 1: // the leader's claim, alone: hold it until two more queue up
			close(leaderIn)
			<-releaseLeader
		case 2: // the batch of two: one job becomes due just before its read
			j, err := producer.Enqueue(context.Background(), "t", nil, &EnqueueOpts{MaxAttempts: 1, RunAt: time.Now().Add(-time.Minute)}) // due by any estimate of the clock
			if err != nil {
				return err
			}
			jobID.Store(j.ID)
		case 3: // round 2 of that batch, for the caller still without a job
			return errors.New("injected: connection reset")
		}
		return nil
	}))
	q := queueOn(t, rdb, prefix, Config{Lease: lease})
	ctx := context.Background()

	type res struct {
		j   *Job
		err error
	}
	leader := make(chan res, 1)
	go func() { j, err := q.Claim(ctx, "leader"); leader <- res{j, err} }()
	<-leaderIn
	out := make(chan res, 2)
	for _, w := range []string{"a", "b"} {
		go func() { j, err := q.Claim(ctx, w); out <- res{j, err} }()
	}
	require.Eventually(t, func() bool { _, n := groupState(q.claims); return n == 2 }, 5*time.Second, time.Millisecond)
	close(releaseLeader)
	require.ErrorIs(t, (<-leader).err, ErrNoJob)
	r1, r2 := <-out, <-out
	id, _ := jobID.Load().(string)
	require.NotEmpty(t, id)
	stored, err := q.Get(ctx, id)
	require.NoError(t, err)
	t.Logf("callers: (%v, %v) and (%v, %v); stored job: %s owner %q", r1.j != nil, r1.err, r2.j != nil, r2.err, stored.State, stored.LeaseOwner)
	require.Equal(t, StateActive, stored.State)
	require.True(t, r1.j != nil || r2.j != nil,
		"job %q was claimed for %q, yet both callers were told nothing was claimed (%v / %v)", id, stored.LeaseOwner, r1.err, r2.err)
}

// A runnable job is claimed even behind more than maxSkip (1000) newer-major
// jobs in an index. The claimer's skip set must not start over when it
// fills: the read window (ClaimWindow + skip set size) would then never
// reach past them, however often Claim is called.
func TestClaimReachesPastManyNewerMajorJobs(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Logger: quietLog()})
	b := newerMajorValue(t)
	base := toMillis(f.clock.Now()) - 10_000
	pipe := f.rdb.Pipeline()
	const ahead = 2100 // more than the skip set's former limit of 1,000
	for i := range ahead {
		id := fmt.Sprintf("v2-%05d", i)
		keys := f.q.Keys(id)
		pipe.Set(f.ctx, keys.Job, b, 0)
		pipe.ZAdd(f.ctx, keys.Ready, redis.Z{Score: float64(base + int64(i)), Member: id})
	}
	_, err := pipe.Exec(f.ctx)
	require.NoError(t, err)
	_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "runnable"})
	require.NoError(t, err)

	for range 8 {
		j, err := f.q.Claim(f.ctx, "old-worker")
		if err == nil {
			require.Equal(t, "runnable", j.ID)
			return
		}
		require.ErrorIs(t, err, ErrNoJob)
	}
	t.Fatalf("a runnable job behind %d newer-format jobs was never claimed (skip set holds %d)", ahead, f.q.newerFormat.Size())
}

// A plain Claim (no Work in the process) keeps the due entries it did not
// take in its read-ahead pool, and still takes a higher priority enqueued by
// another process before them: a claim takes the due jobs of a higher
// priority before any of a lower one. Here, on one shard, Claim after
// another Queue enqueued a priority-9 job returns that job.
func TestClaimPoolGivesWayToOtherProcessHigherPriority(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.q.clock.Fake = nil
	other := f.twin(t)
	for i := range 4 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("low%d", i)})
		require.NoError(t, err)
	}
	first, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Zero(t, first.Priority)
	hi, err := other.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "hi", Priority: MaxPriority})
	require.NoError(t, err)
	second, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, hi.ID, second.ID, "claimed %s (priority %d) while priority 9 was due", second.ID, second.Priority)
}

// On a cluster, ClaimMany (and a group-committed Claim batch) orders its
// candidates by priority before it keeps those of one shard, so a priority-9
// job due on shard 1 is taken before shard 0's priority-0 jobs, though
// candidates come in shard order. Here, on 3 shards, ClaimMany(n=1) returns
// the priority-9 job.
func TestClusterClaimManyTakesHigherPriorityOnOtherShard(t *testing.T) {
	t.Parallel()
	cl := redistest.SharedCluster(t)
	rdb := cl.Client(t, nil)
	ctx := context.Background()
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Shards: 3})
	low, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: idOnShard(q, "low-", 0)})
	require.NoError(t, err)
	hi, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: idOnShard(q, "hi-", 1), Priority: MaxPriority})
	require.NoError(t, err)
	_ = low
	got, err := q.ClaimMany(ctx, "w", 1)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, hi.ID, got[0].ID, "ClaimMany took %s (priority %d, shard %d) while priority 9 was due on shard 1",
		got[0].ID, got[0].Priority, q.ks.shardOf(got[0].ID))
}

// A due job above priority 0 on a shard with no priority flag is claimed,
// and Stats counts it due. It is what a 1.4 producer built before the flag
// leaves, before or during a rolling upgrade: the same value and ready.<p>
// entry, and no flag. Verify has nothing to report about it, so a worker
// that read only the flagged shards' priority indexes would leave it
// unclaimed forever.
func TestClaimFindsPriorityJobOnShardWithoutFlag(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2, DisableGroupCommit: true})
	j, err := f.q.Enqueue(f.ctx, "hi", nil, &EnqueueOpts{Priority: 5})
	require.NoError(t, err)
	// What a pre-flag 1.4 producer leaves: the same value and entry, no flag.
	_, shard := f.q.ks.jobKeyOf(j.ID)
	require.NoError(t, f.rdb.Del(f.ctx, f.q.ks.index(shard, prioFlag)).Err())

	w := f.otherProcess(t, Config{Shards: 2, DisableGroupCommit: true})
	st, err := w.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Due, "the job is due")
	rep, err := w.Verify(f.ctx, &VerifyOpts{Keys: true, Fix: true})
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "Verify sees nothing wrong")
	c, err := w.Claim(f.ctx, "w")
	require.NoError(t, err, "the due priority-5 job is never claimed by an upgraded worker")
	require.Equal(t, j.ID, c.ID)
}
