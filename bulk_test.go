package jobkey

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// enqueueSpread enqueues n jobs of type "t" over the queue's shards and
// returns how many of them sit on shard.
func enqueueSpread(t *testing.T, f *fixture, n, shard int) (onShard int) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("j%d", i)
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id})
		require.NoError(t, err)
		if f.q.ks.shardOf(id) == shard {
			onShard++
		}
	}
	require.Positive(t, onShard, "some jobs on the shard")
	require.Less(t, onShard, n, "and some elsewhere")
	return onShard
}

// A shard whose listing cannot be read is left out; the others are done,
// and the error counts them, names the shard, and never says that nothing
// was written.
func TestBulkActionLeavingOutAShardCountsWhatItDid(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	broken := enqueueSpread(t, f, 16, 1)
	require.NoError(t, f.rdb.Set(f.ctx, f.q.ks.index(1, readyIndex(5)), "not a zset", 0).Err())

	res, err := f.q.CancelPending(f.ctx, "")
	var be *BulkError
	require.ErrorAs(t, err, &be)
	require.Equal(t, BulkResult{Done: 16 - broken}, res)
	require.Equal(t, res, be.Result, "the error carries the counts")
	require.Equal(t, "cancel", be.Op)
	var se *ShardsError
	require.ErrorAs(t, err, &se)
	require.Equal(t, []int{1}, se.Shards)
	require.ErrorIs(t, err, ErrWrongType)
	require.Contains(t, err.Error(), fmt.Sprintf("%d done", 16-broken))
	require.NotContains(t, err.Error(), "nothing was written")

	st, err := f.q.Stats(f.ctx)
	require.ErrorAs(t, err, &se)
	require.EqualValues(t, 16-broken, st.Canceled)
	for i := range 16 {
		if id := fmt.Sprintf("j%d", i); f.q.ks.shardOf(id) == 1 {
			require.Equal(t, StatePending, state(t, f.q, id), "the unread shard's jobs are left as they are")
		}
	}
}

// A bulk action that stops part way (an index it must write holds the
// wrong type) says how many jobs it had done by then, and those are done.
func TestBulkActionStoppedPartWayCountsWhatItDid(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	enqueueSpread(t, f, 16, 2)
	require.NoError(t, f.rdb.Set(f.ctx, f.q.ks.index(2, idxCanceled), "not a zset", 0).Err())

	res, err := f.q.CancelPending(f.ctx, "")
	var be *BulkError
	require.ErrorAs(t, err, &be)
	require.ErrorIs(t, err, ErrWrongType)
	var se *ShardsError
	require.False(t, errors.As(err, &se), "every shard was read: the action stopped")
	require.Equal(t, res, be.Result)
	canceled := 0
	for i := range 16 {
		if state(t, f.q, fmt.Sprintf("j%d", i)) == StateCanceled {
			canceled++
		}
	}
	require.Equal(t, canceled, res.Done, "the count is what was done")
	require.Contains(t, err.Error(), fmt.Sprintf("cancel: %d done", res.Done))
	require.NotContains(t, err.Error(), "nothing was written")
}

// Every failure of a bulk action is a *BulkError, even one that did
// nothing: a caller reads the counts the same way.
func TestBulkActionFailingAtOnceIsABulkError(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2})
	enqueueSpread(t, f, 8, 0)
	for s := range 2 {
		require.NoError(t, f.rdb.Set(f.ctx, f.q.ks.index(s, idxFailed), "not a zset", 0).Err())
	}
	res, err := f.q.RetryFailed(f.ctx, "")
	var be *BulkError
	require.ErrorAs(t, err, &be)
	require.Equal(t, BulkResult{}, res)
	require.Contains(t, err.Error(), "retry: 0 done")
}

