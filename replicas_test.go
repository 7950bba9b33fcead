package jobkey

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/jobkey/jobkey/internal/rttcount"
)

// replicated is a queue on the master of a master and one replica, with
// a client of the replica to look at what it holds.
type replicated struct {
	set     *redistest.Replicated
	q       *Queue
	master  *redis.Client
	replica *redis.Client
	hook    *rttcount.Hook
	sent    *cmdLog
	ctx     context.Context
}

func setupReplicated(t *testing.T, cfg Config) *replicated {
	t.Helper()
	set := redistest.StartReplicated(t, 1)
	r := &replicated{set: set, hook: &rttcount.Hook{}, sent: &cmdLog{}, ctx: context.Background()}
	r.master = redistest.ClientFor(t, set.Master.URL(), func(o *redis.Options) { o.DisableIdentity = true })
	r.master.AddHook(r.hook)
	r.master.AddHook(r.sent)
	r.replica = redistest.ClientFor(t, set.Replicas[0].URL(), nil)
	cfg.Prefix = redistest.Prefix(t)
	q, err := NewQueue(r.master, "q", &cfg)
	require.NoError(t, err)
	require.NoError(t, q.check(r.ctx, true), "the one-time checks, outside every count")
	r.q = q
	return r
}

// onReplica reads job id as the replica holds it.
func (r *replicated) onReplica(t *testing.T, id string) *Job {
	t.Helper()
	key, _ := r.q.ks.jobKeyOf(id)
	b, err := r.replica.Get(r.ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	require.NoError(t, err)
	j := new(Job)
	require.NoError(t, Unmarshal(b, j))
	return j
}

// loadedReplicaTimeout is a ReplicaTimeout that a loaded machine's replica
// keeps while it runs: tests whose replica is frozen for a while, and whose
// writes before or after must be confirmed, use it rather than a shorter
// one that those writes would sometimes miss. A frozen replica's writes
// each wait it out.
const loadedReplicaTimeout = time.Second

// untilReplicated calls write until it returns anything but
// ErrNotReplicated, as a caller retries: a replica just thawed on a loaded
// machine may take longer than a short ReplicaTimeout to catch up.
func untilReplicated[T any](t *testing.T, write func() (T, error)) (T, error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, err := write()
		if !errors.Is(err, ErrNotReplicated) || time.Now().After(deadline) {
			return v, err
		}
	}
}

// freeze stops the replica's process until the returned func thaws it and
// waits for its link to the master to be up again.
func (r *replicated) freeze(t *testing.T) (thaw func()) {
	t.Helper()
	s := r.set.Replicas[0]
	require.NoError(t, s.Freeze())
	var once sync.Once
	thaw = func() {
		once.Do(func() {
			require.NoError(t, s.Thaw())
			require.NoError(t, r.set.WaitSynced(10*time.Second))
		})
	}
	t.Cleanup(func() { _ = s.Thaw() })
	return thaw
}

// cmdLog records the names of the commands of every pipeline a client
// sends.
type cmdLog struct {
	mu    sync.Mutex
	pipes [][]string
}

