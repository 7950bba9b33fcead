package cas

import (
	"context"
	"testing"
	"time"

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
	require.Eventually(t, func() bool { gt.g.mu.Lock(); defer gt.g.mu.Unlock(); return len(gt.g.queue) == 4 },
		5*time.Second, time.Millisecond)
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
	queued := func(n int) func() bool {
		return func() bool { gt.g.mu.Lock(); defer gt.g.mu.Unlock(); return len(gt.g.queue) == n }
	}
	calls := []<-chan result{gt.goDo(ctx, 1)}
	require.Equal(t, []int{1}, <-gt.batches)
	for i := 2; i <= 3; i++ {
		calls = append(calls, gt.goDo(ctx, i))
		require.Eventually(t, queued(i-1), 5*time.Second, time.Millisecond, "one lane busy, short of a full batch: the call queues")
	}
	select {
	case b := <-gt.batches:
		t.Fatalf("a lane opened for %v before the first was saturated", b)
	case <-time.After(20 * time.Millisecond):
	}
	calls = append(calls, gt.goDo(ctx, 4))
	require.Equal(t, []int{2, 3}, <-gt.batches, "a full batch queued: a second lane takes it at once")
	require.Eventually(t, queued(1), 5*time.Second, time.Millisecond)
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
	require.Eventually(t, func() bool { gt.g.mu.Lock(); defer gt.g.mu.Unlock(); return len(gt.g.queue) == 1 },
		5*time.Second, time.Millisecond)
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
	require.Eventually(t, func() bool { gt.g.mu.Lock(); defer gt.g.mu.Unlock(); return len(gt.g.queue) == 1 },
		5*time.Second, time.Millisecond)
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
	require.Eventually(t, func() bool { gt.g.mu.Lock(); defer gt.g.mu.Unlock(); return len(gt.g.queue) == 2 },
		5*time.Second, time.Millisecond)
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
