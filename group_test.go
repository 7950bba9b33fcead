package jobkey

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
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
	// The leader answers its callers before it looks for a next batch.
	require.Eventually(t, func() bool { gt.g.mu.Lock(); defer gt.g.mu.Unlock(); return gt.g.running == 0 },
		5*time.Second, time.Millisecond, "the group is idle again")
}

// With lanes, a second flush starts only when the one running is
// saturated: callers queue until a full batch waits, and the caller that
// finds one starts a flush at once, which takes the head of the queue.
func TestCommitGroupOpensLaneOnlyWhenSaturated(t *testing.T) {
	t.Parallel()
	gt := newGroup(t)
	gt.g.lanes, gt.g.max = 2, 2
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
func TestCommitGroupLeaderWaitsBoundedForFullerBatch(t *testing.T) {
	t.Parallel()
	gt := newGroup(t)
	gt.g.fill = 200 * time.Millisecond
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
	h := gt.g.hist.snapshot()
	require.EqualValues(t, 2, h.Flushes)
	require.EqualValues(t, 3, h.Calls)
	require.EqualValues(t, 1, h.Buckets[0])
	require.EqualValues(t, 1, h.Buckets[1])
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

// A caller whose ctx ends while its batch is in flight is answered at
// once, with an error that says the outcome is unknown, and a leader whose
// ctx ends does not stop the flush for the others.
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
// its deadline, not when the flush ends.
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

// stallTag marks a caller's ctx for stallRig: "hold" or "stall". A flush
// runs under a ctx that keeps its first caller's values.
type stallTag struct{}

// stallRig is a Redis that stalls: the commands sent for a caller tagged
// "hold" wait until release is closed, and those of one tagged "stall"
// take 800 ms (with execOnly, only the MULTI/EXEC does), whatever the
// ctx says, as a read from a stalled link does in go-redis, which ends it
// at ReadTimeout, not at the ctx's deadline.
type stallRig struct {
	release  chan struct{}
	held     chan struct{} // a token per held pipeline, when there is room
	execOnly bool
}

const rigStall = 800 * time.Millisecond

func (r *stallRig) wait(ctx context.Context, cmds []redis.Cmder) {
	switch ctx.Value(stallTag{}) {
	case "hold":
		select {
		case r.held <- struct{}{}:
		default:
		}
		<-r.release
	case "stall":
		if !r.execOnly || slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "exec" }) {
			time.Sleep(rigStall)
		}
	}
}

func (r *stallRig) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *stallRig) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.wait(ctx, []redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}
func (r *stallRig) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.wait(ctx, cmds)
		return next(ctx, cmds)
	}
}

// groupState returns how many flushes of g run and how many calls wait.
func groupState[T, R any](g *commitGroup[T, R]) (running, queued int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.running, len(g.queue)
}

