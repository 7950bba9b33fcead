package jobkey

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestVerifyFindsAndFixesTampering(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2})
	for _, id := range []string{"clean", "unlisted", "misplaced", "rescored", "twice", "active"} {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id, Delay: time.Minute})
		require.NoError(t, err)
	}
	f.clock.Advance(time.Minute)
	c, err := f.q.Claim(f.ctx, "w") // one of them becomes active
	require.NoError(t, err)
	_, err = f.q.Release(f.ctx, c)
	require.NoError(t, err)
	rep, err := f.q.Verify(f.ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "normal operation leaves nothing to find")
	require.Equal(t, 6, rep.Jobs)

	k := f.q.Keys
	z := func(score float64, id string) redis.Z { return redis.Z{Score: score, Member: id} }
	require.NoError(t, f.rdb.ZRem(f.ctx, k("unlisted").Ready, "unlisted").Err())
	require.NoError(t, f.rdb.ZRem(f.ctx, k("misplaced").Ready, "misplaced").Err())
	require.NoError(t, f.rdb.ZAdd(f.ctx, k("misplaced").Leased, z(1, "misplaced")).Err())
	require.NoError(t, f.rdb.ZAdd(f.ctx, k("rescored").Ready, z(1, "rescored")).Err())
	require.NoError(t, f.rdb.ZAdd(f.ctx, k("twice").Failed, z(float64(toMillis(f.clock.Now())), "twice")).Err())
	require.NoError(t, f.rdb.ZAdd(f.ctx, k("ghost").Ready, z(1, "ghost")).Err())
	require.NoError(t, f.rdb.Set(f.ctx, k("broken").Job, "\xc1", 0).Err())
	values := map[string]string{}
	for _, id := range []string{"clean", "unlisted", "misplaced", "rescored", "twice", "active", "broken"} {
		values[id] = f.rdb.Get(f.ctx, k(id).Job).Val()
	}

	rep, err = f.q.Verify(f.ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	got := map[string]string{}
	for _, fd := range rep.Findings {
		got[fd.ID] = fd.Kind
		require.False(t, fd.Fixed)
	}
	require.Equal(t, map[string]string{
		"unlisted": "missing-entry", "misplaced": "wrong-entry", "rescored": "wrong-entry",
		"twice": "wrong-entry", "ghost": "stray-entry", "broken": "missing-entry",
	}, got)

	rep, err = f.q.Verify(f.ctx, &VerifyOpts{Keys: true, Fix: true})
	require.NoError(t, err)
	require.Len(t, rep.Findings, 6)
	for _, fd := range rep.Findings {
		require.True(t, fd.Fixed, fd.ID)
	}
	rep, err = f.q.Verify(f.ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "fix re-derived every entry")
	for id, v := range values {
		require.Equal(t, v, f.rdb.Get(f.ctx, k(id).Job).Val(), "%s: fix never writes a value", id)
	}
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 6, st.Pending)
	require.EqualValues(t, 1, st.Corrupt)
	var ids []string
	for range 6 {
		j, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	sort.Strings(ids)
	require.Equal(t, []string{"active", "clean", "misplaced", "rescored", "twice", "unlisted"}, ids)
}

// On a busy queue Verify reports only real disagreements: a snapshot
// re-check drops what only looked wrong between two reads. By default it
// never scans the keyspace, so its cost follows the queue, not the
// database.
func TestVerifyOnABusyQueue(t *testing.T) {
	t.Parallel()
	q := realQueue(t, &Config{Shards: 4, Lease: time.Second})
	ctx := context.Background()
	for i := 0; i < 2000; i += 200 {
		batch := make([]JobSpec, 200)
		for k := range batch {
			batch[k] = JobSpec{Type: "t"}
		}
		_, err := q.EnqueueMany(ctx, batch)
		require.NoError(t, err)
	}
	rdb := q.rdb.(*redis.Client)
	var scans atomic.Int64
	rdb.AddHook(scanCounter{&scans})

	loadCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for loadCtx.Err() == nil {
			_, _ = q.Enqueue(loadCtx, "t", nil, nil)
		}
	}()
	startWork(t, q, HandlerFunc(func(context.Context, *Job) ([]byte, error) { return nil, nil }),
		&WorkOpts{Concurrency: 8, PollInterval: 10 * time.Millisecond})
	for range 20 {
		rep, err := q.Verify(ctx, nil)
		require.NoError(t, err)
		require.Empty(t, rep.Findings, "a live queue with nothing changed outside jobkey")
		require.Positive(t, rep.Entries)
	}
	require.Zero(t, scans.Load(), "the default Verify does not SCAN")
	_, err := q.Verify(ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Positive(t, scans.Load(), "Keys does")
}

