package jobkey

import (
	"context"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/faultproxy"
	"github.com/jobkey/jobkey/internal/redistest"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Regression, found in review: the read ahead of the fused transaction
// (readAhead) does not drop an ID found in both ready and leased (a stray
// entry), as dueIn does ("one transaction must not decide about one job
// twice"). The pool then holds the job twice, and the next ClaimMany (or a
// group of concurrent Claims, both go through claimBatch) takes both
// entries into one block: the engine refuses the transaction with
// "internal error: transaction names key twice", and the caller gets that
// error instead of the due job.
func TestClaimManyFromReadAheadWithStrayEntry(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "a"})
	require.NoError(t, err)
	a, err := f.q.Claim(f.ctx, "w") // nothing else due: the pool stays empty
	require.NoError(t, err)
	x, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "x"})
	require.NoError(t, err)
	// A stray entry: x is pending in ready, and also listed in leased as due.
	past := float64(toMillis(f.clock.Now()) - 1000)
	require.NoError(t, f.rdb.ZAdd(f.ctx, f.q.Keys("x").Leased, redis.Z{Score: past, Member: "x"}).Err())

	// The fused completion (wanting no next job) reads ahead both entries of x.
	out, err := f.q.completeAndClaim(f.ctx, a, nil, "")
	require.NoError(t, err)
	require.Nil(t, out.next)

	got, err := f.q.ClaimMany(f.ctx, "w", 2)
	require.NoError(t, err, "a due job and a stray hint: the claim takes the job")
	require.Len(t, got, 1)
	require.Equal(t, x.ID, got[0].ID)
}

// Regression, found in review: a candidate taken from the pool was claimed
// with its shard's ready and leased indexes passed to the engine as
// "verified" (casTxn.verified, since removed), though nothing in this
// transaction read them: they were read by an earlier claim or read ahead, up to poolTTL
// (500 ms) before. If one of them was replaced meanwhile by a value of
// another type, the type check that must refuse the transaction before
// MULTI (docs/design.md, "types are checked before MULTI") is skipped, and
// EXEC applies half the plan: the candidate's value is set active and its
// ready entry removed, but its leased entry is not written (WRONGTYPE).
// The job is then active with no index entry at all: once its lease runs
// out, and even after the broken index is repaired, no claimer ever finds
// it again.
func TestPooledCandidateIndexTypeCheckedBeforeMulti(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2, Logger: quietLog()})
	// One job in each shard.
	ids := map[int]string{}
	for i := 0; len(ids) < 2; i++ {
		id := "j" + string(rune('a'+i))
		if _, ok := ids[f.q.ks.shardOf(id)]; !ok {
			ids[f.q.ks.shardOf(id)] = id
		}
	}
	for _, id := range ids {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id})
		require.NoError(t, err)
	}
	first, err := f.q.Claim(f.ctx, "w") // the other job, of the other shard, waits in the pool
	require.NoError(t, err)
	other := ids[1-f.q.ks.shardOf(first.ID)]
	leased := f.q.Keys(other).Leased
	// The other shard's leased index is replaced by a string (forged, or a
	// stray write of another program) while the pool holds its job.
	require.NoError(t, f.rdb.Set(f.ctx, leased, "not a zset", 0).Err())

	out, err := f.q.completeAndClaim(f.ctx, first, []byte("r"), "w")
	t.Logf("fused: next %v, err %v", out.next != nil, err)
	require.ErrorIs(t, err, ErrWrongType, "refused before MULTI")
	require.Nil(t, out.next)
	require.Equal(t, StatePending, state(t, f.q, other), "nothing was written")
	_, err = f.q.Complete(f.ctx, first, []byte("r")) // as Work's record does after a refused fusion
	require.NoError(t, err)

	// The index is repaired; the job must be claimable (now, or once a
	// lease it got has run out).
	require.NoError(t, f.rdb.Del(f.ctx, leased).Err())
	f.clock.Advance(f.q.cfg.Lease + time.Second)
	got, err := f.q.Claim(f.ctx, "w2")
	stored, _ := f.q.Get(f.ctx, other)
	require.NoError(t, err, "job %s is %s, in no index: nobody will ever claim it", other, stored.State)
	require.Equal(t, other, got.ID)
}

