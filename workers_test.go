package jobkey

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// A running Work lists itself with its process, its slots, the jobs its
// runners hold and the schedules it keeps; once it returns it is gone at
// once.
func TestWorkersListsEachRunningWorkWithItsRunsAndSchedules(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
	ctx := context.Background()
	release := make(chan struct{})
	started := make(chan string, 4)
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		started <- j.ID
		<-release
		return nil, nil
	})
	stop := startWork(t, q, h, &WorkOpts{Name: "box-1", Concurrency: 3, PollInterval: 20 * time.Millisecond,
		Periodic: []PeriodicJob{{Name: "hourly", Schedule: Every(time.Hour), Type: "report"}}})
	defer close(release)
	var ids []string
	for range 2 {
		j, err := q.Enqueue(ctx, "mail", nil, nil)
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	<-started
	<-started
	var w WorkerInfo
	waitFor(t, "the report to show both runs", func() bool {
		ws, err := q.Workers(ctx)
		require.NoError(t, err)
		if len(ws) != 1 || ws[0].Busy != 2 {
			return false
		}
		w = ws[0]
		return true
	})
	host, _ := os.Hostname()
	require.Equal(t, "box-1", w.Name)
	require.Equal(t, host, w.Host)
	require.Equal(t, os.Getpid(), w.PID)
	require.Equal(t, []string{"q"}, w.Queues)
	require.Equal(t, 3, w.Slots)
	require.NotEmpty(t, w.Version)
	require.False(t, w.StartedAt.IsZero())
	require.Equal(t, w.SeenAt.Add(q.cfg.Lease), w.LapsesAt)
	var running []string
	for _, r := range w.Running {
		running = append(running, r.ID)
		require.Equal(t, "box-1", WorkerOf(r.Runner), "a run's lease owner names its worker")
		require.Equal(t, "mail", r.Type)
		require.Equal(t, 1, r.Attempt)
	}
	slices.Sort(running)
	slices.Sort(ids)
	require.Equal(t, ids, running)
	for _, id := range ids {
		j, err := q.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, "box-1", WorkerOf(j.LeaseOwner), "a running job's page can link its worker")
	}
	require.Len(t, w.Schedules, 1)
	s := w.Schedules[0]
	require.Equal(t, ScheduleInfo{Name: "hourly", Spec: "every 1h0m0s", Type: "report",
		NextTick: w.SeenAt.Truncate(time.Hour).Add(time.Hour), LastTick: w.SeenAt.Truncate(time.Hour),
		LastJobID: periodicID("hourly", w.SeenAt.Truncate(time.Hour))}, s)

	release <- struct{}{}
	release <- struct{}{}
	stop()
	ws, err := q.Workers(ctx)
	require.NoError(t, err)
	require.Empty(t, ws, "a Work that returned takes itself off the list")
}

// A process that dies leaves its report to lapse: off the list one Lease
// after its last renewal by Redis's clock, and its key gone by its TTL.
func TestWorkerThatStopsRenewingDropsOffWithinALease(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	dead := &worker{q: f.q, o: WorkOpts{Name: "gone-7", Concurrency: 2}, running: map[*run]struct{}{}, queues: []string{"q"}}
	require.NoError(t, dead.report(f.ctx))
	ws, err := f.q.Workers(f.ctx)
	require.NoError(t, err)
	require.Len(t, ws, 1)
	ttl, err := f.rdb.PTTL(f.ctx, f.q.ks.workerKey("gone-7")).Result()
	require.NoError(t, err)
	require.True(t, ttl > 0 && ttl <= f.q.cfg.Lease, "the report expires by itself: TTL %v", ttl)

	f.clock.Advance(f.q.cfg.Lease - time.Millisecond)
	ws, err = f.q.Workers(f.ctx)
	require.NoError(t, err)
	require.Len(t, ws, 1, "still within its Lease")
	f.clock.Advance(2 * time.Millisecond)
	ws, err = f.q.Workers(f.ctx)
	require.NoError(t, err)
	require.Empty(t, ws, "lapsed")

	// The next report of any worker drops the lapsed entry.
	live := &worker{q: f.q, o: WorkOpts{Name: "live-1", Concurrency: 1}, running: map[*run]struct{}{}, queues: []string{"q"}}
	require.NoError(t, live.report(f.ctx))
	names, err := f.rdb.ZRange(f.ctx, f.q.ks.workersKey(), 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{"live-1"}, names)
}

