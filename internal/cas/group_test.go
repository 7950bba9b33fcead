package cas

import (
	"context"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// groupUnderTest is a Group whose flushes the test holds and sees.
type groupUnderTest struct {
	g       *Group[int, int]
	batches chan []int    // the inputs of every flush, in order
	hold    chan struct{} // a flush waits for a token from here
}

func newGroup(t *testing.T) *groupUnderTest {
	t.Helper()
	gt := &groupUnderTest{batches: make(chan []int, 100), hold: make(chan struct{}, 100)}
	gt.g = &Group[int, int]{Max: 100, Flush: func(ctx context.Context, calls []*Call[int, int]) {
		calls = Live(calls)
		ins := make([]int, len(calls))
		for i, c := range calls {
			ins[i] = c.In()
		}
		gt.batches <- ins
		<-gt.hold
		for _, c := range calls {
			if !c.Gone() { // as a real flush decides: a caller that left is left out
				c.Finish(c.In()*10, nil)
			}
		}
	}}
	return gt
}

// queued reports, for Eventually, whether n calls wait in the queue.
func (gt *groupUnderTest) queued(n int) func() bool {
	return func() bool { gt.g.mu.Lock(); defer gt.g.mu.Unlock(); return len(gt.g.queue) == n }
}

// setFill sets the group's Fill, which a leader may be reading.
func (gt *groupUnderTest) setFill(d time.Duration) {
	gt.g.mu.Lock()
	defer gt.g.mu.Unlock()
	gt.g.Fill = d
}

type result struct {
	out int
	err error
}

func (gt *groupUnderTest) goDo(ctx context.Context, in int) <-chan result {
	ch := make(chan result, 1)
	go func() {
		out, err := gt.g.Do(ctx, in)
		ch <- result{out, err}
	}()
	return ch
}

func TestGroupAloneThenBatched(t *testing.T) {
	t.Parallel()
	gt := newGroup(t)
	ctx := context.Background()
	first := gt.goDo(ctx, 1)
	require.Equal(t, []int{1}, <-gt.batches, "uncontended: a batch of one, at once")
	// While that flush runs, later callers queue up ...
	var later []<-chan result
	for i := 2; i <= 5; i++ {
		later = append(later, gt.goDo(ctx, i))
	}
	require.Eventually(t, gt.queued(4), 5*time.Second, time.Millisecond)
	gt.hold <- struct{}{}
	require.Equal(t, result{10, nil}, <-first)
	// ... and the flush that ends hands them on as one batch.
	require.ElementsMatch(t, []int{2, 3, 4, 5}, <-gt.batches)
	gt.hold <- struct{}{}
	for i, ch := range later {
		require.Equal(t, result{(i + 2) * 10, nil}, <-ch)
	}
	// The leader answers its callers before it looks for a next batch.
	require.Eventually(t, func() bool { gt.g.mu.Lock(); defer gt.g.mu.Unlock(); return gt.g.running == 0 },
		5*time.Second, time.Millisecond, "the group is idle again")
}

// With lanes, a second flush starts only when the one running is
// saturated: callers queue until a full batch waits, and the caller that
// finds one starts a flush at once, which takes the head of the queue.
func TestGroupOpensLaneOnlyWhenSaturated(t *testing.T) {
	t.Parallel()
	gt := newGroup(t)
	gt.g.Lanes, gt.g.Max = 2, 2
	ctx := context.Background()
	calls := []<-chan result{gt.goDo(ctx, 1)}
	require.Equal(t, []int{1}, <-gt.batches)
	for i := 2; i <= 3; i++ {
		calls = append(calls, gt.goDo(ctx, i))
		require.Eventually(t, gt.queued(i-1), 5*time.Second, time.Millisecond, "one lane busy, short of a full batch: the call queues")
	}
	select {
	case b := <-gt.batches:
		t.Fatalf("a lane opened for %v before the first was saturated", b)
	case <-time.After(20 * time.Millisecond):
	}
	calls = append(calls, gt.goDo(ctx, 4))
	require.Equal(t, []int{2, 3}, <-gt.batches, "a full batch queued: a second lane takes it at once")
	require.Eventually(t, gt.queued(1), 5*time.Second, time.Millisecond)
	gt.hold <- struct{}{}
	require.Equal(t, []int{4}, <-gt.batches, "the lane that ended takes the rest")
	gt.hold <- struct{}{}
	gt.hold <- struct{}{}
	for _, ch := range calls {
		r := <-ch
		require.NoError(t, r.err)
	}
	require.Eventually(t, func() bool { gt.g.mu.Lock(); defer gt.g.mu.Unlock(); return gt.g.running == 0 },
		5*time.Second, time.Millisecond, "idle again")
}

// Under load a leader waits up to fill for its next batch to hold as many
// calls as there were callers during its flush, and no longer.
func TestGroupLeaderWaitsBoundedForFullerBatch(t *testing.T) {
	t.Parallel()
	gt := newGroup(t)
	gt.g.Fill = 200 * time.Millisecond
	ctx := context.Background()
	first := gt.goDo(ctx, 1)
	require.Equal(t, []int{1}, <-gt.batches, "a lone caller goes at once")
	second := gt.goDo(ctx, 2)
	require.Eventually(t, gt.queued(1), 5*time.Second, time.Millisecond)
	gt.hold <- struct{}{}
	require.Equal(t, result{10, nil}, <-first)
	// Two callers were in the group during the flush: the leader waits for
	// a second call to join the one queued.
	third := gt.goDo(ctx, 3)
	require.ElementsMatch(t, []int{2, 3}, <-gt.batches, "the answered caller came back within fill: one batch")
	gt.hold <- struct{}{}
	require.Equal(t, result{20, nil}, <-second)
	require.Equal(t, result{30, nil}, <-third)
	// The last batch carried two; none come back, so the leader waits out
	// fill and leaves.
	start := time.Now()
	require.Eventually(t, func() bool { gt.g.mu.Lock(); defer gt.g.mu.Unlock(); return gt.g.running == 0 },
		5*time.Second, time.Millisecond, "idle again")
	require.Less(t, time.Since(start), 2*time.Second, "the wait is bounded")
	h := gt.g.Sizes()
	require.EqualValues(t, 2, h.Flushes)
	require.EqualValues(t, 3, h.Calls)
	require.EqualValues(t, 1, h.Buckets[0])
	require.EqualValues(t, 1, h.Buckets[1])
}

func TestGroupCallerLeavesQueue(t *testing.T) {
	t.Parallel()
	gt := newGroup(t)
	busy := gt.goDo(context.Background(), 1)
	<-gt.batches
	ctx, cancel := context.WithCancel(context.Background())
	queued := gt.goDo(ctx, 2)
	require.Eventually(t, gt.queued(1), 5*time.Second, time.Millisecond)
	cancel()
	r := <-queued
	require.ErrorIs(t, r.err, context.Canceled, "a caller whose ctx ends in the queue leaves it at once")
	gt.g.mu.Lock()
	require.Empty(t, gt.g.queue)
	gt.g.mu.Unlock()
	gt.hold <- struct{}{}
	require.Equal(t, result{10, nil}, <-busy)
	select {
	case b := <-gt.batches:
		t.Fatalf("the caller that left was flushed: %v", b)
	case <-time.After(50 * time.Millisecond):
	}
}

// A caller whose ctx ends while its batch is in flight is answered at
// once, with an error that says the outcome is unknown, and a leader whose
// ctx ends does not stop the flush for the others.
func TestGroupCallerGivesUpMidBatch(t *testing.T) {
	t.Parallel()
	gt := newGroup(t)
	// The leader's flush: it gives up while its flush is held.
	lctx, lcancel := context.WithCancel(context.Background())
	leader := gt.goDo(lctx, 1)
	require.Equal(t, []int{1}, <-gt.batches)
	ctx, cancel := context.WithCancel(context.Background())
	quitter := gt.goDo(ctx, 2)
	stayer := gt.goDo(context.Background(), 3)
	require.Eventually(t, gt.queued(2), 5*time.Second, time.Millisecond)
	lcancel()
	r := <-leader // its flush is still held
	require.ErrorIs(t, r.err, context.Canceled)
	require.ErrorIs(t, r.err, ErrOutcomeUnknown)
	gt.hold <- struct{}{}
	require.ElementsMatch(t, []int{2, 3}, <-gt.batches, "the flush goes on for the others")
	cancel()
	r = <-quitter // held too
	require.ErrorIs(t, r.err, context.Canceled)
	require.ErrorIs(t, r.err, ErrOutcomeUnknown)
	gt.hold <- struct{}{}
	require.Equal(t, result{30, nil}, <-stayer)
}

// flushContext ends at the latest deadline of a batch's callers, and has
// none when one of them has none.
func TestGroupFlushDeadline(t *testing.T) {
	t.Parallel()
	soon, c1 := context.WithTimeout(context.Background(), time.Minute)
	defer c1()
	late, c2 := context.WithTimeout(context.Background(), time.Hour)
	defer c2()
	mk := func(ctxs ...context.Context) []*Call[int, int] {
		var out []*Call[int, int]
		for _, c := range ctxs {
			out = append(out, NewCall[int, int](c, 0))
		}
		return out
	}
	ctx, cancel := flushContext(mk(soon, late))
	d, ok := ctx.Deadline()
	cancel()
	require.True(t, ok)
	want, _ := late.Deadline()
	require.Equal(t, want, d)
	ctx, cancel = flushContext(mk(soon, context.Background()))
	_, ok = ctx.Deadline()
	cancel()
	require.False(t, ok)
}

// Leaders run on goroutines that park between their runs: batch after
// batch of a caller that comes back once answered, the group starts no
// goroutine per batch (at most a second one, for a call that came while
// the first was between its run and its park), and the parked leaders exit
// once the group has been idle for a while.
func TestGroupReusesParkedLeadersAndLetsThemExitWhenIdle(t *testing.T) {
	t.Parallel()
	gt := newGroup(t)
	for range 50 {
		gt.hold <- struct{}{}
	}
	for i := range 50 {
		require.Equal(t, result{i * 10, nil}, <-gt.goDo(context.Background(), i))
		<-gt.batches
	}
	require.LessOrEqual(t, gt.g.started.Load(), int64(2), "leader goroutines started for 50 batches")
	require.Eventually(t, func() bool { return gt.g.leaders.Load() == 0 }, 5*time.Second, time.Millisecond,
		"the parked leaders exit once the group is idle")
	gt.g.mu.Lock()
	require.Empty(t, gt.g.idle)
	gt.g.mu.Unlock()
}

// Under a hand-over each flush starts its successor before its EXEC; the
// successor runs on a parked leader, not a goroutine of its own.
func TestGroupHandsOverToParkedLeaders(t *testing.T) {
	t.Parallel()
	var carried atomic.Int64
	var g *Group[int, int]
	g = &Group[int, int]{Max: 4, HandOver: true, Flush: func(ctx context.Context, calls []*Call[int, int]) {
		if in, _ := ctx.Value(handoverKey{}).(*handover); in != nil {
			in.offer(in.node, func(context.Context, redis.Pipeliner) {}) // as the engine offers its first read
		}
		// A flush hands over only when calls are queued as its EXEC goes.
		// Flushes that do no I/O are quick, and on a loaded machine the
		// callers were not always back in time (7 runs of 20 saw no
		// hand-over at all): until one has happened, a flush waits for a
		// call to queue, a second at most.
		for deadline := time.Now().Add(time.Second); carried.Load() == 0 && time.Now().Before(deadline); runtime.Gosched() {
			g.mu.Lock()
			queued := len(g.queue)
			g.mu.Unlock()
			if queued > 0 {
				break
			}
		}
		if s, _ := ctx.Value(successionKey{}).(*succession); s != nil {
			if h := s.pass(nil); h != nil {
				carried.Add(1)
				h.result <- carriedResult{}
			}
		}
		for _, c := range calls {
			c.Finish(c.In(), nil)
		}
	}}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 100 {
				out, err := g.Do(context.Background(), w*1000+i)
				assert.NoError(t, err)
				assert.Equal(t, w*1000+i, out)
			}
		})
	}
	wg.Wait()
	flushes := g.Sizes().Flushes
	require.Positive(t, carried.Load(), "no flush handed over")
	require.LessOrEqual(t, g.started.Load(), int64(8), "leader goroutines started for %d flushes, %d hand-overs", flushes, carried.Load())
	require.Eventually(t, func() bool { return g.leaders.Load() == 0 }, 5*time.Second, time.Millisecond,
		"the parked leaders exit once the group is idle")
}

