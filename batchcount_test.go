package jobkey

import (
	"fmt"
	"testing"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// countsOf returns batch id's counts: pending, succeeded, failed, canceled.
func countsOf(t *testing.T, f *fixture, id string) [4]int {
	t.Helper()
	b, err := f.q.Batch(f.ctx, id)
	require.NoError(t, err)
	return [4]int{b.Pending, b.Succeeded, b.Failed, b.Canceled}
}

// forgeBatchOf rewrites job id's stored value, outside jobkey, to name
// batch.
func forgeBatchOf(t *testing.T, f *fixture, id, batch string) {
	t.Helper()
	key := f.q.ks.jobKey(f.q.ks.shardOf(id), id)
	raw, err := f.rdb.Get(f.ctx, key).Bytes()
	require.NoError(t, err)
	var j Job
	require.NoError(t, Unmarshal(raw, &j))
	j.Batch = batch
	v, err := Marshal(&j)
	require.NoError(t, err)
	require.NoError(t, f.rdb.Set(f.ctx, key, v, 0).Err())
}

// A job value written outside jobkey that names a batch of another shard
// is not counted there: the batch does not hold it (and on a cluster its
// value is in another hash slot).
func TestBatchDoesNotCountAJobOfAnotherShardThatNamesIt(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	b, _, err := f.q.EnqueueBatch(f.ctx, specs("child", 2), JobSpec{Type: "done"}, &BatchOpts{ID: "b"})
	require.NoError(t, err)
	other := ""
	for i := 0; other == "" || f.q.ks.shardOf(other) == f.q.ks.shardOf(b.ID); i++ {
		other = "x" + string(rune('a'+i))
	}
	_, err = f.q.Enqueue(f.ctx, "forged", nil, &EnqueueOpts{ID: other})
	require.NoError(t, err)
	forgeBatchOf(t, f, other, b.ID)
	j, err := f.q.Cancel(f.ctx, other)
	require.NoError(t, err, "the forged job's own transition goes ahead")
	require.Equal(t, StateCanceled, j.State)
	require.Equal(t, [4]int{2, 0, 0, 0}, countsOf(t, f, b.ID), "the batch counts only its own jobs")
	verifyClean(t, f, "the batch's counts agree with its jobs")
}

// An enqueue under a batch's ID in the EXEC that ends the batch's last job
// (EnqueueMany replacing that job) keeps the caller's job: the callback
// does not overwrite it, and the batch says its ID was taken.
func TestBatchCallbackDoesNotOverwriteAJobEnqueuedUnderItsIDInTheSameEXEC(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	_, _, err := f.q.EnqueueBatch(f.ctx, []JobSpec{{Type: "c", Opts: &EnqueueOpts{ID: "c1"}}}, JobSpec{Type: "done"}, &BatchOpts{ID: "b"})
	require.NoError(t, err)
	_, err = f.q.EnqueueMany(f.ctx, []JobSpec{
		{Type: "mine", Payload: []byte("mine"), Opts: &EnqueueOpts{ID: "b"}},
		{Type: "c2", Opts: &EnqueueOpts{ID: "c1", IfExists: IfExistsReplace}},
	})
	require.NoError(t, err)
	j, err := f.q.Get(f.ctx, "b")
	require.NoError(t, err)
	require.Equal(t, "mine", j.Type, "the caller's job, as enqueued")
	require.Equal(t, []byte("mine"), j.Payload)
	got, err := f.q.Batch(f.ctx, "b")
	require.NoError(t, err)
	require.Equal(t, [4]int{0, 0, 0, 1}, [4]int{got.Pending, got.Succeeded, got.Failed, got.Canceled}, "the replaced job counts as canceled")
	require.Equal(t, BatchFiredTaken, got.Fired)
	verifyClean(t, f, "the batch's counts agree with its jobs")
}

// Batch values written outside jobkey whose callbacks chain further than
// any EnqueueChain (here 40 batches, each the callback's batch of the one
// before) do not block the transition of a job that names the first: it
// goes ahead, and the steps past MaxChainSteps are not counted.
func TestBatchValuesChainedPastMaxChainStepsDoNotBlockAJob(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	_, err := f.q.Enqueue(f.ctx, "c", nil, &EnqueueOpts{ID: "c"})
	require.NoError(t, err)
	const n = 40
	for i := range n {
		id := fmt.Sprintf("b%02d", i)
		cb := &Job{ID: id, Queue: "q", Type: "x", MaxAttempts: 1, State: StatePending}
		if i+1 < n {
			cb.Batch = fmt.Sprintf("b%02d", i+1)
		}
		v, err := encodeBatch(&Batch{ID: id, Queue: "q", Total: 1, Pending: 1, Condition: BatchAllSucceeded, Callback: cb, Rev: 1})
		require.NoError(t, err)
		require.NoError(t, f.rdb.Set(f.ctx, f.q.ks.batchKey(f.q.ks.shardOf(id), id), v, 0).Err())
	}
	forgeBatchOf(t, f, "c", "b00")
	j, err := f.q.Cancel(f.ctx, "c")
	require.NoError(t, err, "the job's own transition goes ahead")
	require.Equal(t, StateCanceled, j.State)
	for i := range n {
		id := fmt.Sprintf("b%02d", i)
		want := [4]int{0, 0, 0, 1}
		if i >= MaxChainSteps {
			want = [4]int{1, 0, 0, 0}
		}
		require.Equal(t, want, countsOf(t, f, id), id)
	}
}

// On a cluster, a job value naming a batch of another shard, so of another
// hash slot, is not counted there: its transaction keeps to its own slot
// and goes ahead.
func TestBatchDoesNotCountAJobOfAnotherSlotOnACluster(t *testing.T) {
	t.Parallel()
	cl := redistest.SharedCluster(t)
	rdb := cl.Client(t, nil)
	q := queueOn(t, rdb, redistest.Prefix(t), Config{})
	ctx := t.Context()
	b, _, err := q.EnqueueBatch(ctx, specs("child", 1), JobSpec{Type: "done"}, nil)
	require.NoError(t, err)
	other := ""
	for i := 0; other == "" || q.ks.shardOf(other) == q.ks.shardOf(b.ID); i++ {
		other = fmt.Sprintf("x%d", i)
	}
	require.NotEqual(t, hashSlot(q.ks.jobKey(q.ks.shardOf(other), other)), hashSlot(q.ks.batchKey(q.ks.shardOf(b.ID), b.ID)))
	_, err = q.Enqueue(ctx, "forged", nil, &EnqueueOpts{ID: other})
	require.NoError(t, err)
	key := q.ks.jobKey(q.ks.shardOf(other), other)
	raw, err := rdb.Get(ctx, key).Bytes()
	require.NoError(t, err)
	var j Job
	require.NoError(t, Unmarshal(raw, &j))
	j.Batch = b.ID
	v, err := Marshal(&j)
	require.NoError(t, err)
	require.NoError(t, rdb.Set(ctx, key, v, 0).Err())
	got, err := q.Cancel(ctx, other)
	require.NoError(t, err, "the forged job's own transition goes ahead")
	require.Equal(t, StateCanceled, got.State)
	bb, err := q.Batch(ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, 1, bb.Pending)
}
