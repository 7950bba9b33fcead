package jobkey

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/faultproxy"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// specs returns n job specs of type typ.
func specs(typ string, n int) []JobSpec {
	out := make([]JobSpec, n)
	for i := range out {
		out[i] = JobSpec{Type: typ, Payload: []byte(fmt.Sprint(i))}
	}
	return out
}

// callbackState returns the callback job of batch id, or nil if none was
// written.
func callbackOf(t *testing.T, f *fixture, id string) *Job {
	t.Helper()
	j, err := f.q.Get(f.ctx, id)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	require.NoError(t, err)
	return j
}

// claimJobs claims every due job of the queue.
func claimJobs(t *testing.T, f *fixture) []*Job {
	t.Helper()
	var out []*Job
	for {
		j, err := f.q.Claim(f.ctx, "w")
		if errors.Is(err, ErrNoJob) {
			return out
		}
		require.NoError(t, err)
		out = append(out, j)
	}
}

func TestBatchCallbackIsEnqueuedByTheLastJobsOutcome(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	b, _, err := f.q.EnqueueBatch(f.ctx, specs("child", 3), JobSpec{Type: "done", Payload: []byte("cb")}, nil)
	require.NoError(t, err)
	require.Equal(t, 3, b.Pending)
	jobs := claimJobs(t, f)
	require.Len(t, jobs, 3)
	for _, j := range jobs {
		require.Equal(t, b.ID, j.Batch)
		require.Equal(t, f.q.ks.shardOf(b.ID), f.q.ks.shardOf(j.ID), "a batch's jobs live in its shard")
	}
	_, err = f.q.Complete(f.ctx, jobs[0], nil)
	require.NoError(t, err)
	_, err = f.q.Fail(f.ctx, jobs[1], ErrSkipRetry)
	require.NoError(t, err)
	require.Nil(t, callbackOf(t, f, b.ID), "not before the last job finishes")
	got, err := f.q.Batch(f.ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, [4]int{1, 1, 1, 0}, [4]int{got.Pending, got.Succeeded, got.Failed, got.Canceled})
	require.Equal(t, BatchNotFired, got.Fired)

	_, err = f.q.Complete(f.ctx, jobs[2], nil)
	require.NoError(t, err)
	cb := callbackOf(t, f, b.ID)
	require.NotNil(t, cb, "the last outcome enqueues the callback")
	require.Equal(t, StatePending, cb.State)
	require.Equal(t, "done", cb.Type)
	require.Equal(t, []byte("cb"), cb.Payload)
	got, err = f.q.Batch(f.ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, [4]int{0, 2, 1, 0}, [4]int{got.Pending, got.Succeeded, got.Failed, got.Canceled})
	require.Equal(t, BatchFiredEnqueued, got.Fired)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, b.ID, c.ID, "the callback is claimable")
	verifyClean(t, f, "a batch's counts agree with its jobs")
}

func TestBatchCountsRetriesSnoozesCancelsAndDeletes(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{MaxAttempts: 2})
	b, _, err := f.q.EnqueueBatch(f.ctx, specs("child", 4), JobSpec{Type: "done"}, nil)
	require.NoError(t, err)
	jobs := claimJobs(t, f)
	require.Len(t, jobs, 4)
	// A retryable failure and a snooze leave the job pending: nothing counts.
	_, err = f.q.Fail(f.ctx, jobs[0], errors.New("again"))
	require.NoError(t, err)
	_, err = f.q.Fail(f.ctx, jobs[1], Snooze(time.Second))
	require.NoError(t, err)
	got, err := f.q.Batch(f.ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, 4, got.Pending)
	// A cancel counts as canceled; a delete of a pending job too.
	_, err = f.q.Cancel(f.ctx, jobs[2].ID)
	require.NoError(t, err)
	_, err = f.q.Release(f.ctx, jobs[3])
	require.NoError(t, err)
	require.NoError(t, f.q.Delete(f.ctx, jobs[3].ID))
	got, err = f.q.Batch(f.ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, [4]int{2, 0, 0, 2}, [4]int{got.Pending, got.Succeeded, got.Failed, got.Canceled})
	// The failed one runs out of attempts; Retry takes it back to pending.
	f.clock.Advance(time.Hour)
	again := claimJobs(t, f)
	require.Len(t, again, 2)
	for _, j := range again {
		_, err = f.q.Fail(f.ctx, j, ErrSkipRetry)
		require.NoError(t, err)
	}
	got, err = f.q.Batch(f.ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, [4]int{0, 0, 2, 2}, [4]int{got.Pending, got.Succeeded, got.Failed, got.Canceled})
	require.Equal(t, BatchFiredEnqueued, got.Fired)
	cb := callbackOf(t, f, b.ID)
	require.NotNil(t, cb)
	// A job retried after the batch fired is counted pending again, and
	// its outcome counted once more; the callback is never written again.
	_, err = f.q.Retry(f.ctx, again[0].ID)
	require.NoError(t, err)
	got, err = f.q.Batch(f.ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, [4]int{1, 0, 1, 2}, [4]int{got.Pending, got.Succeeded, got.Failed, got.Canceled})
	var r *Job
	for _, j := range claimJobs(t, f) {
		if j.ID == again[0].ID {
			r = j
		}
	}
	require.NotNil(t, r)
	_, err = f.q.Complete(f.ctx, r, nil)
	require.NoError(t, err)
	got, err = f.q.Batch(f.ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, [4]int{0, 1, 1, 2}, [4]int{got.Pending, got.Succeeded, got.Failed, got.Canceled})
	again2 := callbackOf(t, f, b.ID)
	require.Equal(t, StateActive, again2.State, "claimed above, never written again by the batch")
	require.Equal(t, cb.CreatedAt, again2.CreatedAt)
	require.Equal(t, BatchFiredEnqueued, got.Fired)
}

