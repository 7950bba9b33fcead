package jobkey

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/cas"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
	// Before the flush's slow write ended (500 ms after it began, which
	// was after t0), not only near the deadline: on a loaded machine the
	// answer may come late, but never from the flush's end.
	require.Less(t, took, 500*time.Millisecond, "returned %v after a 50 ms deadline, when the flush ended", took)

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
func groupState[T, R any](g *cas.Group[T, R]) (running, queued int) { return g.State() }

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

// Work's complete-and-claim, whose caller's deadline passes while
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
	// The deadline leaves a loaded machine time to send the EXEC before it
	// passes (with 100 ms, CI's full run once let it pass with the call
	// still queued: nothing was claimed, so nothing was given back), and
	// passes while the EXEC stalls (rigStall).
	ctx, cancel := context.WithTimeout(context.WithValue(bg, stallTag{}, "stall"), rigStall/2)
	defer cancel()
	deadline, _ := ctx.Deadline()
	_, err = q.completeAndClaim(ctx, first, []byte("r"), "w")
	// Answered before the stall ended (rigStall after the EXEC went, which
	// was after ctx was made: at least rigStall/2 past the deadline), not
	// when it ended.
	require.Less(t, time.Since(deadline), rigStall/2, "answered %v after its deadline, when the stall ended", time.Since(deadline))
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