// While Redis stalls, a caller of the commit group whose deadline passes
// after its call was taken is answered at its deadline, with an error that
// says the outcome is unknown; the callers that shared its batch get their
// results when Redis answers, and calling again resolves the outcome. A
// job claimed for a caller that left is given back, its attempt unspent.
func TestGroupAnswersAtDeadlineWhileRedisStalls(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	const quitAfter = 100 * time.Millisecond
	for _, op := range []string{"enqueue", "claim", "complete", "extend"} {
		for _, execOnly := range []bool{false, true} {
			name := op + "/every-command"
			if execOnly {
				name = op + "/exec-only" // decided in time, written after the caller left
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				rig := &stallRig{release: make(chan struct{}), held: make(chan struct{}, 8), execOnly: execOnly}
				rdb := redistest.Client(t, nil)
				rdb.AddHook(rig)
				q := queueOn(t, rdb, redistest.Prefix(t), Config{})
				bg := context.Background()
				// One lane: the others open only when a full batch is
				// queued.
				const lanes = 1
				state := func() (int, int) {
					switch op {
					case "enqueue":
						return groupState(q.enqueues)
					case "claim":
						return groupState(q.claims)
					case "complete":
						return groupState(q.completes)
					}
					return groupState(q.extends)
				}
				// Calls 0..lanes-1 hold every lane; call lanes stays, and
				// call lanes+1 quits: they share the next batch.
				n := lanes + 2
				claimed := make([]*Job, n)
				for i := range n {
					if op == "enqueue" { // the one-time checks, before the stall
						_, err := q.Enqueue(bg, "t", nil, nil)
						require.NoError(t, err)
						break
					}
					_, err := q.Enqueue(bg, "t", nil, &EnqueueOpts{ID: fmt.Sprint("j", i)})
					require.NoError(t, err)
					if op != "claim" {
						claimed[i], err = q.Claim(bg, fmt.Sprint("w", i))
						require.NoError(t, err)
					}
				}
				call := func(ctx context.Context, i int) (*Job, error) {
					switch op {
					case "enqueue":
						return q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprint("j", i)})
					case "claim":
						return q.Claim(ctx, fmt.Sprint("w", i))
					case "complete":
						return q.Complete(ctx, claimed[i], []byte("ok"))
					}
					return q.Extend(ctx, claimed[i])
				}
				type answer struct {
					j   *Job
					err error
					at  time.Time
				}
				answers := make([]chan answer, n)
				start := func(ctx context.Context, i int) {
					answers[i] = make(chan answer, 1)
					go func() {
						j, err := call(ctx, i)
						answers[i] <- answer{j, err, time.Now()}
					}()
				}
				for i := range lanes {
					start(context.WithValue(bg, stallTag{}, "hold"), i)
					<-rig.held
				}
				stay, quit := lanes, lanes+1
				start(context.WithValue(bg, stallTag{}, "stall"), stay)
				require.Eventually(t, func() bool { _, w := state(); return w == 1 }, 5*time.Second, time.Millisecond)
				qctx, cancel := context.WithTimeout(context.WithValue(bg, stallTag{}, "stall"), quitAfter)
				defer cancel()
				deadline, _ := qctx.Deadline()
				start(qctx, quit)
				require.Eventually(t, func() bool { _, w := state(); return w == 2 }, 5*time.Second, time.Millisecond)
				close(rig.release) // the held lanes end; one takes both

				a := <-answers[quit]
				require.Less(t, a.at.Sub(deadline), 150*time.Millisecond, "answered %v after its deadline", a.at.Sub(deadline))
				require.ErrorIs(t, a.err, ErrOutcomeUnknown, "taken by a flush: the outcome is not known")
				require.ErrorIs(t, a.err, context.DeadlineExceeded)
				for i := range lanes + 1 {
					a := <-answers[i]
					require.NoError(t, a.err, "call %d", i)
					require.NotNil(t, a.j)
				}

				if op == "claim" {
					// The job claimed for the quitter, if one was, is given
					// back, its attempt unspent: one job is left pending,
					// and not one is leased to the quitter.
					require.EventuallyWithT(t, func(c *assert.CollectT) {
						pending := 0
						for i := range n {
							j, err := q.Get(bg, fmt.Sprint("j", i))
							require.NoError(c, err)
							require.False(c, j.State == StateActive && j.LeaseOwner == fmt.Sprint("w", quit), "leased to a caller that left")
							if j.State == StatePending {
								pending++
								require.Zero(c, j.Attempt)
							}
						}
						require.Equal(c, 1, pending)
					}, 5*time.Second, 10*time.Millisecond)
				}

				// Calling again resolves the outcome.
				got, err := call(bg, quit)
				switch op {
				case "enqueue":
					if err != nil {
						require.ErrorIs(t, err, ErrJobExists)
					}
					j, err := q.Get(bg, fmt.Sprint("j", quit))
					require.NoError(t, err)
					require.Equal(t, StatePending, j.State)
				case "claim":
					require.NoError(t, err)
					require.Equal(t, 1, got.Attempt)
				case "complete":
					require.NoError(t, err)
					require.Equal(t, StateSucceeded, got.State)
				case "extend":
					require.NoError(t, err)
					require.Equal(t, StateActive, got.State)
				}
			})
		}
	}
}

// Work's fused complete-and-claim, whose caller's deadline passes while
// its EXEC stalls, answers at the deadline; the next job that EXEC claimed
// for it is given back, its attempt unspent, and the completion is
// resolved by completing again.
func TestGroupGivesBackFusedClaimOfCallerThatLeft(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rig := &stallRig{release: make(chan struct{}), held: make(chan struct{}, 1), execOnly: true}
	rdb := redistest.Client(t, nil)
	rdb.AddHook(rig)
	q := queueOn(t, rdb, redistest.Prefix(t), Config{})
	bg := context.Background()
	for _, id := range []string{"a", "b"} {
		_, err := q.Enqueue(bg, "t", nil, &EnqueueOpts{ID: id})
		require.NoError(t, err)
	}
	first, err := q.Claim(bg, "w") // reads both; the other waits in the pool
	require.NoError(t, err)
	other := "b"
	if first.ID == "b" {
		other = "a"
	}
	ctx, cancel := context.WithTimeout(context.WithValue(bg, stallTag{}, "stall"), 100*time.Millisecond)
	defer cancel()
	deadline, _ := ctx.Deadline()
	_, err = q.completeAndClaim(ctx, first, []byte("r"), "w")
	require.Less(t, time.Since(deadline), 150*time.Millisecond, "answered %v after its deadline", time.Since(deadline))
	require.ErrorIs(t, err, ErrOutcomeUnknown)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		j, err := q.Get(bg, other)
		require.NoError(c, err)
		require.Equal(c, StatePending, j.State, "given back")
		require.Zero(c, j.Attempt)
		require.NotZero(c, j.LeaseToken, "claimed by the stalled EXEC, then given back")
	}, 5*time.Second, 10*time.Millisecond)
	done, err := q.Complete(bg, first, []byte("r"))
	require.NoError(t, err, "the completion is resolved by completing again")
	require.Equal(t, StateSucceeded, done.State)
}
