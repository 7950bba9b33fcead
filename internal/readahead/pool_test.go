package readahead

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// read returns a view of shards, read now, holding cands.
func read(shards []int, cands ...Candidate) View {
	return View{Cands: cands, Shards: shards, Full: -1, At: time.Now()}
}

// A read ahead made while claims were in flight does not hand their
// Candidates out again: two transactions watching one Candidate would
// both be retried.
func TestForgetsNothingTakenLately(t *testing.T) {
	p := New(3, nil, nil, time.Second)
	all := []int{0, 1, 2}
	a, b, c := Candidate{ID: "a"}, Candidate{ID: "b"}, Candidate{ID: "c"}
	p.Fill(read(all, a, b))
	first := p.Take(1, AnyShard) // at random within a priority
	require.Len(t, first, 1)
	p.Fill(read(all, a, b, c)) // read while the first's claim was in flight
	rest := []Candidate{a, b, c}
	rest = slices.DeleteFunc(rest, func(x Candidate) bool { return x == first[0] })
	require.ElementsMatch(t, rest, p.Take(5, AnyShard))
	require.Empty(t, p.Take(5, AnyShard))
	p.Fill(read(all, Candidate{ID: "d", Shard: 1}, Candidate{ID: "e", Shard: 2}))
	require.Equal(t, []Candidate{{ID: "e", Shard: 2}}, p.Take(5, 2), "only the shard asked for")
	// Candidates taken and not tried go back, and are handed out again.
	got := p.Take(5, AnyShard)
	require.Equal(t, []Candidate{{ID: "d", Shard: 1}}, got)
	p.PutBack(got)
	require.Equal(t, got, p.Take(5, AnyShard))
	// Higher priorities are handed out first.
	lo, hi := Candidate{ID: "lo", Prio: 0}, Candidate{ID: "hi", Prio: 3}
	p.Fill(read(all, lo, hi))
	require.Equal(t, []Candidate{hi}, p.Take(1, AnyShard))
	p.Drop()
	require.Empty(t, p.Take(5, AnyShard), "dropped")
}

// The pool hands out nothing while one shard's read is older than
// Fresh, or was never made: a job due there would be passed over.
func TestServesOnlyWhileEveryShardIsFresh(t *testing.T) {
	p := New(2, nil, nil, time.Second)
	p.Fill(read([]int{0}, Candidate{ID: "a", Shard: 0}))
	require.Empty(t, p.Take(1, AnyShard), "shard 1 was never read")
	require.False(t, p.Complete())
	p.Fill(read([]int{1}))
	require.True(t, p.Complete())
	old := read([]int{1})
	old.At = time.Now().Add(-Fresh - time.Millisecond)
	p.shards[1].read = old.At
	require.Empty(t, p.Take(1, AnyShard), "shard 1's read is stale")
	require.False(t, p.Complete())
	p.Fill(read([]int{1}))
	require.Equal(t, []Candidate{{ID: "a", Shard: 0}}, p.Take(1, AnyShard))
	// A read of every shard is announced once, while one is due.
	p.shards[1].read = time.Now().Add(-Fresh/2 - time.Millisecond)
	require.True(t, p.RefreshDue())
	require.False(t, p.RefreshDue(), "one is under way")
	p.Fill(read([]int{0, 1}))
	p.Refreshed()
	require.False(t, p.RefreshDue(), "every shard was read just now")
	// A shard no read reaches (its node is down) does not hold it up.
	q := New(2, func(s int) bool { return s == 1 }, nil, time.Second)
	q.Fill(read([]int{0}, Candidate{ID: "a", Shard: 0}))
	require.Equal(t, []Candidate{{ID: "a", Shard: 0}}, q.Take(1, AnyShard))
}

