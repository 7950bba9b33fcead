package jobkey

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// failNthExec makes the nth MULTI/EXEC the client sends fail before it is
// sent, as a connection that drops would: that transaction writes nothing.
func failNthExec(f *fixture, n int32) *atomic.Int32 {
	var execs atomic.Int32
	f.rdb.AddHook(pipeHook(func(_ context.Context, cmds []redis.Cmder) error {
		if cmds[0].Name() == "multi" && execs.Add(1) == n {
			return errors.New("injected: connection dropped")
		}
		return nil
	}))
	return &execs
}

// An EnqueueMany cut into several transactions reports, per job, which
// ones were written when a later transaction fails.
func TestEnqueueManyReportsPartialWrites(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{MaxBatch: 2, DisableGroupCommit: true})
	failNthExec(f, 2)
	batch := make([]JobSpec, 5)
	for i := range batch {
		batch[i] = JobSpec{Type: "t", Opts: &EnqueueOpts{ID: fmt.Sprintf("p%d", i)}}
	}
	jobs, err := f.q.EnqueueMany(f.ctx, batch)
	errs := jobErrs(t, err, 5)
	require.Len(t, jobs, 5, "every job is returned, written or not, so its ID is known")
	for i, j := range jobs {
		_, gerr := f.q.Get(f.ctx, j.ID)
		if i < 2 {
			require.NoError(t, errs[i], "the first transaction committed")
			require.NoError(t, gerr)
			continue
		}
		require.Error(t, errs[i])
		require.ErrorIs(t, gerr, ErrNotFound, "job %d", i)
	}
	require.ErrorContains(t, errs[2], "injected")
	require.ErrorContains(t, errs[4], "not attempted", "after a failure that would fail the rest too, the rest is not tried")
}

// The same for CompleteMany, and a job repeated in its batch is that
// entry's own error, not the batch's.
func TestCompleteManyReportsPerJob(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{MaxBatch: 2})
	for i := range 5 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("c%d", i)})
		require.NoError(t, err)
	}
	got, err := f.q.ClaimMany(f.ctx, "w", 2)
	require.NoError(t, err)
	more, err := f.q.ClaimMany(f.ctx, "w", 2)
	require.NoError(t, err)
	last, err := f.q.ClaimMany(f.ctx, "w", 1)
	require.NoError(t, err)
	claimed := append(append(got, more...), last...)
	require.Len(t, claimed, 5)

	// A repeated job: reported on its own entry, the others complete.
	done, err := f.q.CompleteMany(f.ctx, []*Job{claimed[0], claimed[1], claimed[0]}, nil)
	errs := jobErrs(t, err, 3)
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.ErrorIs(t, errs[2], ErrInvalid)
	require.ErrorContains(t, errs[2], "appears twice")
	require.Equal(t, StateSucceeded, done[0].State)
	require.Equal(t, StateSucceeded, done[1].State)

	// A later transaction fails: the earlier one's jobs are complete, and
	// the errors say which are not.
	failNthExec(f, 2)
	rest := claimed[2:]
	done, err = f.q.CompleteMany(f.ctx, rest, nil)
	errs = jobErrs(t, err, 3)
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.Equal(t, StateSucceeded, state(t, f.q, rest[0].ID))
	require.Equal(t, StateSucceeded, state(t, f.q, rest[1].ID))
	require.ErrorContains(t, errs[2], "injected")
	require.Nil(t, done[2])
	require.Equal(t, StateActive, state(t, f.q, rest[2].ID))
}

// On one Redis a batch across shards is one transaction. One shard whose
// index holds the wrong type refuses it whole; the batch is then tried
// shard by shard, and only that shard's jobs are refused.
func TestBrokenShardRefusesOnlyItsJobs(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	var ids []string
	for i := range 40 {
		ids = append(ids, fmt.Sprintf("j%d", i))
	}
	batch := make([]JobSpec, len(ids))
	for i, id := range ids {
		batch[i] = JobSpec{Type: "t", Opts: &EnqueueOpts{ID: id}}
	}
	_, err := f.q.EnqueueMany(f.ctx, batch)
	require.NoError(t, err)
	claimed, err := f.q.ClaimMany(f.ctx, "w", len(ids))
	require.NoError(t, err)
	require.Len(t, claimed, len(ids))

	const broken = 2
	require.NoError(t, f.rdb.Set(f.ctx, f.q.ks.index(broken, idxSucceeded), "not a zset", 0).Err())
	done, err := f.q.CompleteMany(f.ctx, claimed, nil)
	errs := jobErrs(t, err, len(claimed))
	refused := 0
	for i, j := range claimed {
		if f.q.ks.shardOf(j.ID) == broken {
			require.ErrorIs(t, errs[i], ErrWrongType)
			require.Equal(t, StateActive, state(t, f.q, j.ID))
			refused++
			continue
		}
		require.NoError(t, errs[i])
		require.Equal(t, StateSucceeded, done[i].State)
		f.requireIndexed(t, done[i])
	}
	require.Positive(t, refused)
	require.Less(t, refused, len(claimed))

	// The same for an enqueue batch whose shard's ready index is broken.
	require.NoError(t, f.rdb.Set(f.ctx, f.q.ks.index(broken, idxReady), "not a zset", 0).Err())
	more := make([]JobSpec, 40)
	for i := range more {
		more[i] = JobSpec{Type: "t", Opts: &EnqueueOpts{ID: fmt.Sprintf("k%d", i)}}
	}
	jobs, err := f.q.EnqueueMany(f.ctx, more)
	errs = jobErrs(t, err, len(more))
	for i, j := range jobs {
		if f.q.ks.shardOf(j.ID) == broken {
			require.ErrorIs(t, errs[i], ErrWrongType)
			continue
		}
		require.NoError(t, errs[i])
		f.requireIndexed(t, j)
	}
}
