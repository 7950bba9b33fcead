package jobkey

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// weightedQueues returns queues named names on f's Redis, under f's prefix,
// on Redis's real clock.
func weightedQueues(t *testing.T, f *fixture, names ...string) []*Queue {
	t.Helper()
	f.q.clock.Fake = nil
	qs := []*Queue{}
	for _, n := range names {
		q, err := NewQueue(f.rdb, n, &Config{Prefix: f.q.cfg.Prefix, Lease: 10 * time.Second, Logger: quietLog()})
		require.NoError(t, err)
		qs = append(qs, q)
	}
	return qs
}

// fill enqueues n jobs of type typ on q.
func fill(t *testing.T, q *Queue, typ string, n int) {
	t.Helper()
	specs := make([]JobSpec, n)
	for i := range specs {
		specs[i] = JobSpec{Type: typ}
	}
	_, err := q.EnqueueMany(context.Background(), specs)
	require.NoError(t, err)
}

// With jobs in every queue, the runners are shared by weight: the heavier
// queue runs more of the first jobs, and the lightest still runs some.
func TestWorkQueuesSharesRunnersByWeight(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	qs := weightedQueues(t, f, "critical", "default", "low")
	for i, q := range qs {
		fill(t, q, q.Name(), 150+i)
	}
	var mu sync.Mutex
	var order []string
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		mu.Lock()
		order = append(order, j.Type)
		n := len(order)
		mu.Unlock()
		if n >= 200 {
			cancel()
		}
		time.Sleep(time.Millisecond)
		return nil, nil
	})
	err := WorkQueues(ctx, h, []WeightedQueue{{qs[0], 6}, {qs[1], 3}, {qs[2], 1}}, &WorkQueuesOpts{WorkOpts: WorkOpts{Concurrency: 6, PollInterval: 50 * time.Millisecond}})
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	count := map[string]int{}
	for _, typ := range order[:200] {
		count[typ]++
	}
	t.Logf("of the first 200 runs: %v", count)
	require.Greater(t, count["critical"], count["default"], "weight 6 runs more than weight 3")
	require.Greater(t, count["default"], count["low"], "weight 3 runs more than weight 1")
	require.Positive(t, count["low"], "weight 1 is not starved")
}

// A queue alone with jobs uses every runner: the idle queues lend theirs.
func TestWorkQueuesLendsIdleQueuesRunners(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	qs := weightedQueues(t, f, "critical", "default", "low")
	const jobs, runners = 120, 8
	fill(t, qs[1], "d", jobs)
	var running, peak, done atomic.Int64
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(20 * time.Millisecond)
		running.Add(-1)
		if done.Add(1) == jobs {
			cancel()
		}
		return nil, nil
	})
	err := WorkQueues(ctx, h, []WeightedQueue{{qs[0], 6}, {qs[1], 3}, {qs[2], 1}}, &WorkQueuesOpts{WorkOpts: WorkOpts{Concurrency: runners, PollInterval: 50 * time.Millisecond}})
	require.NoError(t, err)
	require.EqualValues(t, jobs, done.Load())
	require.EqualValues(t, runners, peak.Load(), "the busy queue used every runner, and no more")
}

// Concurrency bounds the handlers of all the queues together.
func TestWorkQueuesConcurrencyBoundsAllQueues(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	qs := weightedQueues(t, f, "a", "b", "c")
	const per, runners = 40, 5
	for _, q := range qs {
		fill(t, q, q.Name(), per)
	}
	var running, peak, done atomic.Int64
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(3 * time.Millisecond)
		running.Add(-1)
		if done.Add(1) == 3*per {
			cancel()
		}
		return nil, nil
	})
	require.NoError(t, WorkQueues(ctx, h, []WeightedQueue{{qs[0], 1}, {qs[1], 1}, {qs[2], 1}},
		&WorkQueuesOpts{WorkOpts: WorkOpts{Concurrency: runners, PollInterval: 50 * time.Millisecond}}))
	require.EqualValues(t, 3*per, done.Load())
	require.LessOrEqual(t, peak.Load(), int64(runners), "never more handlers at once than Concurrency, over all the queues")
	for _, q := range qs {
		st, err := q.Stats(f.ctx)
		require.NoError(t, err)
		require.EqualValues(t, per, st.Succeeded, "queue %s", q.Name())
	}
}