func (l *cmdLog) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (l *cmdLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (l *cmdLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := make([]string, len(cmds))
		for i, c := range cmds {
			names[i] = c.Name()
		}
		l.mu.Lock()
		l.pipes = append(l.pipes, names)
		l.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (l *cmdLog) reset() { l.mu.Lock(); l.pipes = nil; l.mu.Unlock() }

func (l *cmdLog) all() [][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.pipes)
}

func TestAcknowledgedWritesAreOnTheReplica(t *testing.T) {
	t.Parallel()
	r := setupReplicated(t, Config{MinReplicas: 1, ReplicaTimeout: 5 * time.Second})
	for _, group := range []bool{false, true} {
		r.q.cfg.DisableGroupCommit = group
		j, err := r.q.Enqueue(r.ctx, "t", []byte("p"), nil)
		require.NoError(t, err)
		// WAIT answered after the replica acknowledged the offset, so it
		// holds the job as soon as the call returns.
		require.NotNil(t, r.onReplica(t, j.ID))
		c, err := r.q.Claim(r.ctx, "w")
		require.NoError(t, err)
		require.Equal(t, StateActive, r.onReplica(t, c.ID).State)
		c, err = r.q.Extend(r.ctx, c)
		require.NoError(t, err)
		require.Equal(t, c.LeaseUntil, r.onReplica(t, c.ID).LeaseUntil)
		_, err = r.q.Complete(r.ctx, c, []byte("done"))
		require.NoError(t, err)
		require.Equal(t, StateSucceeded, r.onReplica(t, c.ID).State)
	}
	res, err := r.q.CancelPending(r.ctx, "")
	require.NoError(t, err)
	require.Zero(t, res.Done)
}

func TestUnreplicatedWriteReturnsReplicationError(t *testing.T) {
	t.Parallel()
	r := setupReplicated(t, Config{MinReplicas: 1, ReplicaTimeout: loadedReplicaTimeout})
	thaw := r.freeze(t)
	j, err := r.q.Enqueue(r.ctx, "t", nil, &EnqueueOpts{ID: "a"})
	require.ErrorIs(t, err, ErrNotReplicated)
	require.Nil(t, j)
	var re *ReplicationError
	require.ErrorAs(t, err, &re)
	require.Equal(t, 0, re.Acked)
	require.Equal(t, 1, re.Want)
	require.Equal(t, loadedReplicaTimeout, re.Timeout)
	require.Contains(t, err.Error(), "applied on the master")
	// Applied on the master, as the error says.
	stored, err := r.q.Get(r.ctx, "a")
	require.NoError(t, err)
	require.Equal(t, StatePending, stored.State)
	// Still unconfirmed, the retry finds its job and waits again.
	_, err = r.q.Enqueue(r.ctx, "t", nil, &EnqueueOpts{ID: "a"})
	require.ErrorIs(t, err, ErrNotReplicated)
	thaw()
	_, err = untilReplicated(t, func() (*Job, error) { return r.q.Enqueue(r.ctx, "t", nil, &EnqueueOpts{ID: "a"}) })
	require.ErrorIs(t, err, ErrJobExists)
	require.NotErrorIs(t, err, ErrNotReplicated)
	require.NotNil(t, r.onReplica(t, "a"))
}

// Complete, Fail and Release recognise their own earlier write, so
// calling again after ErrNotReplicated changes nothing more and answers
// once the replica has it; Extend simply renews again.
func TestRetryAfterNotReplicatedIsSafe(t *testing.T) {
	t.Parallel()
	r := setupReplicated(t, Config{MinReplicas: 1, ReplicaTimeout: loadedReplicaTimeout,
		Backoff: func(int) time.Duration { return time.Hour }})
	_, err := r.q.EnqueueMany(r.ctx, []JobSpec{{Type: "t"}, {Type: "t"}, {Type: "t"}, {Type: "t"}})
	require.NoError(t, err)
	claim := func() *Job {
		c, err := r.q.Claim(r.ctx, "w")
		require.NoError(t, err)
		return c
	}
	jobs := []*Job{claim(), claim(), claim(), claim()}
	type outcome struct {
		name  string
		write func(j *Job) (*Job, error)
		want  State
	}
	outcomes := []outcome{
		{"Complete", func(j *Job) (*Job, error) { return r.q.Complete(r.ctx, j, []byte("r")) }, StateSucceeded},
		{"Fail", func(j *Job) (*Job, error) { return r.q.Fail(r.ctx, j, errors.New("boom")) }, StatePending},
		{"Release", func(j *Job) (*Job, error) { return r.q.Release(r.ctx, j) }, StatePending},
		{"Extend", func(j *Job) (*Job, error) { return r.q.Extend(r.ctx, j) }, StateActive},
	}
	for i, o := range outcomes {
		thaw := r.freeze(t)
		_, err := o.write(jobs[i])
		require.ErrorIs(t, err, ErrNotReplicated, o.name)
		onMaster, err := r.q.Get(r.ctx, jobs[i].ID)
		require.NoError(t, err)
		require.Equal(t, o.want, onMaster.State, o.name)
		thaw()
		rev := onMaster.Rev
		got, err := untilReplicated(t, func() (*Job, error) { return o.write(jobs[i]) })
		require.NoError(t, err, o.name)
		require.Equal(t, o.want, got.State, o.name)
		if o.name != "Extend" {
			require.Equal(t, rev, got.Rev, "%s: the retry recognised its write and wrote nothing", o.name)
		}
		require.Equal(t, got.Rev, r.onReplica(t, got.ID).Rev, o.name)
	}
}

// On Redis 7.2 and Valkey, WAIT counts only the connection's own last
// propagated write. A call that answers from a write it recognises must
// then write first, in the same round trip, or its WAIT confirms nothing.
func TestRecognisedWriteWritesBeforeItsWait(t *testing.T) {
	t.Parallel()
	r := setupReplicated(t, Config{MinReplicas: 1, DisableGroupCommit: true})
	_, err := r.q.Enqueue(r.ctx, "t", nil, &EnqueueOpts{ID: "a"})
	require.NoError(t, err)
	c, err := r.q.Claim(r.ctx, "w")
	require.NoError(t, err)
	_, err = r.q.Complete(r.ctx, c, nil)
	require.NoError(t, err)
	for name, again := range map[string]func() error{
		"Complete": func() error { _, err := r.q.Complete(r.ctx, c, nil); return err },
		"Enqueue": func() error {
			_, err := r.q.Enqueue(r.ctx, "t", nil, &EnqueueOpts{ID: "a"})
			if errors.Is(err, ErrJobExists) {
				return nil
			}
			return err
		},
	} {
		r.sent.reset()
		r.hook.Reset()
		require.NoError(t, again(), name)
		require.Equal(t, int64(2), r.hook.RTT.Load(), "%s: the read, then UNWATCH, the write and WAIT", name)
		pipes := r.sent.all()
		require.Len(t, pipes, 2, name)
		require.Equal(t, []string{"unwatch", "set", "wait"}, pipes[1], name)
	}
}

// A ReplicaTimeout above the client's ReadTimeout ends in a
// *ReplicationError, not in an i/o timeout of the connection.
func TestReplicaTimeoutAboveReadTimeout(t *testing.T) {
	t.Parallel()
	r := setupReplicated(t, Config{MinReplicas: 1, ReplicaTimeout: 4 * time.Second})
	rdb := redistest.ClientFor(t, r.set.Master.URL(), func(o *redis.Options) { o.ReadTimeout = 3 * time.Second })
	q, err := NewQueue(rdb, "q", &r.q.cfg)
	require.NoError(t, err)
	r.q = q
	_ = r.freeze(t)
	start := time.Now()
	_, err = r.q.Enqueue(r.ctx, "t", nil, nil)
	require.ErrorIs(t, err, ErrNotReplicated)
	var re *ReplicationError
	require.ErrorAs(t, err, &re)
	require.NoError(t, re.Err, "WAIT answered: it was not cut short")
	require.GreaterOrEqual(t, time.Since(start), 4*time.Second)
}

// Work takes ErrNotReplicated on an outcome for a lost reply: it records
// the outcome again until the replica confirms it.
func TestWorkRetriesAnUnreplicatedOutcome(t *testing.T) {
	t.Parallel()
	r := setupReplicated(t, Config{MinReplicas: 1, ReplicaTimeout: 100 * time.Millisecond, Lease: 10 * time.Second})
	// On a loaded machine the replica may take longer than 100 ms: the
	// caller then enqueues again with the same ID, as the error says.
	j, err := r.q.Enqueue(r.ctx, "t", nil, &EnqueueOpts{ID: "unreplicated-outcome"})
	for errors.Is(err, ErrNotReplicated) || errors.Is(err, ErrJobExists) {
		if err == nil || errors.Is(err, ErrJobExists) {
			break
		}
		j, err = r.q.Enqueue(r.ctx, "t", nil, &EnqueueOpts{ID: "unreplicated-outcome"})
	}
	if errors.Is(err, ErrJobExists) {
		err = nil
	}
	require.NoError(t, err)
	ran := make(chan struct{})
	release := make(chan struct{})
	var mu sync.Mutex
	var recorded []error
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- r.q.Work(ctx, HandlerFunc(func(context.Context, *Job) ([]byte, error) {
			close(ran)
			<-release
			return []byte("ok"), nil
		}), &WorkOpts{Concurrency: 1, OnRecorded: func(_ *Job, err error) {
			mu.Lock()
			recorded = append(recorded, err)
			mu.Unlock()
		}})
	}()
	<-ran
	thaw := r.freeze(t)
	close(release)
	time.Sleep(700 * time.Millisecond) // several tries, each unconfirmed
	mu.Lock()
	require.Empty(t, recorded, "an unconfirmed outcome is not final")
	mu.Unlock()
	thaw()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(recorded) == 1
	}, 10*time.Second, 20*time.Millisecond)
	mu.Lock()
	require.NoError(t, recorded[0])
	mu.Unlock()
	require.Equal(t, StateSucceeded, r.onReplica(t, j.ID).State)
	cancel()
	require.NoError(t, <-done)
}