// A leader waiting for its next batch to fill, with no call queued, waits
// parked, and is woken by the first caller that comes, not by the end of
// its wait.
func TestGroupWaitingLeaderIsWokenByTheCallerThatComes(t *testing.T) {
	t.Parallel()
	gt := newGroup(t)
	gt.g.Fill = time.Minute
	ctx := context.Background()
	first := gt.goDo(ctx, 1)
	require.Equal(t, []int{1}, <-gt.batches)
	gt.hold <- struct{}{}
	require.Equal(t, result{10, nil}, <-first)
	// One caller was in the group during the flush: the leader waits for
	// it to come back.
	require.Eventually(t, func() bool { gt.g.mu.Lock(); defer gt.g.mu.Unlock(); return len(gt.g.waiting) == 1 },
		5*time.Second, time.Millisecond, "the leader waits parked")
	second := gt.goDo(ctx, 2)
	select {
	case b := <-gt.batches:
		require.Equal(t, []int{2}, b)
	case <-time.After(10 * time.Second):
		t.Fatal("the caller that came did not wake its leader")
	}
	gt.setFill(0) // the leader leaves once this batch is over
	gt.hold <- struct{}{}
	require.Equal(t, result{20, nil}, <-second)
	require.Eventually(t, func() bool { gt.g.mu.Lock(); defer gt.g.mu.Unlock(); return gt.g.running == 0 },
		5*time.Second, time.Millisecond, "idle again")
}