// Regression, found in review: a fused transaction whose EXEC reply is lost
// stranded the job it claimed for the slot (docs/design.md §9 said it "is
// then claimed again, as after a crashed worker"). Nothing crashed: the
// retried completion recognises its own write, but nobody looked for the
// claim, although its lease token is known. The stranded claim spent an
// attempt of a job that never ran: on its last attempt (MaxAttempts 1 here)
// the next claim after the lease fails it for good ("lease of attempt 1/1
// expired before it finished"), and its handler never runs at all. Before
// the fused path a lost completion reply cost nothing to any other job.
func TestLostFusedReplyDoesNotFailUnrunJob(t *testing.T) {
	t.Parallel()
	cut, proxy := proxied(t)
	const lease = 500 * time.Millisecond
	q := queueOn(t, cut, redistest.Prefix(t), Config{Lease: lease, Logger: quietLog()})
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: id, MaxAttempts: 1})
		require.NoError(t, err)
	}
	first, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	other := "b"
	if first.ID == "b" {
		other = "a"
	}
	proxy.Set(faultproxy.Faults{ExecCutProb: 1})
	out, err := q.completeAndClaim(ctx, first, []byte("r"), "w")
	proxy.Set(faultproxy.Faults{})
	require.ErrorIs(t, err, ErrOutcomeUnknown, "the EXEC was sent; its reply was lost")
	_, err = q.Complete(ctx, first, []byte("r")) // as Work's record does
	require.NoError(t, err, "the retried completion recognises its own write")
	// The claim made by the lost EXEC is found by its lease token and
	// handed to the slot, which runs it and completes it.
	require.NotNil(t, out.unsure, "the claim the lost EXEC made is handed over, to be looked for")
	next := (&worker{q: q}).findClaim(ctx, out.unsure, time.Now())
	require.NotNil(t, next, "the claim the lost EXEC made is found by its token")
	require.Equal(t, other, next.ID)
	require.Equal(t, StateActive, next.State)
	done, err := q.Complete(ctx, next, nil)
	require.NoError(t, err, "the slot holds the lease it was handed")
	require.Equal(t, StateSucceeded, done.State)
	time.Sleep(lease + 100*time.Millisecond)
	_, err = q.Claim(ctx, "w2")
	require.ErrorIs(t, err, ErrNoJob, "nothing stranded, nothing left to fail")
}

// Regression, found in review: nothing checked that the ID inside a stored
// value is the ID of its key. A value copied (or forged) from job y to the
// key of job x was claimed as x, and the handler ran y's payload. It is
// corrupt now: Get says so, and a claimer sets it aside with its bytes
// untouched.
func TestValueNamingAnotherJobIsCorrupt(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	_, err := f.q.Enqueue(f.ctx, "t", []byte("x's payload"), &EnqueueOpts{ID: "x"})
	require.NoError(t, err)
	_, err = f.q.Enqueue(f.ctx, "t", []byte("y's payload"), &EnqueueOpts{ID: "y", Delay: time.Hour})
	require.NoError(t, err)
	ky, kx := f.q.Keys("y").Job, f.q.Keys("x").Job
	raw, err := f.rdb.Get(f.ctx, ky).Result()
	require.NoError(t, err)
	require.NoError(t, f.rdb.Set(f.ctx, kx, raw, 0).Err()) // x's key now holds y's value

	_, err = f.q.Get(f.ctx, "x")
	require.ErrorIs(t, err, ErrCorrupt)
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob, "y is not due, and x's value is not x")
	after, err := f.rdb.Get(f.ctx, kx).Result()
	require.NoError(t, err)
	require.Equal(t, raw, after, "the bytes are kept")
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Corrupt)
	rep, err := f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "x's hint is in corrupt, where Verify expects a value that is not x's")
}