// MinReplicas costs no round trip: WAIT rides in EXEC's pipeline, and a
// recognised write's WAIT in the one that replaces its UNWATCH.
func TestMinReplicasAddsNoRoundTrip(t *testing.T) {
	t.Parallel()
	set := redistest.StartReplicated(t, 1)
	counts := map[int][]int64{}
	for _, n := range []int{0, 1} {
		hook := &rttcount.Hook{}
		rdb := redistest.ClientFor(t, set.Master.URL(), func(o *redis.Options) { o.DisableIdentity = true })
		rdb.AddHook(hook)
		q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(t), MinReplicas: n, DisableGroupCommit: true,
			Backoff: func(int) time.Duration { return 0 }})
		require.NoError(t, err)
		ctx := r0(t, q)
		var c *Job
		ops := []func() error{
			func() error { _, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "a"}); return err },
			func() error {
				_, err := q.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "a"})
				return ignore(err, ErrJobExists)
			},
			func() error {
				_, err := q.EnqueueMany(ctx, []JobSpec{{Type: "t", Opts: &EnqueueOpts{Delay: time.Hour}}, {Type: "t", Opts: &EnqueueOpts{Delay: time.Hour}}})
				return err
			},
			func() (err error) { c, err = q.Claim(ctx, "w"); return },
			func() (err error) { c, err = q.Extend(ctx, c); return },
			func() error { _, err := q.Fail(ctx, c, errors.New("x")); return err },
			func() (err error) { c, err = q.Claim(ctx, "w"); return },
			func() error { _, err := q.Release(ctx, c); return err },
			func() (err error) { c, err = q.Claim(ctx, "w"); return },
			func() error { _, err := q.Complete(ctx, c, nil); return err },
			func() error { _, err := q.Complete(ctx, c, nil); return err },
			func() error { _, err := q.CancelPending(ctx, ""); return err },
		}
		for i, op := range ops {
			hook.Reset()
			require.NoError(t, op(), "op %d, MinReplicas %d", i, n)
			counts[n] = append(counts[n], hook.RTT.Load())
		}
	}
	require.Equal(t, counts[0], counts[1], "round trips per call, MinReplicas 0 then 1")
}