// handOn releases the batch the flush holds while call waits queued
// behind it, with fill as the group's Fill, and returns the next batch
// and how long after the release it came.
func (gt *groupUnderTest) handOn(t *testing.T, call int, fill time.Duration) ([]int, time.Duration, <-chan result) {
	t.Helper()
	return gt.handOnWhile(t, call, fill, nil)
}

// handOnWhile is handOn that runs during, when not nil, once the flush
// is released, while the next batch may still be filling.
func (gt *groupUnderTest) handOnWhile(t *testing.T, call int, fill time.Duration, during func()) ([]int, time.Duration, <-chan result) {
	t.Helper()
	next := gt.goDo(context.Background(), call)
	require.Eventually(t, gt.queued(1), 5*time.Second, time.Millisecond)
	gt.setFill(fill)
	start := time.Now()
	gt.hold <- struct{}{}
	if during != nil {
		during()
	}
	select {
	case b := <-gt.batches:
		return b, time.Since(start), next
	case <-time.After(10 * time.Second):
		t.Fatalf("no batch for call %d within 10 s: the leader waited for a caller that never came", call)
		return nil, 0, nil
	}
}

// A group whose waits end with a caller queued, the batch short and no
// caller gathered stops waiting: its callers are busy elsewhere (a lifecycle's go on to claim
// and complete), and the wait only holds the one queued. After fillProbe
// batches taken at once, the next waits anyway, to learn whether waiting
// pays again; when that wait ends short too, the batches after it are
// taken at once again.
func TestGroupStopsWaitingForCallersThatDoNotComeAndProbes(t *testing.T) {
	t.Parallel()
	gt := newGroup(t)
	first := gt.goDo(context.Background(), 1)
	require.Equal(t, []int{1}, <-gt.batches)
	// Two callers in the group during the flush: the leader waits for the
	// first to come back, which it never does.
	b, waited, answer := gt.handOn(t, 2, 20*time.Millisecond)
	require.Equal(t, []int{2}, b)
	require.GreaterOrEqual(t, waited, 20*time.Millisecond, "the first wait is taken")
	require.Equal(t, result{10, nil}, <-first)
	for i := range fillProbe {
		// A wait of a minute would fail handOn: the leader takes the one
		// queued at once.
		b, _, next := gt.handOn(t, 3+i, time.Minute)
		require.Equal(t, []int{3 + i}, b)
		require.Equal(t, result{(2 + i) * 10, nil}, <-answer)
		answer = next
	}
	b, waited, next := gt.handOn(t, 3+fillProbe, 300*time.Millisecond)
	require.Equal(t, []int{3 + fillProbe}, b)
	require.GreaterOrEqual(t, waited, 300*time.Millisecond, "after fillProbe batches taken at once, one waits")
	require.Equal(t, result{(2 + fillProbe) * 10, nil}, <-answer)
	b, _, last := gt.handOn(t, 4+fillProbe, time.Minute)
	require.Equal(t, []int{4 + fillProbe}, b, "the probe ended short: the next batch is taken at once")
	require.Equal(t, result{(3 + fillProbe) * 10, nil}, <-next)
	gt.setFill(0)
	gt.hold <- struct{}{}
	require.Equal(t, result{(4 + fillProbe) * 10, nil}, <-last)
}

