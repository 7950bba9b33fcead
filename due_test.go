package jobkey

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/readahead"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// On a cluster with a master down, Work's claims go on within the bound on
// the live masters, and a job on the master's shards is claimed soon
// after it is back. A read of the dead node takes the client's dial
// retries (seconds, with go-redis's defaults); the pool used to stop
// handing out each time the node's down mark expired, until such a read
// answered, and the claims, batched together, all waited for it.
func TestClusterWorkClaimsDueJobsWithinBoundWhileAMasterIsDown(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3, "--cluster-require-full-coverage", "no")
	ctx := context.Background()
	cfg := &Config{Prefix: redistest.Prefix(t), Logger: quietLog()}
	q, err := NewQueue(cl.Client(t, nil), "q", cfg)
	require.NoError(t, err)
	producer, err := NewQueue(cl.Client(t, nil), "q", cfg) // another process
	require.NoError(t, err)
	master := func(shard int) int {
		return nodeOf(t, q.rdb.(*redis.ClusterClient), cl, q.ks.jobKey(shard, "x"))
	}
	busy, dead := 0, 2
	require.NotEqual(t, dead, master(busy))
	var live, gone []int // shards of the other live master, and of the dead one
	for s := 1; s < q.ks.shards; s++ {
		switch master(s) {
		case dead:
			gone = append(gone, s)
		case master(busy):
		default:
			live = append(live, s)
		}
	}
	require.GreaterOrEqual(t, len(live), 3)
	require.NotEmpty(t, gone)
	specs := make([]JobSpec, 1500)
	for i := range specs {
		specs[i] = JobSpec{Type: "t", Opts: &EnqueueOpts{ID: idOnShard(q, fmt.Sprintf("b%d-", i), busy)}}
	}
	_, err = q.EnqueueMany(ctx, specs)
	require.NoError(t, err)
	cl.Nodes[dead].Stop()
	jobs := []dueJob{
		{id: idOnShard(q, "hi-", live[0]), prio: MaxPriority, delay: 300 * time.Millisecond},
		{id: idOnShard(q, "lo-", live[len(live)-1]), prio: 0},
		{id: idOnShard(q, "late-", live[len(live)/2]), prio: 0, delay: 300 * time.Millisecond},
	}
	for id, d := range dueLatencies(t, q, producer, jobs) {
		require.LessOrEqual(t, d, claimBound+250*time.Millisecond, "job %s started %v after coming due", id, d)
	}

	cl.Nodes[dead].Relaunch(t)
	require.NoError(t, cl.WaitOK(30*time.Second))
	back := []dueJob{{id: idOnShard(q, "back-", gone[0]), prio: 0}}
	for id, d := range dueLatencies(t, q, producer, back) {
		// Seen again by the next read of the shards that were out.
		require.LessOrEqual(t, d, downFor+claimBound+250*time.Millisecond, "job %s started %v after coming due", id, d)
	}
}

// A job that comes due is claimed within claimBound while Work's slots take
// from the read-ahead pool: the pool serves a shard's read for at most
// readahead.Fresh, and a shard's candidates wait at most readahead.Starve.
func TestReadAheadStaysWithinTheClaimBound(t *testing.T) {
	t.Parallel()
	require.LessOrEqual(t, readahead.Fresh+readahead.Starve, claimBound, "the bound docs/design.md states")
}