// CancelPending ends while producers keep enqueueing, and leaves alone the
// jobs enqueued after it was called. Pending jobs are listed by RunAt, and
// new jobs are due now, after the cursor: a walk that followed them would
// never end while producers work. Here 2 jobs are pending, pages hold
// MaxBatch = 2 jobs, and three jobs are enqueued per page read; the call
// returns within 3 s, having canceled at most the 2 jobs and one page's
// arrivals.
func TestCancelPendingEndsWhileProducersEnqueue(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 1, MaxBatch: 2})
	for range 2 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, nil)
		require.NoError(t, err)
	}
	producer := f.otherProcess(t, Config{Shards: 1})
	var produced atomic.Int64
	f.rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		if has(cmds, "zrange", ":ready") {
			for range 3 { // producers at work while the operator cancels
				if _, err := producer.Enqueue(context.Background(), "t", nil, nil); err == nil {
					produced.Add(1)
				}
			}
		}
		return nil
	}))
	ctx, cancel := context.WithTimeout(f.ctx, 3*time.Second)
	defer cancel()
	res, err := f.q.CancelPending(ctx, "")
	t.Logf("CancelPending: %+v, err %v; enqueued meanwhile %d", res, err, produced.Load())
	require.NoError(t, err, "CancelPending must end: it was called with 2 jobs pending")
	require.LessOrEqual(t, res.Done, 2+3)
}

// fillerJobs enqueues a page of unkeyed jobs of type t, so that a bulk
// walk of pending jobs takes more than one page.
func fillerJobs(t *testing.T, f *fixture) {
	t.Helper()
	specs := make([]JobSpec, MaxListLimit)
	for i := range specs {
		specs[i] = JobSpec{Type: "t"}
	}
	_, err := f.q.EnqueueMany(f.ctx, specs)
	require.NoError(t, err)
}

// CancelPending cancels a keyed job that a claim parked at the end of the
// key's first lease, though the worker that set that lease runs with a
// longer Config.Lease than the caller: the second walk of a pending bulk
// action reaches past the parks of every process. Here an operator process
// (Lease 30 s) cancels while a worker with a 10-minute lease holds the key.
func TestCancelPendingReachesJobParkedBeyondItsLease(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: 30 * time.Second})
	w := f.otherProcess(t, Config{Lease: 10 * time.Minute})
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k"})
	require.NoError(t, err)
	holder, err := w.Claim(f.ctx, "w")
	require.NoError(t, err)
	parked, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k"})
	require.NoError(t, err)
	f.clock.Advance(time.Millisecond)
	fillerJobs(t, f)
	var once sync.Once
	f.q.afterBulkPage = func() {
		once.Do(func() {
			got, _, err := w.claimTxn(f.ctx, []candidate{{ID: parked.ID, Index: readyIndex(0)}}, []string{"w2"}, true, nil)
			require.NoError(t, err)
			require.Nil(t, got[0], "k is full: parked until the holder's 10-minute lease ends")
		})
	}
	res, err := f.q.CancelPending(f.ctx, "")
	require.NoError(t, err)
	j, err := f.q.Get(f.ctx, parked.ID)
	require.NoError(t, err)
	require.Equal(t, StateCanceled, j.State, "pending when CancelPending started")
	require.Equal(t, MaxListLimit+1, res.Done)
	_, err = w.Complete(f.ctx, holder, nil)
	require.NoError(t, err)
}

// CancelPending cancels a job that a claim parked a minute ahead because it
// could not read the key's value, beyond the caller's own 30 s lease.
func TestCancelPendingReachesJobParkedByUnreadableKey(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Logger: quietLog()})
	parked, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k"})
	require.NoError(t, err)
	f.clock.Advance(time.Millisecond)
	fillerJobs(t, f)
	require.NoError(t, f.rdb.Set(f.ctx, f.q.ks.slotKey(0, "k"), "\xc1garbage", 0).Err())
	var once sync.Once
	f.q.afterBulkPage = func() {
		once.Do(func() {
			got, _, err := f.q.claimTxn(f.ctx, []candidate{{ID: parked.ID, Index: readyIndex(0)}}, []string{"w2"}, true, nil)
			require.NoError(t, err)
			require.Nil(t, got[0], "parked a minute ahead")
		})
	}
	res, err := f.q.CancelPending(f.ctx, "")
	require.NoError(t, err)
	j, err := f.q.Get(f.ctx, parked.ID)
	require.NoError(t, err)
	require.Equal(t, StateCanceled, j.State, "pending when CancelPending started")
	require.Equal(t, MaxListLimit+1, res.Done)
}