func TestBatchAllSucceededCancelsItsCallbackWhenAJobFails(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	b, _, err := f.q.EnqueueBatch(f.ctx, specs("child", 2), JobSpec{Type: "done"}, &BatchOpts{Condition: BatchAllSucceeded})
	require.NoError(t, err)
	jobs := claimJobs(t, f)
	_, err = f.q.Complete(f.ctx, jobs[0], nil)
	require.NoError(t, err)
	_, err = f.q.Fail(f.ctx, jobs[1], ErrSkipRetry)
	require.NoError(t, err)
	cb := callbackOf(t, f, b.ID)
	require.NotNil(t, cb)
	require.Equal(t, StateCanceled, cb.State)
	require.Contains(t, cb.LastError, "1 failed")
	got, err := f.q.Batch(f.ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, BatchFiredCanceled, got.Fired)
}

func TestBatchCallbackFiresOnceWhenTheLastReplyIsLost(t *testing.T) {
	t.Parallel()
	cut, proxy := proxiedWithin(t, 5*time.Second) // a slow reply under load is not a cut one (a cut resets the link)
	q := queueOn(t, cut, redistest.Prefix(t), Config{})
	ctx := t.Context()
	b, _, err := q.EnqueueBatch(ctx, specs("child", 2), JobSpec{Type: "done"}, &BatchOpts{ID: "b1"})
	require.NoError(t, err)
	var jobs []*Job
	for range 2 {
		j, err := q.Claim(ctx, "w")
		require.NoError(t, err)
		jobs = append(jobs, j)
	}
	_, err = q.Complete(ctx, jobs[0], nil)
	require.NoError(t, err)
	proxy.Set(faultproxy.Faults{ExecCutProb: 1})
	_, err = q.Complete(ctx, jobs[1], nil)
	proxy.Set(faultproxy.Faults{})
	require.ErrorIs(t, err, ErrOutcomeUnknown, "the EXEC ran; its reply was lost")
	done, err := q.Complete(ctx, jobs[1], nil)
	require.NoError(t, err, "the retried completion finds its own write")
	require.Equal(t, StateSucceeded, done.State)
	got, err := q.Batch(ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, [4]int{0, 2, 0, 0}, [4]int{got.Pending, got.Succeeded, got.Failed, got.Canceled}, "counted once")
	cb, err := q.Get(ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, uint64(1), cb.Rev, "the callback was written once")

	// The batch itself, made again after a lost reply, is found.
	proxy.Set(faultproxy.Faults{ExecCutProb: 1})
	_, _, err = q.EnqueueBatch(ctx, specs("child", 1), JobSpec{Type: "done"}, &BatchOpts{ID: "b2"})
	proxy.Set(faultproxy.Faults{})
	require.ErrorIs(t, err, ErrOutcomeUnknown)
	again, _, err := q.EnqueueBatch(ctx, specs("child", 1), JobSpec{Type: "done"}, &BatchOpts{ID: "b2"})
	require.ErrorIs(t, err, ErrBatchExists)
	require.Equal(t, 1, again.Total)
}

