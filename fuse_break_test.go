package jobkey

import (
	"testing"

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