// scanCounter counts SCAN commands a client sends.
type scanCounter struct{ n *atomic.Int64 }

func (h scanCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h scanCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "scan" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h scanCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Verify reports no finding for a finished job whose key expires with its
// retention while Verify runs. Judged by Redis's clock read once, at
// Verify's start, in the walk and again in the snapshot re-check, such an
// entry (here the walk reaches the succeeded index 1.5s later, as it would
// on a big queue) would be older than the retention by then and reported as
// a "stray-entry ... there is no job value": on a healthy live queue, about
// one false finding per job whose retention ends during the walk.
func TestVerifyIgnoresJobsThatExpireDuringTheWalk(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	var slow atomic.Bool
	rdb := redistest.Client(t, nil)
	rdb.AddHook(getHook(func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		if a := cmd.Args(); slow.Load() && cmd.Name() == "zrange" && strings.HasSuffix(a[1].(string), ":"+idxSucceeded) {
			time.Sleep(1500 * time.Millisecond) // a big queue: the walk gets here later
		}
		return next(ctx, cmd)
	}))
	ctx := context.Background()
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Retention: time.Second, Logger: quietLog()})
	_, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	j, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	_, err = q.Complete(ctx, j, nil)
	require.NoError(t, err)

	slow.Store(true)
	rep, err := q.Verify(ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "a job that expired with its retention is not a finding")
}

// Verify pages through an index by score, not by rank. On a live queue,
// entries of earlier pages leave the index between two pages (claims take
// them) and everything after moves down, so a page by rank (ZRANGE key start
// start+999) would start past entries it never read. Here five claims
// between the first and second page of ready would hide a hand-made wrong
// entry at rank 1000; Verify reports it.
func TestVerifyPagesByScore(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	ctx := context.Background()
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Logger: quietLog()})
	batch := make([]JobSpec, verifyPage)
	for i := range batch {
		batch[i] = JobSpec{Type: "t"}
	}
	_, err := q.EnqueueMany(ctx, batch)
	require.NoError(t, err)
	// A job that finished, whose ID someone also put back in ready by hand,
	// due later than the others: rank 1000 of ready.
	_, err = q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "tampered", Delay: time.Hour})
	require.NoError(t, err)
	_, err = q.Cancel(ctx, "tampered")
	require.NoError(t, err)
	require.NoError(t, rdb.ZAdd(ctx, q.Keys("tampered").Ready, redis.Z{Score: float64(time.Now().Add(2 * time.Hour).UnixMilli()), Member: "tampered"}).Err())
	rep, err := q.Verify(ctx, nil)
	require.NoError(t, err)
	require.Len(t, rep.Findings, 1, "found on a quiet queue")

	var pages atomic.Int64
	rdb.AddHook(getHook(func(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
		err := next(ctx, cmd)
		if a := cmd.Args(); cmd.Name() == "zrange" && strings.HasSuffix(a[1].(string), ":"+idxReady) && pages.Add(1) == 1 {
			for range 5 { // workers claim while Verify reads the first page
				_, cerr := q.Claim(ctx, "w")
				require.NoError(t, cerr)
			}
		}
		return err
	}))
	rep, err = q.Verify(ctx, nil)
	require.NoError(t, err)
	require.Len(t, rep.Findings, 1, "the wrong entry is still there, but Verify read past it (%d entries read)", rep.Entries)
}

