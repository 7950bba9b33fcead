package jobkey

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// groupUnderTest is a commitGroup whose flushes the test holds and sees.
type groupUnderTest struct {
	g       *commitGroup[int, int]
	batches chan []int    // the inputs of every flush, in order
	hold    chan struct{} // a flush waits for a token from here
}

func newGroup(t *testing.T) *groupUnderTest {
	t.Helper()
	gt := &groupUnderTest{batches: make(chan []int, 100), hold: make(chan struct{}, 100)}
	gt.g = &commitGroup[int, int]{max: 100, flush: func(ctx context.Context, calls []*call[int, int]) {
		calls = live(calls)
		ins := make([]int, len(calls))
		for i, c := range calls {
			ins[i] = c.in
		}
		gt.batches <- ins
		<-gt.hold
		for _, c := range calls {
			if !c.gone() { // as a real flush decides: a caller that left is left out
				c.finish(c.in*10, nil)
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
		out, err := gt.g.do(ctx, in)
		ch <- result{out, err}
	}()
	return ch
}

func TestCommitGroupAloneThenBatched(t *testing.T) {
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
	gt.g.mu.Lock()
	require.Zero(t, gt.g.running, "the group is idle again")
	gt.g.mu.Unlock()
}

// With lanes, a caller that finds fewer flushes running than lanes starts
// one at once; past that, callers queue and the next flush to end takes
// them as one batch.
func TestCommitGroupLanes(t *testing.T) {
	t.Parallel()
	gt := newGroup(t)
	gt.g.lanes = 2
	ctx := context.Background()
	first := gt.goDo(ctx, 1)
	require.Equal(t, []int{1}, <-gt.batches)
	second := gt.goDo(ctx, 2)
	require.Equal(t, []int{2}, <-gt.batches, "a second lane starts at once")
	var later []<-chan result
	for i := 3; i <= 5; i++ {
		later = append(later, gt.goDo(ctx, i))
	}
	require.Eventually(t, func() bool { gt.g.mu.Lock(); defer gt.g.mu.Unlock(); return len(gt.g.queue) == 3 },
		5*time.Second, time.Millisecond, "both lanes busy: the rest queue")
	gt.hold <- struct{}{}
	require.ElementsMatch(t, []int{3, 4, 5}, <-gt.batches, "the lane that ended takes the queue")
	gt.hold <- struct{}{}
	gt.hold <- struct{}{}
	for _, ch := range append([]<-chan result{first, second}, later...) {
		r := <-ch
		require.NoError(t, r.err)
	}
	require.Eventually(t, func() bool { gt.g.mu.Lock(); defer gt.g.mu.Unlock(); return gt.g.running == 0 },
		5*time.Second, time.Millisecond, "idle again")
}

func TestCommitGroupCallerLeavesQueue(t *testing.T) {
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

// A caller whose ctx ends while its batch is in flight is answered at the
// batch's next decision, without waiting for the batch to end, and a
// leader whose ctx ends does not stop the flush for the others.
func TestCommitGroupCallerGivesUpMidBatch(t *testing.T) {
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
	gt.hold <- struct{}{} // the leader's own flush decides: it left
	require.ErrorIs(t, (<-leader).err, context.Canceled)
	require.ElementsMatch(t, []int{2, 3}, <-gt.batches, "the flush goes on for the others")
	cancel()
	// Held: the quitter is not answered until the batch decides again.
	gt.hold <- struct{}{}
	require.ErrorIs(t, (<-quitter).err, context.Canceled)
	require.Equal(t, result{30, nil}, <-stayer)
}

// flushContext ends at the latest deadline of a batch's callers, and has
// none when one of them has none.
func TestCommitGroupFlushDeadline(t *testing.T) {
	t.Parallel()
	soon, c1 := context.WithTimeout(context.Background(), time.Minute)
	defer c1()
	late, c2 := context.WithTimeout(context.Background(), time.Hour)
	defer c2()
	mk := func(ctxs ...context.Context) []*call[int, int] {
		var out []*call[int, int]
		for _, c := range ctxs {
			out = append(out, &call[int, int]{ctx: c, done: make(chan struct{})})
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

// An Enqueue whose deadline passes while it leads a slow flush returns at
// its deadline, not when the flush ends (issue 9, item 15).
func TestEnqueueHonoursDeadlineInGroup(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
		if has(cmds, "set", ":job:slow") {
			return sleepCtxOr(ctx, 500*time.Millisecond) // a slow network, as go-redis would wait on it
		}
		return nil
	}))
	q := queueOn(t, rdb, redistest.Prefix(t), Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "slow"})
	took := time.Since(t0)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, took, 300*time.Millisecond, "returned %v after a 50 ms deadline", took)

	// Callers with and without deadlines share batches; each gets its own
	// outcome, and what says written is written.
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%3)*20*time.Millisecond+time.Millisecond)
			defer cancel()
			j, err := q.Enqueue(ctx, "t", nil, nil)
			if err == nil {
				_, gerr := q.Get(context.Background(), j.ID)
				require.NoError(t, gerr, "an enqueue that said written")
			}
		})
	}
	wg.Wait()
}