func TestBatchCountsAJobWhoseWorkerDied(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{MaxAttempts: 1, Lease: time.Second})
	b, _, err := f.q.EnqueueBatch(f.ctx, specs("child", 1), JobSpec{Type: "done"}, nil)
	require.NoError(t, err)
	_, err = f.q.Claim(f.ctx, "dies")
	require.NoError(t, err)
	f.clock.Advance(2 * time.Second)
	// The next claimer finds the lease expired with no attempt left: the
	// job fails for good in its EXEC, and the batch fires there.
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, b.ID, c.ID, "the callback, written by the claim that failed the dead worker's job")
	got, err := f.q.Batch(f.ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, [4]int{0, 0, 1, 0}, [4]int{got.Pending, got.Succeeded, got.Failed, got.Canceled})
}

func TestEnqueueBatchIsAllOrNothing(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "taken"})
	require.NoError(t, err)
	jobs := []JobSpec{{Type: "c", Opts: &EnqueueOpts{ID: "free"}}, {Type: "c", Opts: &EnqueueOpts{ID: "taken"}}}
	_, _, err = f.q.EnqueueBatch(f.ctx, jobs, JobSpec{Type: "done"}, &BatchOpts{ID: "b"})
	require.ErrorIs(t, err, ErrJobExists)
	_, err = f.q.Get(f.ctx, "free")
	require.ErrorIs(t, err, ErrNotFound, "nothing of the batch was written")
	_, err = f.q.Batch(f.ctx, "b")
	require.ErrorIs(t, err, ErrBatchNotFound)
	_, _, err = f.q.EnqueueBatch(f.ctx, specs("c", f.q.cfg.MaxBatch+1), JobSpec{Type: "done"}, nil)
	require.ErrorIs(t, err, ErrInvalid, "over Config.MaxBatch")
}

func TestChainRunsEachStepAfterTheOneBefore(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	ids, err := f.q.EnqueueChain(f.ctx, specs("step", 4), nil)
	require.NoError(t, err)
	require.Len(t, ids, 4)
	for i, id := range ids {
		require.Equal(t, f.q.ks.shardOf(ids[0]), f.q.ks.shardOf(id), "a chain lives in one shard")
		j, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err, "step %d", i)
		require.Equal(t, id, j.ID, "step %d runs only after step %d", i, i-1)
		_, err = f.q.Claim(f.ctx, "w")
		require.ErrorIs(t, err, ErrNoJob, "nothing else is due while step %d runs", i)
		_, err = f.q.Complete(f.ctx, j, nil)
		require.NoError(t, err)
	}
	for _, id := range ids[1:] {
		b, err := f.q.Batch(f.ctx, id)
		require.NoError(t, err)
		require.Equal(t, BatchFiredEnqueued, b.Fired)
		require.Equal(t, [4]int{0, 1, 0, 0}, [4]int{b.Pending, b.Succeeded, b.Failed, b.Canceled})
	}
	verifyClean(t, f, "a finished chain")
}

// A 4-step chain whose first step fails: the EXEC that fails it ends
// every later step, canceled, each counted in the batch of the next, so
// the chain never hangs.
func TestChainWhoseFirstStepFailsEndsWhole(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ids, err := f.q.EnqueueChain(f.ctx, specs("step", 4), nil)
	require.NoError(t, err)
	j, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, ids[0], j.ID)
	_, err = f.q.Fail(f.ctx, j, ErrSkipRetry)
	require.NoError(t, err)
	for i, id := range ids[1:] {
		step, err := f.q.Get(f.ctx, id)
		require.NoError(t, err, "step %d was written", i+1)
		require.Equal(t, StateCanceled, step.State, "step %d", i+1)
		require.Contains(t, step.LastError, "did not all succeed")
		b, err := f.q.Batch(f.ctx, id)
		require.NoError(t, err)
		require.Equal(t, BatchFiredCanceled, b.Fired)
		want := [4]int{0, 0, 0, 1}
		if i == 0 {
			want = [4]int{0, 0, 1, 0}
		}
		require.Equal(t, want, [4]int{b.Pending, b.Succeeded, b.Failed, b.Canceled}, "step %d's batch", i+1)
	}
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob)
	verifyClean(t, f, "a chain ended by its first step")
}

// Under BatchAllFinished a step runs once the one before it finished,
// however.
func TestChainOnFinishedRunsPastAFailure(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ids, err := f.q.EnqueueChain(f.ctx, specs("step", 2), &ChainOpts{Condition: BatchAllFinished})
	require.NoError(t, err)
	j, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	_, err = f.q.Fail(f.ctx, j, ErrSkipRetry)
	require.NoError(t, err)
	j, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, ids[1], j.ID)
}