// r0 runs the queue's one-time checks outside every count.
func r0(t *testing.T, q *Queue) context.Context {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, q.check(ctx, true))
	return ctx
}

func ignore(err, target error) error {
	if errors.Is(err, target) {
		return nil
	}
	return err
}

func TestReplicaConfigIsValidated(t *testing.T) {
	t.Parallel()
	for _, c := range []Config{{MinReplicas: -1}, {MinReplicas: 65}, {MinReplicas: 1, ReplicaTimeout: time.Microsecond}, {ReplicaTimeout: time.Hour}} {
		_, err := NewQueue(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), "q", &c)
		require.ErrorIs(t, err, ErrInvalid, "%+v", c)
	}
}

// A claim the replicas have not confirmed could be lost by a failover,
// and the job run again beside its first run: Work starts no handler on
// it until a renewal of its lease is confirmed, on the plain claim path
// and on the fused one (the next job claimed with a completion).
func TestHandlerWaitsForItsClaimToBeReplicated(t *testing.T) {
	t.Parallel()
	// A second is a timeout a loaded machine's replica keeps; the claims
	// made while it is frozen wait out the freeze all the same.
	r := setupReplicated(t, Config{MinReplicas: 1, ReplicaTimeout: time.Second, Lease: 10 * time.Second})
	enqueue := func(id string) {
		t.Helper()
		// A loaded machine's replica may take longer than 100ms to confirm
		// a write before it was frozen: the caller calls again.
		_, err := untilReplicated(t, func() (*Job, error) { return r.q.Enqueue(r.ctx, "t", nil, &EnqueueOpts{ID: id}) })
		require.NoError(t, err)
	}
	enqueue("first")
	started := make(chan string, 2)
	hold := make(chan struct{})
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	done := make(chan error, 1)
	// The plain claim.
	thaw := r.freeze(t)
	go func() {
		done <- r.q.Work(ctx, HandlerFunc(func(_ context.Context, j *Job) ([]byte, error) {
			started <- j.ID // first: a read of the frozen replica would wait for it
			if j.ID == "first" {
				<-hold
			}
			return nil, nil
		}), &WorkOpts{Concurrency: 1})
	}()
	select {
	case id := <-started:
		t.Fatalf("handler of %s started on a claim no replica confirmed", id)
	case <-time.After(r.q.cfg.ReplicaTimeout + 500*time.Millisecond): // past the replica timeout: a claim left unconfirmed then never runs
	}
	thaw()
	require.Equal(t, "first", <-started)

	// The fused path: completing "first" claims "second" in one EXEC.
	enqueue("second")
	thaw = r.freeze(t)
	close(hold)
	select {
	case id := <-started:
		t.Fatalf("handler of %s started on a claim no replica confirmed", id)
	case <-time.After(r.q.cfg.ReplicaTimeout + 500*time.Millisecond): // past the replica timeout: a claim left unconfirmed then never runs
	}
	thaw()
	require.Equal(t, "second", <-started)
	cancel()
	require.NoError(t, <-done)
}

