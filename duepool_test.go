package jobkey

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// read returns a view of shards, read now, holding cands.
func read(shards []int, cands ...candidate) dueView {
	return dueView{cands: cands, shards: shards, full: -1, at: time.Now()}
}

// A read ahead made while claims were in flight does not hand their
// candidates out again: two transactions watching one candidate would
// both be retried.
func TestDuePoolForgetsNothingTakenLately(t *testing.T) {
	p := newDuePool(3, nil)
	all := []int{0, 1, 2}
	a, b, c := candidate{id: "a"}, candidate{id: "b"}, candidate{id: "c"}
	p.fill(read(all, a, b))
	first := p.take(1, anyShard) // at random within a priority
	require.Len(t, first, 1)
	p.fill(read(all, a, b, c)) // read while the first's claim was in flight
	rest := []candidate{a, b, c}
	rest = slices.DeleteFunc(rest, func(x candidate) bool { return x == first[0] })
	require.ElementsMatch(t, rest, p.take(5, anyShard))
	require.Empty(t, p.take(5, anyShard))
	p.fill(read(all, candidate{id: "d", shard: 1}, candidate{id: "e", shard: 2}))
	require.Equal(t, []candidate{{id: "e", shard: 2}}, p.take(5, 2), "only the shard asked for")
	// Candidates taken and not tried go back, and are handed out again.
	got := p.take(5, anyShard)
	require.Equal(t, []candidate{{id: "d", shard: 1}}, got)
	p.putBack(got)
	require.Equal(t, got, p.take(5, anyShard))
	// Higher priorities are handed out first.
	lo, hi := candidate{id: "lo", prio: 0}, candidate{id: "hi", prio: 3}
	p.fill(read(all, lo, hi))
	require.Equal(t, []candidate{hi}, p.take(1, anyShard))
	p.drop()
	require.Empty(t, p.take(5, anyShard), "dropped")
}

// The pool hands out nothing while one shard's read is older than
// poolFresh, or was never made: a job due there would be passed over.
func TestDuePoolServesOnlyWhileEveryShardIsFresh(t *testing.T) {
	require.LessOrEqual(t, poolFresh+poolStarve, claimBound, "the bound docs/design.md states")
	p := newDuePool(2, nil)
	p.fill(read([]int{0}, candidate{id: "a", shard: 0}))
	require.Empty(t, p.take(1, anyShard), "shard 1 was never read")
	require.False(t, p.complete())
	p.fill(read([]int{1}))
	require.True(t, p.complete())
	old := read([]int{1})
	old.at = time.Now().Add(-poolFresh - time.Millisecond)
	p.shards[1].read = old.at
	require.Empty(t, p.take(1, anyShard), "shard 1's read is stale")
	require.False(t, p.complete())
	p.fill(read([]int{1}))
	require.Equal(t, []candidate{{id: "a", shard: 0}}, p.take(1, anyShard))
	// A read of every shard is announced once, while one is due.
	p.shards[1].read = time.Now().Add(-poolFresh/2 - time.Millisecond)
	require.True(t, p.refreshDue())
	require.False(t, p.refreshDue(), "one is under way")
	p.fill(read([]int{0, 1}))
	p.refreshed()
	require.False(t, p.refreshDue(), "every shard was read just now")
	// A shard no read reaches (its node is down) does not hold it up.
	q := newDuePool(2, func(s int) bool { return s == 1 })
	q.fill(read([]int{0}, candidate{id: "a", shard: 0}))
	require.Equal(t, []candidate{{id: "a", shard: 0}}, q.take(1, anyShard))
}

// Within a priority the shards take turns, the one waiting longest first:
// one job on a quiet shard goes next, not after a busy shard's backlog.
func TestDuePoolServesShardsInTurn(t *testing.T) {
	p := newDuePool(2, nil)
	var busy []candidate
	for _, id := range []string{"b1", "b2", "b3", "b4"} {
		busy = append(busy, candidate{id: id, shard: 0})
	}
	p.fill(read([]int{0, 1}, busy...))
	first := p.take(1, anyShard)
	p.served(first)
	p.fill(read([]int{1}, candidate{id: "q", shard: 1}))
	// The busy shard has waited since it was served, the quiet one since
	// it was read: the busy one's turn comes first, then the quiet one's.
	next := p.take(1, anyShard)
	p.served(next)
	require.Equal(t, 0, next[0].shard)
	require.Equal(t, "q", p.take(1, anyShard)[0].id, "the quiet shard's turn")
	require.Len(t, p.take(3, anyShard), 2)
	// A take drains the shard whose turn it is before the next one's, so
	// a transaction touches few shards.
	p.fill(read([]int{0, 1}, candidate{id: "x1"}, candidate{id: "x2"}, candidate{id: "y1", shard: 1}, candidate{id: "y2", shard: 1}))
	p.shards[1].waiting = p.shards[0].waiting.Add(-time.Millisecond)
	got := p.take(3, anyShard)
	require.Equal(t, []int{1, 1, 0}, []int{got[0].shard, got[1].shard, got[2].shard})
}

