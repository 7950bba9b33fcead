package jobkey

import (
	"errors"
	"fmt"
	"testing"

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