// On a cluster a batch's jobs, its value and its callback share one hash
// slot, so each of their transactions is one EXEC on one master; Work
// drains the batch there and the callback runs once.
func TestBatchOnAClusterLivesInOneSlot(t *testing.T) {
	t.Parallel()
	cl := redistest.SharedCluster(t)
	rdb := cl.Client(t, nil)
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Lease: time.Second})
	ctx := t.Context()
	b, _, err := q.EnqueueBatch(ctx, specs("child", 50), JobSpec{Type: "cb"}, nil)
	require.NoError(t, err)
	ids, err := q.EnqueueChain(ctx, specs("step", 3), nil)
	require.NoError(t, err)
	slot := hashSlot(q.ks.batchKey(q.ks.shardOf(b.ID), b.ID))
	var mu sync.Mutex
	runs := map[string]int{}
	elsewhere := 0
	drainWithWork(t, q, func(j *Job, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			runs[j.ID]++
			if j.Batch == b.ID && hashSlot(q.ks.jobKey(q.ks.shardOf(j.ID), j.ID)) != slot {
				elsewhere++
			}
		}
	})
	mu.Lock()
	defer mu.Unlock()
	require.Zero(t, elsewhere, "every job of the batch is in its value's hash slot")
	require.Equal(t, 51, len(runs)-len(ids))
	require.Equal(t, 1, runs[b.ID], "the callback ran once")
	for _, id := range ids {
		require.Equal(t, 1, runs[id], "each step ran once")
	}
	got, err := q.Batch(ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, [4]int{0, 50, 0, 0}, [4]int{got.Pending, got.Succeeded, got.Failed, got.Canceled})
}

// Through a link that loses EXEC replies and resets connections, with a
// worker that died holding some jobs, and jobs that fail for good, are
// retried, snooze and are canceled, Work drains a batch: its callback is
// written once (no attempt of it runs twice), and runs only once every
// job of the batch has finished.
func TestBatchCallbackFiresOnceUnderLostRepliesAndDeadWorkers(t *testing.T) {
	t.Parallel()
	rdb, proxy := proxied(t)
	prefix := redistest.Prefix(t)
	cfg := Config{Logger: quietLog(), Lease: time.Second, MaxAttempts: 3}
	q := queueOn(t, rdb, prefix, cfg)
	clean := queueOn(t, redistest.Client(t, nil), prefix, cfg)
	ctx := t.Context()
	const n = 40
	jobs := make([]JobSpec, n)
	for i := range jobs {
		jobs[i] = JobSpec{Type: "child", Payload: []byte{byte(i % 5)}}
	}
	b, childIDs, err := clean.EnqueueBatch(ctx, jobs, JobSpec{Type: "cb"}, nil)
	require.NoError(t, err)
	// A worker takes three jobs and dies: their leases run out, and Work
	// takes them again.
	for range 3 {
		_, err := clean.Claim(ctx, "dead")
		require.NoError(t, err)
	}
	proxy.Set(faultproxy.Faults{ExecCutProb: 0.05, ResetProb: 0.005})
	var mu sync.Mutex
	attempts := map[int]int{} // runs of the callback by attempt
	var early int
	cbDone := false
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, HandlerFunc(func(hctx context.Context, j *Job) ([]byte, error) {
			if j.Type == "cb" {
				got, err := clean.Batch(hctx, b.ID)
				mu.Lock()
				defer mu.Unlock()
				attempts[j.Attempt]++
				if err != nil || got.Pending != 0 {
					early++
				}
				cbDone = true
				return nil, nil
			}
			switch j.Payload[0] {
			case 1: // fails for good
				return nil, ErrSkipRetry
			case 2: // fails once, then succeeds
				if j.Attempt == 1 {
					return nil, errors.New("flaky")
				}
			case 3: // snoozes once
				if j.Snoozes == 0 {
					return nil, Snooze(10 * time.Millisecond)
				}
			}
			time.Sleep(time.Millisecond)
			return nil, nil
		}), &WorkOpts{Concurrency: 8, TrimInterval: -1, Logger: quietLog(), PollInterval: 20 * time.Millisecond})
	}()
	// Meanwhile three jobs that would succeed at once are canceled, while
	// still pending.
	canceled := 0
	for i := 0; canceled < 3 && i < 100; i++ {
		ls, err := clean.List(ctx, ListOpts{State: StatePending})
		require.NoError(t, err)
		for _, j := range ls.Jobs {
			if j.Batch == b.ID && j.Payload[0] == 4 && canceled < 3 {
				if _, err := clean.Cancel(ctx, j.ID); err == nil {
					canceled++
				}
			}
		}
	}
	waitForIn(t, 90*time.Second, "the callback ran", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return cbDone
	})
	proxy.Set(faultproxy.Faults{})
	waitForIn(t, 30*time.Second, "the callback succeeded", func() bool {
		cb, err := clean.Get(ctx, b.ID)
		return err == nil && cb.State == StateSucceeded
	})
	stop()
	require.NoError(t, <-done)
	mu.Lock()
	defer mu.Unlock()
	// A callback written twice would be a new job, run from attempt 1
	// again; one whose claim's reply was lost runs first at a later one.
	for a, runs := range attempts {
		require.Equal(t, 1, runs, "the callback ran its attempt %d %d times: it was written more than once", a, runs)
	}
	cb, err := clean.Get(ctx, b.ID)
	require.NoError(t, err)
	require.Zero(t, early, "the callback ran only once every job had finished")
	got, err := clean.Batch(ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, 0, got.Pending)
	require.Equal(t, BatchFiredEnqueued, got.Fired)
	require.Equal(t, got.FiredAt, cb.CreatedAt, "the callback is the one the batch wrote")
	require.Equal(t, n, got.Succeeded+got.Failed+got.Canceled)
	// The counts are the jobs' outcomes, each once. A job fails for good
	// by its handler, or when lost claims and the dead worker's spent its
	// attempts.
	var want [4]int
	for _, id := range childIDs {
		j, err := clean.Get(ctx, id)
		require.NoError(t, err)
		require.True(t, j.State.Finished(), "job %s is %s", id, j.State)
		want[bucketIndex(j.State)]++
	}
	require.Equal(t, want, [4]int{got.Pending, got.Succeeded, got.Failed, got.Canceled})
	require.Equal(t, canceled, got.Canceled)
	require.GreaterOrEqual(t, got.Failed, n/5, "the jobs that fail for good")
	t.Logf("proxy %+v; %d canceled", proxy.Counts(), canceled)
}