// A probe whose batch fills makes the group wait again at once, however
// many waits ended short before it.
func TestGroupWaitsAgainOnceAProbeFills(t *testing.T) {
	t.Parallel()
	gt := newGroup(t)
	gt.g.fillScore, gt.g.skipped = -fillScoreMax, fillProbe // waits did not pay; the next is a probe
	ctx := context.Background()
	first := gt.goDo(ctx, 1)
	require.Equal(t, []int{1}, <-gt.batches)
	second := gt.goDo(ctx, 2)
	require.Eventually(t, gt.queued(1), 5*time.Second, time.Millisecond)
	gt.setFill(time.Minute)
	gt.hold <- struct{}{}
	require.Equal(t, result{10, nil}, <-first)
	select {
	case b := <-gt.batches:
		t.Fatalf("the probe took %v without waiting", b)
	case <-time.After(100 * time.Millisecond):
	}
	third := gt.goDo(ctx, 3) // the caller the probe waits for
	require.ElementsMatch(t, []int{2, 3}, <-gt.batches, "the probe's batch filled")
	gt.g.mu.Lock()
	require.Equal(t, 1, gt.g.fillScore)
	gt.g.mu.Unlock()
	b, waited, fourth := gt.handOn(t, 4, 300*time.Millisecond)
	require.Equal(t, []int{4}, b)
	require.GreaterOrEqual(t, waited, 300*time.Millisecond, "waiting pays again: the next batch waits")
	require.Equal(t, result{20, nil}, <-second)
	require.Equal(t, result{30, nil}, <-third)
	gt.setFill(0)
	gt.hold <- struct{}{}
	require.Equal(t, result{40, nil}, <-fourth)
}

