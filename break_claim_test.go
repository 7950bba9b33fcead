package jobkey

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// BREAK: claimBatch returns (nil, err) when a later round fails, dropping
// the jobs that an earlier round of the same call already claimed (their
// EXEC committed). The caller is told "nothing claimed" for a job that is
// now active under its name: nobody runs it, it waits out a whole lease,
// and its attempt is spent. With MaxAttempts 1 the job then fails for good
// without ever having run.
func TestBreakClaimManyDropsJobsOfEarlierRounds(t *testing.T) {
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

// BREAK: the same defect through group commit: concurrent Claim calls that
// share a flush go through claimBatch, and a caller whose job was claimed
// in round 1 gets round 2's error instead. In Work that slot logs "claim
// failed"; the job sits leased to nobody until its lease runs out.
func TestBreakGroupClaimDropsJobsOfEarlierRounds(t *testing.T) {
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
	require.Eventually(t, func() bool {
		q.claims.mu.Lock()
		defer q.claims.mu.Unlock()
		return len(q.claims.queue) == 2
	}, 5*time.Second, time.Millisecond)
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