// Verify checks a batch's counts against its jobs: exactly for the jobs
// not finished, at least as many for those finished (they expire), and
// reports a count changed outside jobkey.
func TestVerifyChecksABatchsCountsAgainstItsJobs(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	b, _, err := f.q.EnqueueBatch(f.ctx, specs("child", 3), JobSpec{Type: "done"}, nil)
	require.NoError(t, err)
	ids, err := f.q.EnqueueChain(f.ctx, specs("step", 3), nil)
	require.NoError(t, err)
	j, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	_, err = f.q.Complete(f.ctx, j, nil)
	require.NoError(t, err)
	rep, err := f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "a batch under way, and a chain whose later jobs are still to be written")
	require.Equal(t, 1+len(ids)-1, rep.Batches)

	// A finished job that expired stays counted: no finding.
	require.NoError(t, f.rdb.Del(f.ctx, f.q.ks.jobKey(f.q.ks.shardOf(j.ID), j.ID)).Err())
	rep, err = f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings)

	// A count edited outside jobkey is found.
	key := f.q.ks.batchKey(f.q.ks.shardOf(b.ID), b.ID)
	got, err := f.q.Batch(f.ctx, b.ID)
	require.NoError(t, err)
	got.Pending, got.Succeeded = got.Pending-1, got.Succeeded+1
	v, err := encodeBatch(got)
	require.NoError(t, err)
	require.NoError(t, f.rdb.Set(f.ctx, key, v, 0).Err())
	rep, err = f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Len(t, rep.Findings, 1)
	require.Equal(t, Finding{ID: b.ID, Kind: "batch-counts", Detail: rep.Findings[0].Detail}, rep.Findings[0])
	require.Contains(t, rep.Findings[0].Detail, "pending")

	require.NoError(t, f.rdb.Set(f.ctx, key, "garbage", 0).Err())
	rep, err = f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Len(t, rep.Findings, 1)
	require.Equal(t, "batch-unreadable", rep.Findings[0].Kind)
}

func TestBatchesListsTheNewestFirst(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 3})
	var made []string
	for range 4 {
		b, _, err := f.q.EnqueueBatch(f.ctx, specs("c", 2), JobSpec{Type: "done"}, nil)
		require.NoError(t, err)
		made = append(made, b.ID)
		f.clock.Advance(time.Second)
	}
	got, err := f.q.Batches(f.ctx, 3)
	require.NoError(t, err)
	require.Len(t, got, 3)
	for i, b := range got {
		require.Equal(t, made[3-i], b.ID)
		require.Equal(t, 2, b.Pending)
	}
	_, err = f.q.Batches(f.ctx, 0)
	require.ErrorIs(t, err, ErrInvalid)
	// An unreadable value is reported, and the others listed.
	require.NoError(t, f.rdb.Set(f.ctx, f.q.ks.batchKey(f.q.ks.shardOf(made[0]), made[0]), "x", 0).Err())
	got, err = f.q.Batches(f.ctx, 10)
	require.ErrorIs(t, err, ErrCorrupt)
	require.Len(t, got, 3)
}