// In a batch whose write the replicas did not confirm, a job that the
// batch refused (its lease lost) is told so, not that its write is
// unconfirmed: nothing was written for it.
func TestUnconfirmedBatchKeepsEachRefusal(t *testing.T) {
	t.Parallel()
	r := setupReplicated(t, Config{MinReplicas: 1, ReplicaTimeout: 2 * time.Second}) // a loaded machine's replica is slow
	_, err := r.q.EnqueueMany(r.ctx, []JobSpec{{Type: "t", Opts: &EnqueueOpts{ID: "a"}}, {Type: "t", Opts: &EnqueueOpts{ID: "b"}}})
	require.NoError(t, err)
	a, err := r.q.Claim(r.ctx, "w")
	require.NoError(t, err)
	b, err := r.q.Claim(r.ctx, "w")
	require.NoError(t, err)
	stale := cloneJob(a)
	stale.LeaseToken++ // a lease this copy no longer holds
	_ = r.freeze(t)
	_, errs := r.q.fencedMany(r.ctx, []*Job{stale, b}, []string{idxLeased}, nil,
		func(int) transition { return r.q.extend }, nil)
	require.ErrorIs(t, errs[0], ErrLeaseLost)
	require.NotErrorIs(t, errs[0], ErrNotReplicated, "nothing was written for it")
	require.ErrorIs(t, errs[1], ErrNotReplicated)
}

