package jobkey

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// mjob is the model's view of one job.
type mjob struct {
	state      State
	attempt    int
	max        int
	runAt      time.Time
	owner      string
	token      uint64
	leaseUntil time.Time
	lastErr    string
	prio       int
}

// model is a plain in-memory queue that the real one must agree with.
type model struct {
	jobs    map[string]*mjob
	now     time.Time
	lease   time.Duration
	backoff func(int) time.Duration
}

func (m *model) claimable(j *mjob) bool {
	switch j.state {
	case StatePending:
		return !j.runAt.After(m.now) && j.attempt < j.max
	case StateActive:
		return !j.leaseUntil.After(m.now) && j.attempt < j.max
	}
	return false
}

// rank orders claimable jobs as claims take them: expired leases first,
// then pending jobs by priority, highest first.
func (m *model) rank(j *mjob) int {
	if j.state == StateActive {
		return leasedPrio
	}
	return j.prio
}

// expiredFinal is a due job with no attempt left (an active one whose last
// attempt's lease ran out): any claimer that meets it fails it.
func (m *model) expiredFinal(j *mjob) bool {
	due := (j.state == StateActive && !j.leaseUntil.After(m.now)) || (j.state == StatePending && !j.runAt.After(m.now))
	return due && j.attempt >= j.max
}

func (m *model) stats() Stats {
	var s Stats
	for _, j := range m.jobs {
		switch j.state {
		case StatePending:
			s.Pending++
			if j.runAt.After(m.now) {
				s.Scheduled++
			} else {
				s.Due++
				s.DueByPriority[j.prio]++
			}
		case StateActive:
			s.Active++
			if !j.leaseUntil.After(m.now) {
				s.ExpiredLeases++
			}
		case StateSucceeded:
			s.Succeeded++
		case StateFailed:
			s.Failed++
		case StateCanceled:
			s.Canceled++
		}
	}
	return s
}