// Update may not move a job out of its batch, or into another: the batch
// counts it, and it lives in the batch's shard.
func TestUpdateMayNotChangeAJobsBatch(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	b, _, err := f.q.EnqueueBatch(f.ctx, []JobSpec{{Type: "c", Opts: &EnqueueOpts{ID: "c1"}}}, JobSpec{Type: "done"}, nil)
	require.NoError(t, err)
	_, err = f.q.Update(f.ctx, "c1", func(j *Job) error { j.Batch = ""; return nil })
	require.ErrorIs(t, err, ErrInvalid)
	got, err := f.q.Batch(f.ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, 1, got.Pending)
	j, err := f.q.Get(f.ctx, "c1")
	require.NoError(t, err)
	require.Equal(t, b.ID, j.Batch)
}

// The IDs a caller gives a chain's steps, and a batch's callback, are the
// IDs they are stored under.
func TestChainAndBatchKeepTheIDsTheCallerGave(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	steps := []JobSpec{{Type: "a", Opts: &EnqueueOpts{ID: "s0"}}, {Type: "a", Opts: &EnqueueOpts{ID: "s1"}}, {Type: "a", Opts: &EnqueueOpts{ID: "s2"}}}
	ids, err := f.q.EnqueueChain(f.ctx, steps, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"s0", "s1", "s2"}, ids)
	for _, id := range ids[1:] {
		b, err := f.q.Batch(f.ctx, id)
		require.NoError(t, err)
		require.Equal(t, id, b.Callback.ID)
	}
	_, err = f.q.EnqueueChain(f.ctx, []JobSpec{{Type: "a", Opts: &EnqueueOpts{ID: "d"}}, {Type: "a", Opts: &EnqueueOpts{ID: "d"}}}, nil)
	require.ErrorIs(t, err, ErrInvalid, "an ID repeated in the chain")

	b, _, err := f.q.EnqueueBatch(f.ctx, specs("c", 1), JobSpec{Type: "done", Opts: &EnqueueOpts{ID: "cb"}}, nil)
	require.NoError(t, err)
	require.Equal(t, "cb", b.ID, "the callback's ID is the batch's")
	_, _, err = f.q.EnqueueBatch(f.ctx, specs("c", 1), JobSpec{Type: "done", Opts: &EnqueueOpts{ID: "cb2"}}, &BatchOpts{ID: "other"})
	require.ErrorIs(t, err, ErrInvalid, "a callback ID that is not the batch's")
}

// A chain's step whose ID a job outside the chain took before the step
// was written is never written: the step after counts it canceled, so the
// chain still ends (all succeeded: canceled; all finished: it runs on).
func TestChainWhoseStepIDIsTakenStillEnds(t *testing.T) {
	t.Parallel()
	for _, cond := range []BatchCondition{BatchAllSucceeded, BatchAllFinished} {
		f := setup(t, nil)
		ids, err := f.q.EnqueueChain(f.ctx, specs("s", 3), &ChainOpts{Condition: cond})
		require.NoError(t, err)
		_, err = f.q.Enqueue(f.ctx, "other", nil, &EnqueueOpts{ID: ids[1]})
		require.NoError(t, err)
		done := false
		for _, j := range claimJobs(t, f) {
			if j.ID == ids[0] {
				_, err = f.q.Complete(f.ctx, j, nil)
				require.NoError(t, err)
				done = true
			}
		}
		require.True(t, done)
		b1, err := f.q.Batch(f.ctx, ids[1])
		require.NoError(t, err)
		require.Equal(t, BatchFiredTaken, b1.Fired)
		other, err := f.q.Get(f.ctx, ids[1])
		require.NoError(t, err)
		require.Equal(t, "other", other.Type, "the job that took the ID is left alone")
		b2, err := f.q.Batch(f.ctx, ids[2])
		require.NoError(t, err)
		require.Equal(t, [4]int{0, 0, 0, 1}, [4]int{b2.Pending, b2.Succeeded, b2.Failed, b2.Canceled}, "the step never written counts canceled")
		last := callbackOf(t, f, ids[2])
		require.NotNil(t, last, "the chain does not wait for ever")
		if cond == BatchAllSucceeded {
			require.Equal(t, BatchFiredCanceled, b2.Fired)
			require.Equal(t, StateCanceled, last.State)
		} else {
			require.Equal(t, BatchFiredEnqueued, b2.Fired)
			require.Equal(t, StatePending, last.State)
		}
		verifyClean(t, f, "the chain's counts agree with its jobs")
	}
}