// BenchmarkGroupFillWhileACallerStaysAway: one caller calls again as soon
// as it is answered, another every millisecond or so (its handler runs
// long). After each batch that carried both, the leader waits for the
// second, which does not come, and the steady caller, queued, waits with
// it until the wait's backstop: the steady caller's p99 shows what that
// costs. Each flush stands for a round trip of 20 µs.
func BenchmarkGroupFillWhileACallerStaysAway(b *testing.B) {
	ctx := context.Background()
	g := &Group[int, int]{Max: 100, Fill: 50 * time.Microsecond, Flush: func(_ context.Context, calls []*Call[int, int]) {
		spin(20 * time.Microsecond)
		for _, c := range calls {
			c.Finish(0, nil)
		}
	}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = g.Do(ctx, 0)
			time.Sleep(time.Millisecond)
		}
	})
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		_, _ = g.Do(ctx, 1)
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	close(stop)
	wg.Wait()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
	b.ReportMetric(float64(lat[len(lat)*999/1000].Nanoseconds())/1e3, "p99.9-µs")
}

// BenchmarkGroupCallersWithThinkTime: 8 callers, each doing 0-60 µs of
// work between its calls, on a group whose flush takes 30 µs and whose
// Fill is 50 µs: their returns spread around Fill.
func BenchmarkGroupCallersWithThinkTime(b *testing.B) {
	ctx := context.Background()
	var flushes atomic.Int64
	g := &Group[int, int]{Max: 100, Fill: 50 * time.Microsecond, Flush: func(_ context.Context, calls []*Call[int, int]) {
		flushes.Add(1)
		spin(30 * time.Microsecond)
		for _, c := range calls {
			c.Finish(0, nil)
		}
	}}
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for range 8 {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				_, _ = g.Do(ctx, 1)
				spin(time.Duration(rand.N(60)) * time.Microsecond) // the caller's own work
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/float64(flushes.Load()), "calls/flush")
}