// Verify's re-check of its suspects copies no job value inside its read-only
// MULTI/EXEC. EXEC runs atomically, and its batch is bounded in jobs (up to
// 100), not bytes: with values near the default MaxValueBytes (1 MiB), an
// EXEC that GETs each suspect's whole value would copy ~100 MiB of replies
// while every other client waits, far past the "few milliseconds at any
// queue size" the docs promise. SLOWLOG does not show it (Redis leaves EXEC
// out of SLOWLOG and logs the inner GETs one by one), and the EXEC's time
// in INFO commandstats grows on a loaded machine whatever the EXEC holds,
// so the test counts the bytes each EXEC's replies carry.
func TestVerifySnapshotCopiesNoValueInExec(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	rdb := redistest.ClientFor(t, srv.URL(), nil)
	ctx := context.Background()
	q, err := NewQueue(rdb, "big", &Config{Logger: quietLog()})
	require.NoError(t, err)
	payload := bytes.Repeat([]byte{'x'}, 1<<20-512)
	for i := range 100 {
		id := fmt.Sprintf("j%03d", i)
		_, err := q.Enqueue(ctx, "t", payload, &EnqueueOpts{ID: id})
		require.NoError(t, err)
		// Someone edited the entry's score by hand: a suspect, re-checked in the snapshot.
		require.NoError(t, rdb.ZAdd(ctx, q.Keys(id).Ready, redis.Z{Score: 1, Member: id}).Err())
	}
	execs := &execReplies{}
	rdb.AddHook(execs)
	require.NoError(t, rdb.ConfigResetStat(ctx).Err())
	rep, err := q.Verify(ctx, nil)
	require.NoError(t, err)
	require.Len(t, rep.Findings, 100)
	for line := range strings.Lines(rdb.Info(ctx, "commandstats").Val()) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_exec:"); ok {
			t.Logf("Verify's EXECs: %s", rest)
		}
	}
	n, largest := execs.get()
	t.Logf("%d EXECs, the largest replied %d bytes", n, largest)
	require.Positive(t, n, "the suspects were re-checked in a MULTI/EXEC")
	require.Less(t, largest, len(payload)/16, "one of Verify's EXECs replied %d bytes: it copied job values", largest)
}

// execReplies is a hook that records the largest number of bytes the
// commands of one MULTI/EXEC replied, and how many EXECs there were.
type execReplies struct {
	mu      sync.Mutex
	n       int
	largest int
}

func (h *execReplies) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *execReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *execReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		in, size := false, 0
		for _, c := range cmds {
			switch c.Name() {
			case "multi":
				in, size = true, 0
			case "exec":
				h.mu.Lock()
				h.n++
				h.largest = max(h.largest, size)
				h.mu.Unlock()
				in = false
			default:
				if in {
					size += replyBytes(c)
				}
			}
		}
		return err
	}
}

func (h *execReplies) get() (n, largest int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n, h.largest
}

// replyBytes is about how many bytes a command's reply carried.
func replyBytes(c redis.Cmder) int {
	switch c := c.(type) {
	case *redis.StringCmd:
		return len(c.Val())
	case *redis.FloatCmd, *redis.IntCmd, *redis.StatusCmd, *redis.BoolCmd:
		return 8
	default:
		return len(fmt.Sprint(c))
	}
}