// A claim the replicas never confirm (more wanted than there are) is
// given back unrun before its lease could end, and Claim says why.
func TestClaimNeverConfirmedIsGivenBack(t *testing.T) {
	t.Parallel()
	r := setupReplicated(t, Config{Lease: time.Second})
	j, err := r.q.Enqueue(r.ctx, "t", nil, nil)
	require.NoError(t, err)
	cfg := r.q.cfg
	cfg.MinReplicas, cfg.ReplicaTimeout = 2, 50*time.Millisecond
	q, err := NewQueue(r.master, "q", &cfg)
	require.NoError(t, err)
	start := time.Now()
	_, err = q.Claim(r.ctx, "w")
	require.ErrorIs(t, err, ErrNotReplicated)
	require.Less(t, time.Since(start), 4*time.Second)
	require.Eventually(t, func() bool {
		got, err := r.q.Get(r.ctx, j.ID)
		require.NoError(t, err)
		return got.State == StatePending && got.Attempt == 0 // given back, the attempt it never ran not spent
	}, 5*time.Second, 20*time.Millisecond)
}

// Writes that wait for replicas end their pipeline with WAIT: Work's
// finishes carry no ride behind their EXEC, and every job runs once.
func TestWaitForReplicasCarriesNoRide(t *testing.T) {
	t.Parallel()
	r := setupReplicated(t, Config{MinReplicas: 1, ReplicaTimeout: 5 * time.Second, Logger: quietLog()})
	var carried atomic.Int32
	r.master.AddHook(pipeHook(func(_ context.Context, cmds []redis.Cmder) error {
		if redistest.CarriesRead(cmds) {
			carried.Add(1)
		}
		return nil
	}))
	const n = 200
	runs, m := burnDown(t, r.q, n, 8)
	requireOnceEach(t, r.q, runs, n)
	require.Zero(t, m.Rides)
	require.Zero(t, carried.Load(), "pipelines with a read after their EXEC")
}

// With MinReplicas, Pause and Resume wait for the replicas as every write
// of a job does: with the replica frozen, the flags are written on the
// master only and the error says so; once it is back, the replica holds
// the queue paused, and then resumed, before each call returns.
func TestPauseAndResumeWaitForTheReplicas(t *testing.T) {
	t.Parallel()
	r := setupReplicated(t, Config{MinReplicas: 1, ReplicaTimeout: loadedReplicaTimeout, Shards: 4})
	pausedOnReplica := func() int {
		n := 0
		for s := range r.q.ks.shards {
			if r.replica.Exists(r.ctx, r.q.ks.pauseKey(s)).Val() == 1 {
				n++
			}
		}
		return n
	}

	thaw := r.freeze(t)
	err := r.q.Pause(r.ctx)
	require.ErrorIs(t, err, ErrNotReplicated)
	var se *ShardsError
	require.ErrorAs(t, err, &se)
	require.Equal(t, []int{0, 1, 2, 3}, sortedInts(se.Shards))
	require.ErrorContains(t, err, "written on the master only")
	st, err := r.q.Stats(r.ctx)
	require.NoError(t, err)
	require.True(t, st.Paused, "applied on the master all the same")
	thaw()

	_, err = untilReplicated(t, func() (struct{}, error) { return struct{}{}, r.q.Pause(r.ctx) })
	require.NoError(t, err, "paused again: the flags already set are confirmed")
	require.Equal(t, 4, pausedOnReplica(), "the replica holds every shard paused once Pause returned")

	_, err = untilReplicated(t, func() (struct{}, error) { return struct{}{}, r.q.Resume(r.ctx) })
	require.NoError(t, err)
	require.Zero(t, pausedOnReplica(), "the replica holds every shard resumed once Resume returned")
}

func sortedInts(in []int) []int {
	out := slices.Clone(in)
	slices.Sort(out)
	return out
}