// A batch whose callback is as large as Config.MaxValueBytes allows a job
// (here the hard ceiling, MaxValueBytes) is refused: its value, the
// callback and a few counts, could not be read again, and its jobs'
// outcomes would never be counted, nor its callback written.
func TestEnqueueBatchRefusesABatchThatCouldGrowPastTheValueLimit(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{MaxValueBytes: MaxValueBytes})
	probe, err := f.q.newCallback(f.ctx, JobSpec{Type: "done", Payload: make([]byte, 1<<20)}, "b")
	require.NoError(t, err)
	// The largest callback newCallback takes: its times are counted once
	// set (8 bytes more each than the zero times of the probe).
	size := 1<<20 + MaxValueBytes - encodedSize(probe) - 24
	_, err = f.q.newCallback(f.ctx, JobSpec{Type: "done", Payload: make([]byte, size)}, "b")
	require.NoError(t, err, "a callback a job of its size may be")
	_, _, err = f.q.EnqueueBatch(f.ctx, []JobSpec{{Type: "c", Opts: &EnqueueOpts{ID: "c"}}}, JobSpec{Type: "done", Payload: make([]byte, size)}, &BatchOpts{ID: "b"})
	require.ErrorIs(t, err, ErrTooLarge)
	_, err = f.q.Batch(f.ctx, "b")
	require.ErrorIs(t, err, ErrBatchNotFound, "nothing was written")
	_, err = f.q.Get(f.ctx, "c")
	require.ErrorIs(t, err, ErrNotFound)
}

// A batch whose last job is canceled while it runs writes its callback
// due once that run's lease ends: the handler may still be stopping, and
// the callback runs only once every job of the batch has finished.
func TestBatchCallbackOfAJobCanceledWhileItRanIsDueAfterItsLease(t *testing.T) {
	t.Parallel()
	for _, chain := range []bool{false, true} {
		f := setup(t, &Config{Lease: time.Minute})
		var id string
		if chain {
			ids, err := f.q.EnqueueChain(f.ctx, specs("s", 2), &ChainOpts{Condition: BatchAllFinished})
			require.NoError(t, err)
			id = ids[1]
		} else {
			b, _, err := f.q.EnqueueBatch(f.ctx, specs("c", 1), JobSpec{Type: "done"}, nil)
			require.NoError(t, err)
			id = b.ID
		}
		j, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		_, err = f.q.Cancel(f.ctx, j.ID)
		require.NoError(t, err)
		cb := callbackOf(t, f, id)
		require.NotNil(t, cb, "written by the cancel")
		require.Equal(t, StatePending, cb.State)
		_, err = f.q.Claim(f.ctx, "w")
		require.ErrorIs(t, err, ErrNoJob, "not while the canceled run's lease may be in force")
		f.clock.Advance(time.Minute + time.Millisecond)
		c, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		require.Equal(t, id, c.ID)
	}
}

// The same holds for a job canceled while it ran before the batch's last
// job finished: the batch keeps that run's lease end until it fires.
func TestBatchCallbackIsDueAfterTheLeaseOfAnyJobCanceledWhileItRan(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: time.Minute})
	b, _, err := f.q.EnqueueBatch(f.ctx, specs("c", 2), JobSpec{Type: "done"}, nil)
	require.NoError(t, err)
	jobs := claimJobs(t, f)
	require.Len(t, jobs, 2)
	_, err = f.q.Cancel(f.ctx, jobs[0].ID)
	require.NoError(t, err)
	f.clock.Advance(30 * time.Second)
	_, err = f.q.Complete(f.ctx, jobs[1], nil)
	require.NoError(t, err)
	require.NotNil(t, callbackOf(t, f, b.ID))
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob, "not while the canceled run's lease may be in force")
	f.clock.Advance(30*time.Second + time.Millisecond)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	require.Equal(t, b.ID, c.ID)
	verifyClean(t, f, "the batch's counts agree with its jobs")
}