// A taker bound to one shard (a cluster's slot) takes none of its shard's
// candidates while another shard holds a higher priority, or has waited
// past poolStarve at the same priority; oneShard takes the shard whose
// turn it is, and only its candidates.
func TestDuePoolBoundTakerYields(t *testing.T) {
	p := newDuePool(3, nil)
	all := []int{0, 1, 2}
	p.fill(read(all, candidate{id: "a1"}, candidate{id: "a2"}, candidate{id: "b", shard: 1, prio: 5}))
	require.Empty(t, p.take(1, 0), "shard 1 holds a higher priority")
	got := p.take(2, oneShard)
	require.Equal(t, []candidate{{id: "b", shard: 1, prio: 5}}, got, "the higher priority's shard, and only it")
	p.served(got)
	p.fill(read(all, candidate{id: "a1"}, candidate{id: "a2"}, candidate{id: "c", shard: 2}))
	require.Len(t, p.take(1, 0), 1, "shard 2 has not waited long")
	p.shards[2].waiting = time.Now().Add(-poolStarve - time.Millisecond)
	require.Empty(t, p.take(1, 0), "shard 2 waited too long")
	require.Equal(t, "c", p.take(1, oneShard)[0].id)
	// Chosen, a shard fills the batch, however long the others waited.
	p.fill(read(all, candidate{id: "e1"}, candidate{id: "e2"}, candidate{id: "e3"}, candidate{id: "d", shard: 1}))
	p.shards[0].waiting = time.Now().Add(-2 * poolStarve)
	p.shards[1].waiting = time.Now().Add(-poolStarve - time.Millisecond)
	got = p.take(3, oneShard)
	require.Len(t, got, 3)
	for _, c := range got {
		require.Equal(t, 0, c.shard)
	}
}

// A hint of a priority drops what is below it, and nothing below it goes
// again until every shard was read after the hint: the job it announced
// may lie on any.
func TestDuePoolHintHoldsLowerPrioritiesUntilEveryShardIsRead(t *testing.T) {
	p := newDuePool(2, nil)
	p.fill(read([]int{0, 1}, candidate{id: "lo"}, candidate{id: "mid", shard: 1, prio: 4}))
	p.dropBelow(4)
	require.False(t, p.complete())
	p.fill(read([]int{0}, candidate{id: "lo"}))
	require.Equal(t, "mid", p.take(1, anyShard)[0].id, "what the hint's priority passes still goes")
	require.Empty(t, p.take(1, anyShard), "shard 1 was not read since the hint")
	require.Equal(t, []int{1}, p.stale([]int{0}, 4), "the read ahead refreshes it first")
	p.fill(read([]int{1}))
	require.True(t, p.complete())
	require.Equal(t, "lo", p.take(1, anyShard)[0].id)
}

// A fused transaction skips its read ahead only while the pool can serve
// the takes that follow from a fresh read: twice the candidates wanted,
// every shard read within poolFresh/2 (so it is read again before the
// pool stops serving it) and after the last hint of a priority.
func TestDuePoolHoldsEnoughOnlyWhileFreshAndAfterEveryHint(t *testing.T) {
	p := newDuePool(2, nil)
	require.False(t, p.holds(0, nil), "never read")
	four := []candidate{{id: "a"}, {id: "b"}, {id: "c", shard: 1}, {id: "d", shard: 1}}
	p.fill(read([]int{0, 1}, four...))
	require.True(t, p.holds(2, nil), "4 candidates for 2 wanted")
	require.False(t, p.holds(3, nil), "4 candidates for 3 wanted")
	require.True(t, p.holds(0, nil))
	require.True(t, p.holds(1, []int{1}), "a cluster's transaction counts its own shards")
	require.False(t, p.holds(2, []int{1}))

	// A shard read more than poolFresh/2 ago is read again, while the pool
	// still serves it.
	p.shards[1].read = time.Now().Add(-poolFresh/2 - 10*time.Millisecond)
	require.False(t, p.holds(1, nil), "shard 1's read is getting old")
	require.True(t, p.holds(1, []int{0}), "shard 0's is not")
	require.NotEmpty(t, p.take(1, anyShard), "the pool still serves: the read comes before it stops")
	p.fill(read([]int{0, 1}, four...))
	require.True(t, p.holds(1, nil))

	// A hint of a priority: the read follows at once, on every shard, even
	// while the pool holds enough of that priority: the job it announced
	// may lie on any shard.
	p.dropBelow(0)
	require.True(t, p.holds(1, nil), "a hint of priority 0 holds nothing back")
	sevens := []candidate{{id: "s1", prio: 7}, {id: "s2", prio: 7}, {id: "s3", shard: 1, prio: 7}}
	p.fill(read([]int{0, 1}, sevens...))
	require.True(t, p.holds(1, nil))
	p.dropBelow(7)
	require.False(t, p.holds(1, nil), "a job of priority 7 came due somewhere")
	p.fill(read([]int{0}, sevens[:2]...))
	require.False(t, p.holds(1, nil), "shard 1 is not read since the hint")
	p.fill(read([]int{1}, sevens[2]))
	require.True(t, p.holds(1, nil))

	// Candidates below the priority a full window holds are not counted:
	// the pool would not hand them out.
	full := read([]int{0, 1}, candidate{id: "x", prio: 3}, candidate{id: "lo1"}, candidate{id: "lo2"})
	full.full = 3
	p.fill(full)
	require.False(t, p.holds(1, nil), "one candidate the pool would hand out")
}

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