// A report that cannot be read is listed with why, and left as it is.
func TestWorkersListsAnUnreadableReportAndKeepsIt(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	w := &worker{q: f.q, o: WorkOpts{Name: "ok-1", Concurrency: 1}, running: map[*run]struct{}{}, queues: []string{"q"}}
	require.NoError(t, w.report(f.ctx))
	bad := &worker{q: f.q, o: WorkOpts{Name: "bad-1", Concurrency: 1}, running: map[*run]struct{}{}, queues: []string{"q"}}
	require.NoError(t, bad.report(f.ctx))
	require.NoError(t, f.rdb.Set(f.ctx, f.q.ks.workerKey("bad-1"), "\x00{not json", time.Minute).Err())
	require.NoError(t, f.rdb.Set(f.ctx, f.q.ks.workerKey("ok-1"), `{"v":9,"name":"ok-1"}`, time.Minute).Err())
	ws, err := f.q.Workers(f.ctx)
	require.NoError(t, err)
	require.Len(t, ws, 2)
	require.Equal(t, "bad-1", ws[0].Name)
	require.ErrorIs(t, ws[0].Err, ErrCorrupt)
	require.Equal(t, "ok-1", ws[1].Name)
	require.ErrorIs(t, ws[1].Err, ErrUnsupportedFormat, "a later version is not read as empty")
	v, err := f.rdb.Get(f.ctx, f.q.ks.workerKey("bad-1")).Result()
	require.NoError(t, err)
	require.Equal(t, "\x00{not json", v)
}

func TestWorkerOfNamesTheWorkOfALeaseOwner(t *testing.T) {
	t.Parallel()
	require.Equal(t, "host-12-abc", WorkerOf("host-12-abc/3"))
	require.Equal(t, "a/b", WorkerOf("a/b/0"))
	require.Equal(t, "w", WorkerOf("w"), "an owner that is not a runner's (Claim's caller) is its own name")
	require.Equal(t, "w/x", WorkerOf("w/x"))
	require.Equal(t, "", WorkerOf(""))
}

// During shutdown's grace the report still lists the runs Work waits for;
// it goes when Work returns.
func TestWorkerReportOutlivesShutdownUntilItsRunsEnd(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
	ctx := context.Background()
	release, started := make(chan struct{}), make(chan struct{}, 1)
	h := HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		started <- struct{}{}
		<-release
		return nil, nil
	})
	stop := startWork(t, q, h, &WorkOpts{Name: "closing-1", PollInterval: 20 * time.Millisecond, ShutdownGrace: time.Minute})
	_, err := q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	<-started
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	time.Sleep(2 * reportGap) // shutdown has begun; the report may be rewritten meanwhile
	ws, err := q.Workers(ctx)
	require.NoError(t, err)
	require.Len(t, ws, 1)
	require.Equal(t, 1, ws[0].Busy, "the run shutdown waits for")
	close(release)
	<-stopped
	ws, err = q.Workers(ctx)
	require.NoError(t, err)
	require.Empty(t, ws)
}

// A Work on a host whose clock runs hours off reports when it started by
// Redis's clock, as every other time of its report.
func TestWorkerReportsItsStartByRedisTimeOnASkewedHost(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	q := skewedQueue(t, redistest.Prefix(t), 2*time.Hour, Config{})
	before, err := redistest.Client(t, nil).Time(ctx).Result()
	require.NoError(t, err)
	stop := startWork(t, q, HandlerFunc(func(context.Context, *Job) ([]byte, error) { return nil, nil }), &WorkOpts{Name: "skewed-1"})
	defer stop()
	var ws []WorkerInfo
	require.Eventually(t, func() bool {
		ws, err = q.Workers(ctx)
		require.NoError(t, err)
		return len(ws) == 1
	}, 10*time.Second, 20*time.Millisecond)
	require.WithinDuration(t, before, ws[0].StartedAt, time.Minute, "by Redis's clock, not the host's 2h ahead")
	require.WithinDuration(t, before, ws[0].SeenAt, time.Minute)
}
