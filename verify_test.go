package jobkey

import (
	"context"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestVerifyFindsAndFixesTampering(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2})
	for _, id := range []string{"clean", "unlisted", "misplaced", "rescored", "twice", "active"} {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: id, Delay: time.Minute})
		require.NoError(t, err)
	}
	f.clock.Advance(time.Minute)
	c, err := f.q.Claim(f.ctx, "w") // one of them becomes active
	require.NoError(t, err)
	_, err = f.q.Release(f.ctx, c)
	require.NoError(t, err)
	rep, err := f.q.Verify(f.ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "normal operation leaves nothing to find")
	require.Equal(t, 6, rep.Jobs)

	k := f.q.Keys
	z := func(score float64, id string) redis.Z { return redis.Z{Score: score, Member: id} }
	require.NoError(t, f.rdb.ZRem(f.ctx, k("unlisted").Ready, "unlisted").Err())
	require.NoError(t, f.rdb.ZRem(f.ctx, k("misplaced").Ready, "misplaced").Err())
	require.NoError(t, f.rdb.ZAdd(f.ctx, k("misplaced").Leased, z(1, "misplaced")).Err())
	require.NoError(t, f.rdb.ZAdd(f.ctx, k("rescored").Ready, z(1, "rescored")).Err())
	require.NoError(t, f.rdb.ZAdd(f.ctx, k("twice").Failed, z(float64(toMillis(f.clock.Now())), "twice")).Err())
	require.NoError(t, f.rdb.ZAdd(f.ctx, k("ghost").Ready, z(1, "ghost")).Err())
	require.NoError(t, f.rdb.Set(f.ctx, k("broken").Job, "\xc1", 0).Err())
	values := map[string]string{}
	for _, id := range []string{"clean", "unlisted", "misplaced", "rescored", "twice", "active", "broken"} {
		values[id] = f.rdb.Get(f.ctx, k(id).Job).Val()
	}

	rep, err = f.q.Verify(f.ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	got := map[string]string{}
	for _, fd := range rep.Findings {
		got[fd.ID] = fd.Kind
		require.False(t, fd.Fixed)
	}
	require.Equal(t, map[string]string{
		"unlisted": "missing-entry", "misplaced": "wrong-entry", "rescored": "wrong-entry",
		"twice": "wrong-entry", "ghost": "stray-entry", "broken": "missing-entry",
	}, got)

	rep, err = f.q.Verify(f.ctx, &VerifyOpts{Keys: true, Fix: true})
	require.NoError(t, err)
	require.Len(t, rep.Findings, 6)
	for _, fd := range rep.Findings {
		require.True(t, fd.Fixed, fd.ID)
	}
	rep, err = f.q.Verify(f.ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "fix re-derived every entry")
	for id, v := range values {
		require.Equal(t, v, f.rdb.Get(f.ctx, k(id).Job).Val(), "%s: fix never writes a value", id)
	}
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 6, st.Pending)
	require.EqualValues(t, 1, st.Corrupt)
	var ids []string
	for range 6 {
		j, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	sort.Strings(ids)
	require.Equal(t, []string{"active", "clean", "misplaced", "rescored", "twice", "unlisted"}, ids)
}

// On a busy queue Verify reports only real disagreements: a snapshot
// re-check drops what only looked wrong between two reads (issue 10,
// item 6). By default it never scans the keyspace, so its cost follows
// the queue, not the database (item 10).
func TestVerifyOnABusyQueue(t *testing.T) {
	t.Parallel()
	q := realQueue(t, &Config{Shards: 4, Lease: time.Second})
	ctx := context.Background()
	for i := 0; i < 2000; i += 200 {
		batch := make([]JobSpec, 200)
		for k := range batch {
			batch[k] = JobSpec{Type: "t"}
		}
		_, err := q.EnqueueMany(ctx, batch)
		require.NoError(t, err)
	}
	rdb := q.rdb.(*redis.Client)
	var scans atomic.Int64
	rdb.AddHook(scanCounter{&scans})

	loadCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for loadCtx.Err() == nil {
			_, _ = q.Enqueue(loadCtx, "t", nil, nil)
		}
	}()
	startWork(t, q, HandlerFunc(func(context.Context, *Job) ([]byte, error) { return nil, nil }),
		&WorkOpts{Concurrency: 8, PollInterval: 10 * time.Millisecond})
	for range 20 {
		rep, err := q.Verify(ctx, nil)
		require.NoError(t, err)
		require.Empty(t, rep.Findings, "a live queue with nothing changed outside jobkey")
		require.Positive(t, rep.Entries)
	}
	require.Zero(t, scans.Load(), "the default Verify does not SCAN")
	_, err := q.Verify(ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Positive(t, scans.Load(), "Keys does")
}

// scanCounter counts SCAN commands a client sends.
type scanCounter struct{ n *atomic.Int64 }

func (h scanCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h scanCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "scan" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h scanCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