// A pending bulk action counts each unreadable job once, though its second
// walk lists again the entries above its start: CancelPending of one due job
// and one scheduled job whose value is corrupt reports one done and one
// unreadable.
func TestCancelPendingCountsUnreadableJobOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Logger: quietLog()})
	_, err := f.q.Enqueue(f.ctx, "t", nil, nil)
	require.NoError(t, err)
	s, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{RunAt: f.clock.Now().Add(10 * time.Second)})
	require.NoError(t, err)
	key, _ := f.q.ks.jobKeyOf(s.ID)
	require.NoError(t, f.rdb.Set(f.ctx, key, "\xc1garbage", 0).Err())
	res, err := f.q.CancelPending(f.ctx, "")
	require.NoError(t, err)
	require.Equal(t, BulkResult{Done: 1, Unreadable: 1}, res)
}

// CancelPending cancels a job parked above its first walk and pulled back
// below its second walk's start before that walk reaches it: a claim parks w
// (its key full) behind the first walk, and the holder's Complete moves w's
// entry back to its RunAt. Every job pending and due when CancelPending
// started ends canceled.
func TestCancelPendingReachesParkedJobPulledBack(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: time.Minute})
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k"})
	require.NoError(t, err)
	holder, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	w, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k"})
	require.NoError(t, err)
	f.clock.Advance(time.Millisecond)
	fillerJobs(t, f)
	pages := 0
	f.q.afterBulkPage = func() {
		pages++
		switch pages {
		case 1: // the walk passed the fillers; w is behind it
			got, _, err := f.q.claimTxn(f.ctx, []candidate{{ID: w.ID, Index: readyIndex(0)}}, []string{"w2"}, true, nil)
			require.NoError(t, err)
			require.Nil(t, got[0], "k is full: w parked above the walk")
		case 2: // the first walk ends; the holder's Complete pulls w back
			_, err := f.q.Complete(f.ctx, holder, nil)
			require.NoError(t, err)
		}
	}
	res, err := f.q.CancelPending(f.ctx, "")
	require.NoError(t, err)
	j, err := f.q.Get(f.ctx, w.ID)
	require.NoError(t, err)
	require.Equal(t, StateCanceled, j.State, "w was pending when CancelPending started, and no claim took it")
	require.Equal(t, MaxListLimit+1, res.Done)
}

// A bulk action whose transaction the replicas did not confirm stops
// there, and its result says how many of the jobs it did were applied on
// the master only: the earlier transactions were confirmed, the rest was
// not done. Here the replica stops before the second of three batches.
func TestBulkActionCountsTheJobsAppliedOnTheMasterOnly(t *testing.T) {
	t.Parallel()
	r := setupReplicated(t, Config{MinReplicas: 1, ReplicaTimeout: loadedReplicaTimeout, MaxBatch: 2})
	for i := range 6 {
		_, err := r.q.Enqueue(r.ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("j%d", i)})
		require.NoError(t, err)
	}
	var execs atomic.Int32
	var thaw func()
	r.master.AddHook(pipeHook(func(_ context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if c.Name() == "exec" && execs.Add(1) == 2 {
				thaw = r.freeze(t)
			}
		}
		return nil
	}))
	res, err := r.q.CancelPending(r.ctx, "")
	require.ErrorIs(t, err, ErrNotReplicated)
	var be *BulkError
	require.ErrorAs(t, err, &be)
	require.Equal(t, BulkResult{Done: 4, Unconfirmed: 2}, res)
	require.Equal(t, res, be.Result)
	require.Contains(t, err.Error(), "cancel: 4 done (2 of them applied on the master only, not confirmed by the replicas), 0 skipped")
	require.NotNil(t, thaw, "the replica was stopped")
	thaw()
	canceled := 0
	for i := range 6 {
		if state(t, r.q, fmt.Sprintf("j%d", i)) == StateCanceled {
			canceled++
		}
	}
	require.Equal(t, 4, canceled, "the 2 jobs of the unconfirmed batch are canceled on the master")
}