// TestModel applies random operations to the queue and to the model, and
// after every step checks that Get, Stats and the raw index keys all agree
// with the model.
func TestModel(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	ctx := context.Background()
	ids := []string{"a", "b", "c", "d", "e"}
	workers := []string{"w1", "w2"}

	rapid.Check(t, func(rt *rapid.T) {
		clock := newClock()
		backoff := func(attempt int) time.Duration { return time.Duration(attempt) * 10 * time.Second }
		q, err := NewQueue(rdb, "q", &Config{
			Prefix: "model-" + NewID(), Backoff: backoff, Shards: rapid.IntRange(1, 3).Draw(rt, "shards"),
		})
		require.NoError(rt, err)
		q.clock.fake = clock.Now
		f := &fixture{q: q, rdb: rdb, clock: clock, ctx: ctx}
		m := &model{jobs: map[string]*mjob{}, now: clock.Now(), lease: q.cfg.Lease, backoff: backoff}
		var held []*Job // every copy a claim handed out, stale ones included

		pickHeld := func(rt *rapid.T) *Job { return rapid.SampledFrom(held).Draw(rt, "held") }
		fenced := func(j *Job) (*mjob, bool) {
			mj := m.jobs[j.ID]
			return mj, mj.state == StateActive && mj.token == j.LeaseToken
		}

		rt.Repeat(map[string]func(*rapid.T){
			"enqueue": func(rt *rapid.T) {
				id := rapid.SampledFrom(ids).Draw(rt, "id")
				delay := time.Duration(rapid.IntRange(0, 3).Draw(rt, "delay")) * 20 * time.Second
				max := rapid.IntRange(1, 3).Draw(rt, "max")
				prio := rapid.IntRange(0, 2).Draw(rt, "priority")
				_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: id, Delay: delay, MaxAttempts: max, Priority: prio})
				if _, exists := m.jobs[id]; exists {
					require.ErrorIs(rt, err, ErrJobExists)
					return
				}
				require.NoError(rt, err)
				m.jobs[id] = &mjob{state: StatePending, max: max, runAt: m.now.Add(delay), prio: prio}
			},
			"claim": func(rt *rapid.T) {
				w := rapid.SampledFrom(workers).Draw(rt, "worker")
				best := -1 // the highest rank claimable before the claim
				for _, mj := range m.jobs {
					if m.claimable(mj) {
						best = max(best, m.rank(mj))
					}
				}
				// The entries earlier claims read ahead are up to 500 ms
				// old (duePool): a job that became due since, by the model's
				// clock, may wait behind them. The model checks priority
				// order among the jobs due when the claim reads.
				q.pool.drop()
				j, err := q.Claim(ctx, w)
				// Claimers fail any expired final attempt they meet on the way.
				for id, mj := range m.jobs {
					if m.expiredFinal(mj) {
						if got, gerr := q.Get(ctx, id); gerr == nil && got.State == StateFailed {
							mj.state, mj.lastErr = StateFailed, got.LastError
						}
					}
				}
				if errors.Is(err, ErrNoJob) {
					for id, mj := range m.jobs {
						require.False(rt, m.claimable(mj), "ErrNoJob while %s is claimable", id)
					}
					return
				}
				require.NoError(rt, err)
				mj := m.jobs[j.ID]
				require.True(rt, m.claimable(mj), "claimed %s, which was not claimable: %+v", j.ID, mj)
				require.Equal(rt, best, m.rank(mj), "claimed %s of rank %d while rank %d was due", j.ID, m.rank(mj), best)
				require.Equal(rt, mj.prio, j.Priority)
				mj.state, mj.attempt, mj.owner, mj.leaseUntil = StateActive, mj.attempt+1, w, m.now.Add(m.lease)
				require.NotZero(rt, j.LeaseToken)
				for _, h := range held {
					require.NotEqual(rt, h.LeaseToken, j.LeaseToken, "every claim has a token of its own")
				}
				mj.token = j.LeaseToken
				held = append(held, j)
			},
			"complete": func(rt *rapid.T) {
				if len(held) == 0 {
					rt.Skip("nothing claimed")
				}
				j := pickHeld(rt)
				_, err := q.Complete(ctx, j, []byte("r"))
				mj, ok := fenced(j)
				if mj.state == StateSucceeded && mj.token == j.LeaseToken {
					require.NoError(rt, err, "a repeated Complete is a no-op success")
					return
				}
				if !ok {
					require.ErrorIs(rt, err, ErrLeaseLost)
					return
				}
				require.NoError(rt, err)
				mj.state, mj.leaseUntil = StateSucceeded, m.now
			},
			"fail": func(rt *rapid.T) {
				if len(held) == 0 {
					rt.Skip("nothing claimed")
				}
				j := pickHeld(rt)
				_, err := q.Fail(ctx, j, errors.New("x"))
				mj, ok := fenced(j)
				if mj.token == j.LeaseToken && mj.lastErr == "x" && (mj.state == StatePending || mj.state == StateFailed) {
					require.NoError(rt, err, "a repeated Fail finds its own write")
					return
				}
				if !ok {
					require.ErrorIs(rt, err, ErrLeaseLost)
					return
				}
				require.NoError(rt, err)
				mj.lastErr, mj.leaseUntil = "x", m.now
				if mj.attempt >= mj.max {
					mj.state = StateFailed
				} else {
					mj.state, mj.runAt = StatePending, m.now.Add(m.backoff(mj.attempt))
				}
			},
			"release": func(rt *rapid.T) {
				if len(held) == 0 {
					rt.Skip("nothing claimed")
				}
				j := pickHeld(rt)
				_, err := q.Release(ctx, j)
				mj, ok := fenced(j)
				if mj.token == j.LeaseToken && mj.state == StatePending {
					require.NoError(rt, err, "a repeated Release finds its own write")
					return
				}
				if !ok {
					require.ErrorIs(rt, err, ErrLeaseLost)
					return
				}
				require.NoError(rt, err)
				mj.state, mj.attempt, mj.runAt, mj.leaseUntil = StatePending, max(0, mj.attempt-1), m.now, m.now
			},
			"extend": func(rt *rapid.T) {
				if len(held) == 0 {
					rt.Skip("nothing claimed")
				}
				j := pickHeld(rt)
				_, err := q.Extend(ctx, j)
				mj, ok := fenced(j)
				if !ok {
					require.ErrorIs(rt, err, ErrLeaseLost)
					return
				}
				require.NoError(rt, err)
				mj.leaseUntil = m.now.Add(m.lease)
			},
			"cancel": func(rt *rapid.T) {
				id := rapid.SampledFrom(ids).Draw(rt, "id")
				_, err := q.Cancel(ctx, id)
				mj := m.jobs[id]
				switch {
				case mj == nil:
					require.ErrorIs(rt, err, ErrNotFound)
				case mj.state == StatePending || mj.state == StateActive || mj.state == StateCanceled:
					require.NoError(rt, err)
					mj.state = StateCanceled
				default:
					var se *StateError
					require.ErrorAs(rt, err, &se)
				}
			},
			"retry": func(rt *rapid.T) {
				id := rapid.SampledFrom(ids).Draw(rt, "id")
				_, err := q.Retry(ctx, id)
				mj := m.jobs[id]
				switch {
				case mj == nil:
					require.ErrorIs(rt, err, ErrNotFound)
				case mj.state == StateFailed || mj.state == StateCanceled:
					require.NoError(rt, err)
					mj.state, mj.attempt, mj.runAt = StatePending, 0, m.now
					if mj.leaseUntil.After(m.now) {
						mj.runAt = mj.leaseUntil // a canceled run's lease ends first
					}
				default:
					var se *StateError
					require.ErrorAs(rt, err, &se)
				}
			},
			"time passes": func(rt *rapid.T) {
				d := time.Duration(rapid.IntRange(1, 45).Draw(rt, "seconds")) * time.Second
				clock.Advance(d)
				m.now = m.now.Add(d)
			},
			"": func(rt *rapid.T) { // the check after every step
				st, err := q.Stats(ctx)
				require.NoError(rt, err)
				require.Equal(rt, m.stats(), st)
				for _, id := range ids {
					mj := m.jobs[id]
					got, err := q.Get(ctx, id)
					if mj == nil {
						require.ErrorIs(rt, err, ErrNotFound)
						continue
					}
					require.NoError(rt, err)
					require.Equal(rt, mj.state, got.State, "state of %s", id)
					require.Equal(rt, mj.attempt, got.Attempt, "attempt of %s", id)
					switch mj.state {
					case StatePending:
						require.Equal(rt, mj.runAt, got.RunAt, "run-at of %s", id)
					case StateActive:
						require.Equal(rt, mj.owner, got.LeaseOwner, "owner of %s", id)
						require.Equal(rt, mj.leaseUntil, got.LeaseUntil, "lease of %s", id)
					}
					idx, score := f.indexOf(t, id)
					want := derive(got)
					require.Equal(rt, want.index, idx, fmt.Sprintf("index of %s", id))
					require.Equal(rt, want.score, score, fmt.Sprintf("score of %s", id))
				}
			},
		})
	})
}