// With StrictPriority, a lighter queue runs only while the heavier ones
// have nothing due: no low job starts before every critical one has.
func TestWorkQueuesStrictPriority(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	qs := weightedQueues(t, f, "critical", "low")
	const jobs, runners = 60, 4
	fill(t, qs[0], "critical", jobs)
	fill(t, qs[1], "low", jobs)
	var mu sync.Mutex
	var order []string
	var done atomic.Int64
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		mu.Lock()
		order = append(order, j.Type)
		mu.Unlock()
		time.Sleep(time.Millisecond)
		if done.Add(1) == 2*jobs {
			cancel()
		}
		return nil, nil
	})
	require.NoError(t, WorkQueues(ctx, h, []WeightedQueue{{qs[0], 2}, {qs[1], 1}},
		&WorkQueuesOpts{WorkOpts: WorkOpts{Concurrency: runners, PollInterval: 50 * time.Millisecond}, StrictPriority: true}))
	mu.Lock()
	defer mu.Unlock()
	last := 0
	for i, typ := range order {
		if typ == "critical" {
			last = i
		}
	}
	low := 0
	for _, typ := range order[:last] {
		if typ == "low" {
			low++
		}
	}
	t.Logf("low jobs run before the last critical one: %d", low)
	require.Zero(t, low, "no low job starts before every critical one has")
}

// Each queue keeps its own config: a paused queue runs nothing while the
// others run, and its jobs run once it resumes.
func TestWorkQueuesEachQueueKeepsItsPause(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	qs := weightedQueues(t, f, "on", "off")
	require.NoError(t, qs[1].Pause(f.ctx))
	fill(t, qs[0], "on", 20)
	fill(t, qs[1], "off", 20)
	var on, off, offBeforeResume atomic.Int64
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		if j.Type == "on" {
			if on.Add(1) == 20 {
				offBeforeResume.Store(off.Load())
				if err := qs[1].Resume(context.WithoutCancel(ctx)); err != nil {
					return nil, err
				}
			}
		} else if off.Add(1) == 20 {
			cancel()
		}
		return nil, nil
	})
	require.NoError(t, WorkQueues(ctx, h, []WeightedQueue{{qs[0], 1}, {qs[1], 1}},
		&WorkQueuesOpts{WorkOpts: WorkOpts{Concurrency: 3, PollInterval: 50 * time.Millisecond}}))
	require.EqualValues(t, 20, on.Load())
	require.Zero(t, offBeforeResume.Load(), "the paused queue ran nothing")
	require.EqualValues(t, 20, off.Load(), "and all of its jobs once resumed")
}

// An idle queue beside a busy one costs about one claim per PollInterval,
// not one per runner, and takes no runner from the busy queue for it.
func TestWorkQueuesIdleQueueCostsFewRoundTrips(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	busy := weightedQueues(t, f, "busy")[0]
	rdb, hook := hooked(t, 0)
	idle, err := NewQueue(rdb, "idle", &Config{Prefix: f.q.cfg.Prefix, Lease: 10 * time.Second, Logger: quietLog()})
	require.NoError(t, err)
	const jobs, runners, poll = 400, 6, 100 * time.Millisecond
	fill(t, busy, "b", jobs)
	var done atomic.Int64
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		time.Sleep(2 * time.Millisecond)
		if done.Add(1) == jobs {
			cancel()
		}
		return nil, nil
	})
	start := time.Now()
	require.NoError(t, WorkQueues(ctx, h, []WeightedQueue{{busy, 1}, {idle, 1}},
		&WorkQueuesOpts{WorkOpts: WorkOpts{Concurrency: runners, PollInterval: poll, TrimInterval: -1}}))
	took := time.Since(start)
	polls := int64(took/poll) + 1
	rtt := hook.RTT.Load()
	t.Logf("%d jobs in %v; the idle queue made %d round trips (%d PollIntervals)", jobs, took.Round(time.Millisecond), rtt, polls)
	// Each of its claims costs at most 3 round trips and the wait that
	// follows one more (untilDue); its runners' first claims come before
	// it is known idle.
	require.LessOrEqual(t, rtt, 4*(runners+2*polls), "about one claim per PollInterval")
}