// A snapshot re-check whose EXEC is aborted (a suspect job changed after
// its GET) judges nothing from it and reads again: every ZSCORE of an
// aborted EXEC carries the abort, and was once taken for "in no index"
// (TestVerifyOnABusyQueue failed so, now and then, on a busy queue).
func TestVerifySnapshotAbortedIsReadAgain(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	j, err := f.q.Enqueue(f.ctx, "t", nil, nil)
	require.NoError(t, err)
	require.NoError(t, f.rdb.ZRem(f.ctx, f.q.Keys(j.ID).Ready, j.ID).Err(), "changed outside jobkey: a suspect")
	other := f.otherProcess(t, Config{})
	var fired atomic.Bool
	f.rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		n := names(cmds)
		if slices.Contains(n, "multi") && slices.ContainsFunc(n, func(s string) bool { return strings.HasPrefix(s, "zscore") }) &&
			fired.CompareAndSwap(false, true) {
			// Between the re-check's GET and its EXEC, the job is moved on:
			// its value changes, and its entry is written again.
			_, err := other.Update(context.Background(), j.ID, func(j *Job) error { j.RunAt = j.RunAt.Add(time.Second); return nil })
			require.NoError(t, err)
		}
		return nil
	}))
	rep, err := f.q.Verify(f.ctx, &VerifyOpts{Keys: true}) // a value no index lists is found by its key
	require.NoError(t, err)
	require.True(t, fired.Load(), "the re-check ran")
	require.Empty(t, rep.Findings, "the job is listed again: nothing to report")
}

// Verify's repair (Keys and Fix, for job keys restored or copied without
// their shard's other keys) sets the shard's priority flag when it puts a
// job above priority 0 back in a ready index, as every write that puts one
// there does. Without the flag, no process that has not seen priorities yet
// reads that index, not even the one that ran the repair. Here only the key
// of a priority-5 job survives; after the repair, a fresh process with no
// periodic full read claims it.
func TestVerifyFixSetsPriorityFlagOfRebuiltEntry(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 1, DisableGroupCommit: true})
	prod := f.otherProcess(t, Config{Shards: 1})
	j, err := prod.Enqueue(f.ctx, "hi", nil, &EnqueueOpts{Priority: 5})
	require.NoError(t, err)
	// Only the job key survives (restored/copied without the shard's other keys).
	var others []string
	for _, idx := range append(allIndexes, prioFlag) {
		others = append(others, f.q.ks.index(0, idx))
	}
	require.NoError(t, f.rdb.Del(f.ctx, others...).Err())

	admin := f.otherProcess(t, Config{Shards: 1, DisableGroupCommit: true})
	rep, err := admin.Verify(f.ctx, &VerifyOpts{Keys: true, Fix: true})
	require.NoError(t, err)
	require.Len(t, rep.Findings, 1)
	require.True(t, rep.Findings[0].Fixed)
	idx, _ := f.indexOf(t, j.ID)
	require.Equal(t, "ready.5", idx, "the repair put the entry back")

	// The repair sets the shard's flag, as the move that first put
	// the job there did, so a process that has not seen priorities yet
	// finds it.
	require.EqualValues(t, 1, f.rdb.Exists(f.ctx, f.q.ks.index(0, prioFlag)).Val(), "the repair sets the flag")
	fresh := f.otherProcess(t, Config{Shards: 1, DisableGroupCommit: true})
	fresh.fullRead.Store(time.Now().UnixNano()) // no periodic full read: the flag alone must do
	c, err := fresh.Claim(f.ctx, "w")
	require.NoError(t, err, "the repaired priority job is claimable")
	require.Equal(t, j.ID, c.ID)
}

// A fix the replicas did not confirm was written on the master only: the
// finding is still reported, not Fixed, beside the error that says so.
func TestVerifyReportsAFindingWhoseFixWasNotConfirmed(t *testing.T) {
	t.Parallel()
	r := setupReplicated(t, Config{MinReplicas: 1, ReplicaTimeout: loadedReplicaTimeout})
	_, err := r.q.Enqueue(r.ctx, "t", nil, &EnqueueOpts{ID: "unlisted"})
	require.NoError(t, err)
	require.NoError(t, r.master.ZRem(r.ctx, r.q.Keys("unlisted").Ready, "unlisted").Err())
	_ = r.freeze(t)
	rep, err := r.q.Verify(r.ctx, &VerifyOpts{Keys: true, Fix: true})
	require.ErrorIs(t, err, ErrNotReplicated)
	require.Contains(t, err.Error(), `verify: fix of job "unlisted"`)
	require.Len(t, rep.Findings, 1)
	require.Equal(t, "unlisted", rep.Findings[0].ID)
	require.False(t, rep.Findings[0].Fixed)
}