// A wait that ends short but gathered a caller while it waited did not
// hold its queued callers for nothing: it counts for waiting. When any
// short wait took 1 from fillScore, callers whose returns spread around
// Fill made the group stop waiting (BenchmarkGroupCallersWithThinkTime:
// 1.6 calls per flush, against 4.5 before the score and 4.5 now).
func TestGroupKeepsWaitingWhileShortWaitsGatherCallers(t *testing.T) {
	t.Parallel()
	gt := newGroup(t)
	ctx := context.Background()
	first := gt.goDo(ctx, 1)
	require.Equal(t, []int{1}, <-gt.batches)
	second, third := gt.goDo(ctx, 2), gt.goDo(ctx, 3)
	require.Eventually(t, gt.queued(2), 5*time.Second, time.Millisecond)
	gt.hold <- struct{}{} // Fill is 0: [2 3] is taken at once
	require.Equal(t, result{10, nil}, <-first)
	require.ElementsMatch(t, []int{2, 3}, <-gt.batches)
	// Three or more callers in the group during [2 3]'s flush: the leader
	// waits for a batch of three with one queued; one more comes during
	// the wait, and the wait ends short, having gathered it.
	b, waited, fourth, fifth := gt.handOnGathering(t, 4, 5)
	require.ElementsMatch(t, []int{4, 5}, b)
	require.GreaterOrEqual(t, waited, 300*time.Millisecond, "the wait ends short")
	require.Equal(t, result{20, nil}, <-second)
	require.Equal(t, result{30, nil}, <-third)
	// The wait paid: the next one is taken too, and gathers its caller.
	b, _, sixth, seventh := gt.handOnGathering(t, 6, 7)
	require.ElementsMatch(t, []int{6, 7}, b, "a short wait that gathered a caller stopped the group waiting")
	require.Equal(t, result{40, nil}, <-fourth)
	require.Equal(t, result{50, nil}, <-fifth)
	gt.setFill(0)
	gt.hold <- struct{}{}
	require.Equal(t, result{60, nil}, <-sixth)
	require.Equal(t, result{70, nil}, <-seventh)
}

// handOnGathering is handOn with a Fill of 300 ms, during which a second
// caller, gathered, comes 50 ms after the release.
func (gt *groupUnderTest) handOnGathering(t *testing.T, call, gathered int) (_ []int, _ time.Duration, next, late <-chan result) {
	t.Helper()
	b, waited, next := gt.handOnWhile(t, call, 300*time.Millisecond, func() {
		time.Sleep(50 * time.Millisecond)
		late = gt.goDo(context.Background(), gathered)
	})
	return b, waited, next, late
}

// spin keeps the processor busy for d, as work of a flush or a caller
// would (a sleep that short would park, and wake late).
func spin(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}