func TestWorkQueuesRefusesWhatItCannotRun(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	qs := weightedQueues(t, f, "a", "b")
	twin, err := NewQueue(f.rdb, "a", &Config{Prefix: f.q.cfg.Prefix})
	require.NoError(t, err)
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) { return nil, nil })
	ctx, cancel := context.WithCancel(f.ctx)
	cancel()
	for name, c := range map[string]struct {
		h    Handler
		qs   []WeightedQueue
		opts *WorkQueuesOpts
	}{
		"nil handler":  {nil, []WeightedQueue{{qs[0], 1}}, nil},
		"no queue":     {h, nil, nil},
		"nil queue":    {h, []WeightedQueue{{nil, 1}}, nil},
		"weight 0":     {h, []WeightedQueue{{qs[0], 0}}, nil},
		"weight high":  {h, []WeightedQueue{{qs[0], MaxQueueWeight + 1}}, nil},
		"twice":        {h, []WeightedQueue{{qs[0], 1}, {twin, 2}}, nil},
		"periodic":     {h, []WeightedQueue{{qs[0], 1}}, &WorkQueuesOpts{WorkOpts: WorkOpts{Periodic: []PeriodicJob{{Name: "p", Type: "p", Schedule: Every(time.Minute)}}}}},
		"bad work opt": {h, []WeightedQueue{{qs[0], 1}, {qs[1], 1}}, &WorkQueuesOpts{WorkOpts: WorkOpts{Concurrency: -1}}},
	} {
		require.ErrorIs(t, WorkQueues(ctx, c.h, c.qs, c.opts), ErrInvalid, name)
	}
	require.NoError(t, WorkQueues(ctx, h, []WeightedQueue{{qs[0], 1}, {qs[1], 1}}, nil), "an ended ctx: returns at once")
}