// Within a priority the shards take turns, the one waiting longest first:
// one job on a quiet shard goes next, not after a busy shard's backlog.
func TestServesShardsInTurn(t *testing.T) {
	p := New(2, nil, nil, time.Second)
	var busy []Candidate
	for _, id := range []string{"b1", "b2", "b3", "b4"} {
		busy = append(busy, Candidate{ID: id, Shard: 0})
	}
	p.Fill(read([]int{0, 1}, busy...))
	first := p.Take(1, AnyShard)
	p.Served(first)
	p.Fill(read([]int{1}, Candidate{ID: "q", Shard: 1}))
	// The busy shard has waited since it was served, the quiet one since
	// it was read: the busy one's turn comes first, then the quiet one's.
	next := p.Take(1, AnyShard)
	p.Served(next)
	require.Equal(t, 0, next[0].Shard)
	require.Equal(t, "q", p.Take(1, AnyShard)[0].ID, "the quiet shard's turn")
	require.Len(t, p.Take(3, AnyShard), 2)
	// A take drains the shard whose turn it is before the next one's, so
	// a transaction touches few shards.
	p.Fill(read([]int{0, 1}, Candidate{ID: "x1"}, Candidate{ID: "x2"}, Candidate{ID: "y1", Shard: 1}, Candidate{ID: "y2", Shard: 1}))
	p.shards[1].waiting = p.shards[0].waiting.Add(-time.Millisecond)
	got := p.Take(3, AnyShard)
	require.Equal(t, []int{1, 1, 0}, []int{got[0].Shard, got[1].Shard, got[2].Shard})
}

// A taker bound to one shard (a cluster's slot) takes none of its shard's
// Candidates while another shard holds a higher priority, or has waited
// past Starve at the same priority; OneShard takes the shard whose
// turn it is, and only its Candidates.
func TestBoundTakerYields(t *testing.T) {
	p := New(3, nil, nil, time.Second)
	all := []int{0, 1, 2}
	p.Fill(read(all, Candidate{ID: "a1"}, Candidate{ID: "a2"}, Candidate{ID: "b", Shard: 1, Prio: 5}))
	require.Empty(t, p.Take(1, 0), "shard 1 holds a higher priority")
	got := p.Take(2, OneShard)
	require.Equal(t, []Candidate{{ID: "b", Shard: 1, Prio: 5}}, got, "the higher priority's shard, and only it")
	p.Served(got)
	p.Fill(read(all, Candidate{ID: "a1"}, Candidate{ID: "a2"}, Candidate{ID: "c", Shard: 2}))
	require.Len(t, p.Take(1, 0), 1, "shard 2 has not waited long")
	p.shards[2].waiting = time.Now().Add(-Starve - time.Millisecond)
	require.Empty(t, p.Take(1, 0), "shard 2 waited too long")
	require.Equal(t, "c", p.Take(1, OneShard)[0].ID)
	// Chosen, a shard fills the batch, however long the others waited.
	p.Fill(read(all, Candidate{ID: "e1"}, Candidate{ID: "e2"}, Candidate{ID: "e3"}, Candidate{ID: "d", Shard: 1}))
	p.shards[0].waiting = time.Now().Add(-2 * Starve)
	p.shards[1].waiting = time.Now().Add(-Starve - time.Millisecond)
	got = p.Take(3, OneShard)
	require.Len(t, got, 3)
	for _, c := range got {
		require.Equal(t, 0, c.Shard)
	}
}

// A hint of a priority drops what is below it, and nothing below it goes
// again until every shard was read after the hint: the job it announced
// may lie on any.
func TestHintHoldsLowerPrioritiesUntilEveryShardIsRead(t *testing.T) {
	p := New(2, nil, nil, time.Second)
	p.Fill(read([]int{0, 1}, Candidate{ID: "lo"}, Candidate{ID: "mid", Shard: 1, Prio: 4}))
	p.DropBelow(4)
	require.False(t, p.Complete())
	p.Fill(read([]int{0}, Candidate{ID: "lo"}))
	require.Equal(t, "mid", p.Take(1, AnyShard)[0].ID, "what the hint's priority passes still goes")
	require.Empty(t, p.Take(1, AnyShard), "shard 1 was not read since the hint")
	require.Equal(t, []int{1}, p.Stale([]int{0}, 4), "the read ahead refreshes it first")
	p.Fill(read([]int{1}))
	require.True(t, p.Complete())
	require.Equal(t, "lo", p.Take(1, AnyShard)[0].ID)
}