// The bulk operations count each job they move once: RetryFailed back to
// pending, CancelPending as canceled, DeleteFinished not at all.
func TestBatchCountsTheBulkOperations(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{MaxAttempts: 1})
	b, _, err := f.q.EnqueueBatch(f.ctx, specs("c", 6), JobSpec{Type: "done"}, nil)
	require.NoError(t, err)
	jobs := claimJobs(t, f)
	require.Len(t, jobs, 6)
	_, err = f.q.Fail(f.ctx, jobs[0], ErrSkipRetry)
	require.NoError(t, err)
	_, err = f.q.Fail(f.ctx, jobs[1], ErrSkipRetry)
	require.NoError(t, err)
	_, err = f.q.Complete(f.ctx, jobs[2], nil)
	require.NoError(t, err)
	_, err = f.q.Release(f.ctx, jobs[3])
	require.NoError(t, err)
	_, err = f.q.Release(f.ctx, jobs[4])
	require.NoError(t, err)
	verifyClean(t, f, "a failure, a success, two released")
	_, err = f.q.RetryFailed(f.ctx, "c")
	require.NoError(t, err)
	require.Equal(t, [4]int{5, 1, 0, 0}, countsOf(t, f, b.ID))
	verifyClean(t, f, "the failed jobs retried")
	_, err = f.q.CancelPending(f.ctx, "c")
	require.NoError(t, err)
	require.Equal(t, [4]int{1, 1, 0, 4}, countsOf(t, f, b.ID))
	verifyClean(t, f, "the pending jobs canceled")
	_, err = f.q.DeleteFinished(f.ctx, StateCanceled, "c")
	require.NoError(t, err)
	require.Equal(t, [4]int{1, 1, 0, 4}, countsOf(t, f, b.ID))
	verifyClean(t, f, "the canceled jobs deleted")
	_, err = f.q.Cancel(f.ctx, jobs[5].ID)
	require.NoError(t, err)
	require.Equal(t, [4]int{0, 1, 0, 5}, countsOf(t, f, b.ID))
	require.NotNil(t, callbackOf(t, f, b.ID))
	verifyClean(t, f, "the last one canceled")
}

// Whatever path ends a batch's last job, a call made again after its EXEC
// reply was lost counts the job once and writes the callback once.
func TestBatchCountsOnceWhenTheReplyOfAnyLastOutcomeIsLost(t *testing.T) {
	t.Parallel()
	cut, proxy := proxiedWithin(t, 5*time.Second) // a slow reply under load is not a cut one (a cut resets the link)
	q := queueOn(t, cut, redistest.Prefix(t), Config{MaxAttempts: 1})
	ctx := t.Context()
	ops := map[string]func(j *Job) error{
		"cancel":       func(j *Job) error { _, err := q.Cancel(ctx, j.ID); return err },
		"fail":         func(j *Job) error { _, err := q.Fail(ctx, j, ErrSkipRetry); return err },
		"delete":       func(j *Job) error { return q.Delete(ctx, j.ID) }, // released first
		"completemany": func(j *Job) error { _, err := q.CompleteMany(ctx, []*Job{j}, nil); return err },
	}
	// A call that could not reach Redis before its EXEC wrote nothing
	// (ErrUnreachable): a caller calls again. Seen under a loaded CI,
	// where a read through the proxy timed out, in the set-up's calls as
	// in the ones under test; each such retry is logged.
	reached := func(what string, call func() error) error {
		err := call()
		for try := 1; errors.Is(err, ErrUnreachable) && try < 5; try++ {
			t.Logf("%s: nothing written, called again: %v", what, err)
			err = call()
		}
		return err
	}
	for name, do := range ops {
		bid := "b-" + name
		require.NoError(t, reached(name+", enqueue", func() error {
			_, _, err := q.EnqueueBatch(ctx, specs("c", 2), JobSpec{Type: "done"}, &BatchOpts{ID: bid})
			return err
		}))
		var jobs []*Job
		for range 2 {
			var j *Job
			require.NoError(t, reached(name+", claim", func() (err error) { j, err = q.Claim(ctx, "w"); return err }))
			jobs = append(jobs, j)
		}
		require.NoError(t, reached(name+", complete", func() error { _, err := q.Complete(ctx, jobs[0], nil); return err }))
		if name == "delete" {
			require.NoError(t, reached(name+", release", func() error { _, err := q.Release(ctx, jobs[1]); return err }))
		}
		again := func(what string) error { return reached(name+", "+what, func() error { return do(jobs[1]) }) }
		proxy.Set(faultproxy.Faults{ExecCutProb: 1})
		err := again("the call whose reply is cut")
		proxy.Set(faultproxy.Faults{})
		require.ErrorIs(t, err, ErrOutcomeUnknown, name)
		err = again("the call made again")
		if name == "delete" {
			require.ErrorIs(t, err, ErrNotFound, "deleted by the call whose reply was lost")
		} else {
			require.NoError(t, err, "%s finds its own write", name)
		}
		b, err := q.Batch(ctx, bid)
		require.NoError(t, err)
		require.Equal(t, 0, b.Pending, name)
		require.Equal(t, 2, b.Succeeded+b.Failed+b.Canceled, name)
		cb, err := q.Get(ctx, bid)
		require.NoError(t, err)
		require.Equal(t, uint64(1), cb.Rev, name)
		_, err = q.Cancel(ctx, bid)
		require.NoError(t, err)
	}
}