// A webhook-delivery service, as people build it on asynq and River, run
// through its life: three queues shared by weight in one WorkQueues, a
// concurrency limit and a rate limit per customer, a receiver that fails
// now and then and answers 429 with Retry-After, and the service shut
// down and started again while it delivers. Every event is delivered; a
// 429 spends no attempt (Snooze); no customer ever has more deliveries
// under way than its limit, nor more starts in a window than its rate.
func TestWebhookServiceDeliversEveryEventThroughRestarts(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.q.clock.Fake = nil
	names := []string{"critical", "default", "low"}
	weights := []int{6, 3, 1}
	var queues []*Queue
	for _, n := range names {
		q, err := NewQueue(f.rdb, n, &Config{Prefix: f.q.cfg.Prefix, Lease: 5 * time.Second, Logger: quietLog(), MaxAttempts: 10,
			Backoff: func(int) time.Duration { return 20 * time.Millisecond }})
		require.NoError(t, err)
		queues = append(queues, q)
	}
	const customers, limit = 8, 2
	const rate, period = 4, 200 * time.Millisecond // for the rated customer, c0
	for _, q := range queues {
		for c := range customers {
			require.NoError(t, q.SetConcurrencyLimit(f.ctx, fmt.Sprintf("c%d", c), limit))
		}
		require.NoError(t, q.SetRateLimit(f.ctx, "c0", rate, period))
	}

	// The receiver: the first request of every 5th event is a 429 with
	// Retry-After; the first request past that of every 7th is a 500.
	var rmu sync.Mutex
	tries := map[string]int{}     // event -> requests
	delivered := map[string]int{} // event -> 200s
	var throttled atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev := r.URL.Query().Get("event")
		i, _ := strconv.Atoi(r.URL.Query().Get("i"))
		rmu.Lock()
		tries[ev]++
		n := tries[ev]
		rmu.Unlock()
		switch {
		case i%5 == 0 && n == 1:
			throttled.Add(1)
			w.Header().Set("Retry-After", "0.05")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		case i%7 == 0 && (n == 1 || i%5 == 0 && n == 2):
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		time.Sleep(time.Duration(rand.N(3)) * time.Millisecond)
		rmu.Lock()
		delivered[ev]++
		rmu.Unlock()
	}))
	defer srv.Close()

	// The service's handler, and what it sees: the deliveries under way per
	// customer, and each start of the rated customer by Redis's clock. A
	// concurrency key, its limit and its rate are a queue's: each queue
	// has its own c0..c7.
	var hmu sync.Mutex
	inFlight, peak := map[string]int{}, map[string]int{}
	rated := map[string][]int64{}
	interrupted := map[string]bool{} // events with a run cut short by a shutdown, or whose outcome was not recorded
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		key := j.Queue + "/" + j.ConcurrencyKey
		hmu.Lock()
		inFlight[key]++
		peak[key] = max(peak[key], inFlight[key])
		if j.ConcurrencyKey == "c0" {
			rated[j.Queue] = append(rated[j.Queue], j.LeaseUntil.Add(-5*time.Second).UnixMilli())
		}
		hmu.Unlock()
		defer func() {
			hmu.Lock()
			inFlight[key]--
			if ctx.Err() != nil {
				interrupted[j.ID] = true
			}
			hmu.Unlock()
		}()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/hook?event="+j.ID+"&i="+string(j.Payload), nil)
		if err != nil {
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusTooManyRequests:
			d, err := time.ParseDuration(resp.Header.Get("Retry-After") + "s")
			if err != nil {
				return nil, err
			}
			return nil, Snooze(d)
		case resp.StatusCode >= 300:
			return nil, fmt.Errorf("receiver answered %d", resp.StatusCode)
		}
		return nil, nil
	})

	// The service runs, is shut down and starts again, while producers
	// enqueue the events.
	const events = 600
	ctx, stop := context.WithCancel(f.ctx)
	defer stop()
	var svc sync.WaitGroup
	var restarts atomic.Int64
	svc.Go(func() {
		wqs := []WeightedQueue{}
		for i, q := range queues {
			wqs = append(wqs, WeightedQueue{Queue: q, Weight: weights[i]})
		}
		for ctx.Err() == nil {
			life, end := context.WithTimeout(ctx, time.Duration(300+rand.N(500))*time.Millisecond)
			err := WorkQueues(life, h, wqs, &WorkQueuesOpts{WorkOpts: WorkOpts{Concurrency: 8, PollInterval: 50 * time.Millisecond,
				ShutdownGrace: time.Duration(rand.N(100)) * time.Millisecond,
				OnRecorded: func(j *Job, err error) {
					if err != nil {
						hmu.Lock()
						interrupted[j.ID] = true
						hmu.Unlock()
					}
				}}})
			end()
			if err != nil && !errors.Is(err, ErrHandlerStuck) {
				t.Errorf("WorkQueues: %v", err)
			}
			restarts.Add(1)
		}
	})
	ids := make([]string, events)
	for i := range events {
		q := queues[[]int{0, 1, 1, 2, 2, 2}[i%6]]
		j, err := q.Enqueue(f.ctx, "webhook", []byte(strconv.Itoa(i)), &EnqueueOpts{ConcurrencyKey: fmt.Sprintf("c%d", i%customers)})
		require.NoError(t, err)
		ids[i] = j.ID
		if i%50 == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		done := 0
		for _, q := range queues {
			st, err := q.Stats(f.ctx)
			require.NoError(t, err)
			done += int(st.Succeeded)
			require.Zero(t, st.Failed, "queue %s: no event failed for good", q.Name())
		}
		if done == events {
			break
		}
		require.True(t, time.Now().Before(deadline), "%d of %d events delivered after two minutes", done, events)
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	svc.Wait()

	rmu.Lock()
	defer rmu.Unlock()
	hmu.Lock()
	defer hmu.Unlock()
	twice := 0
	for i, id := range ids {
		require.Positive(t, delivered[id], "event %d was delivered", i)
		if delivered[id] > 1 {
			twice++
			require.True(t, interrupted[id], "event %d delivered twice, though no shutdown cut a run short and every outcome was recorded", i)
		}
	}
	for c, n := range peak {
		require.LessOrEqual(t, n, limit, "customer %s: deliveries under way at once", c)
	}
	most := 0
	for _, starts := range rated {
		most = max(most, mostInWindow(starts, period))
	}
	require.LessOrEqual(t, most, rate, "the rated customer's starts in any %v", period)
	// A 429 spends no attempt: an event that met only 429s, and no
	// shutdown, succeeded on its first attempt.
	snoozed := 0
	for i, id := range ids {
		j, err := getAny(queues, id)
		require.NoError(t, err)
		if i%5 == 0 && !interrupted[id] {
			require.Positive(t, j.Snoozes, "event %d snoozed on its 429", i)
			snoozed++
			if i%7 != 0 {
				require.Equal(t, 1, j.Attempt, "event %d: its 429 spent no attempt", i)
			}
		}
	}
	require.Positive(t, snoozed)
	t.Logf("%d events over 3 queues through %d restarts: %d 429s, %d delivered twice (a shutdown cut their run short after the receiver took them), "+
		"most deliveries of one customer at once %d (limit %d), most starts of the rated customer in %v %d (rate %d)",
		events, restarts.Load(), throttled.Load(), twice, slices.Max(mapValues(peak)), limit, period, most, rate)
}

// getAny reads job id from whichever of queues holds it.
func getAny(queues []*Queue, id string) (*Job, error) {
	for _, q := range queues {
		if j, err := q.Get(context.Background(), id); err == nil {
			return j, nil
		} else if !errors.Is(err, ErrNotFound) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("%w: %s in no queue", ErrNotFound, id)
}

func mapValues(m map[string]int) []int {
	var out []int
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