// A fused transaction skips its read ahead only while the pool can serve
// the takes that follow from a fresh read: twice the Candidates wanted,
// every shard read within Fresh/2 (so it is read again before the
// pool stops serving it) and after the last hint of a priority.
func TestHoldsEnoughOnlyWhileFreshAndAfterEveryHint(t *testing.T) {
	p := New(2, nil, nil, time.Second)
	require.False(t, p.Holds(0, nil), "never read")
	four := []Candidate{{ID: "a"}, {ID: "b"}, {ID: "c", Shard: 1}, {ID: "d", Shard: 1}}
	p.Fill(read([]int{0, 1}, four...))
	require.True(t, p.Holds(2, nil), "4 Candidates for 2 wanted")
	require.False(t, p.Holds(3, nil), "4 Candidates for 3 wanted")
	require.True(t, p.Holds(0, nil))
	require.True(t, p.Holds(1, []int{1}), "a cluster's transaction counts its own shards")
	require.False(t, p.Holds(2, []int{1}))

	// A shard read more than Fresh/2 ago is read again, while the pool
	// still serves it.
	p.shards[1].read = time.Now().Add(-Fresh/2 - 10*time.Millisecond)
	require.False(t, p.Holds(1, nil), "shard 1's read is getting old")
	require.True(t, p.Holds(1, []int{0}), "shard 0's is not")
	require.NotEmpty(t, p.Take(1, AnyShard), "the pool still serves: the read comes before it stops")
	p.Fill(read([]int{0, 1}, four...))
	require.True(t, p.Holds(1, nil))

	// A hint of a priority: the read follows at once, on every shard, even
	// while the pool holds enough of that priority: the job it announced
	// may lie on any shard.
	p.DropBelow(0)
	require.True(t, p.Holds(1, nil), "a hint of priority 0 holds nothing back")
	sevens := []Candidate{{ID: "s1", Prio: 7}, {ID: "s2", Prio: 7}, {ID: "s3", Shard: 1, Prio: 7}}
	p.Fill(read([]int{0, 1}, sevens...))
	require.True(t, p.Holds(1, nil))
	p.DropBelow(7)
	require.False(t, p.Holds(1, nil), "a job of priority 7 came due somewhere")
	p.Fill(read([]int{0}, sevens[:2]...))
	require.False(t, p.Holds(1, nil), "shard 1 is not read since the hint")
	p.Fill(read([]int{1}, sevens[2]))
	require.True(t, p.Holds(1, nil))

	// Candidates below the priority a full window holds are not counted:
	// the pool would not hand them out.
	full := read([]int{0, 1}, Candidate{ID: "x", Prio: 3}, Candidate{ID: "lo1"}, Candidate{ID: "lo2"})
	full.Full = 3
	p.Fill(full)
	require.False(t, p.Holds(1, nil), "one Candidate the pool would hand out")
}

// A view that lists a shard twice fills it once, with every candidate of
// that shard, and one whose candidates name a shard it did not read
// leaves them out.
func TestFillsAShardListedTwiceOnce(t *testing.T) {
	p := New(1, nil, nil, time.Second)
	a, b := Candidate{ID: "a", Shard: 0}, Candidate{ID: "b", Shard: 0}
	p.Fill(read([]int{0, 0}, a, b))
	require.ElementsMatch(t, []Candidate{a, b}, p.Take(5, AnyShard))

	p = New(2, nil, nil, time.Second)
	stray := Candidate{ID: "c", Shard: 1}
	p.Fill(read([]int{0}, a, stray))
	p.Fill(read([]int{1})) // every shard read: the pool serves
	require.Equal(t, []Candidate{a}, p.Take(5, AnyShard), "shard 1's read held nothing")
}
