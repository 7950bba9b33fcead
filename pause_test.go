package jobkey

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// While paused, claims take nothing on any shard, enqueues go on, and
// Stats says so; Resume lets the jobs through.
func TestPauseStopsClaims(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	for range 20 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, nil)
		require.NoError(t, err)
	}
	require.NoError(t, f.q.Pause(f.ctx))
	_, err := f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob)
	_, err = f.q.ClaimMany(f.ctx, "w", 10)
	require.ErrorIs(t, err, ErrNoJob)
	_, err = f.q.Enqueue(f.ctx, "t", nil, nil)
	require.NoError(t, err, "Enqueue still accepts jobs")
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.True(t, st.Paused)
	require.Equal(t, 4, st.PausedShards)
	require.Equal(t, int64(21), st.Due)

	require.NoError(t, f.q.Resume(f.ctx))
	got, err := f.q.ClaimMany(f.ctx, "w", 21)
	require.NoError(t, err)
	require.NotEmpty(t, got)
	st, err = f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.False(t, st.Paused)
}

// A claim that found its candidate before Pause takes nothing once Pause
// has returned: whether Pause lands before its WATCH+GET round trip (the
// claim reads the flag there) or between that and its EXEC (the watched
// flag aborts the EXEC).
func TestPauseAbortsAClaimInFlight(t *testing.T) {
	t.Parallel()
	for _, at := range []string{"watch", "multi"} {
		t.Run(at, func(t *testing.T) {
			f := setup(t, &Config{DisableGroupCommit: true})
			_, err := f.q.Enqueue(f.ctx, "t", nil, nil)
			require.NoError(t, err)
			admin := queueOn(t, redistest.Client(t, nil), f.q.cfg.Prefix, Config{})
			var paused atomic.Bool
			f.rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
				if slices.ContainsFunc(names(cmds), func(n string) bool { return strings.HasPrefix(n, at) }) && paused.CompareAndSwap(false, true) {
					require.NoError(t, admin.Pause(context.Background()))
				}
				return nil
			}))
			_, err = f.q.Claim(f.ctx, "w")
			require.ErrorIs(t, err, ErrNoJob, "Pause landed before the claim's %s", at)
			require.True(t, paused.Load())
			st, err := f.q.Stats(f.ctx)
			require.NoError(t, err)
			require.Equal(t, int64(1), st.Due)
			require.Equal(t, int64(0), st.Active)
		})
	}
}

// A fused complete-and-claim that takes its candidate from the pool, read
// ahead before Pause, and reads nothing ahead (the pool holds enough)
// claims nothing once Pause has returned: the candidate's pause flag is
// watched and read in the MGET of the flags, whether Pause lands before
// its WATCH round trip or between that and its EXEC (the watched flag
// aborts the EXEC, and the retry reads it set). The completion commits.
func TestPauseStopsFusedClaimsFromThePool(t *testing.T) {
	t.Parallel()
	for _, at := range []string{"watch", "multi"} {
		t.Run(at, func(t *testing.T) {
			t.Parallel()
			f := setup(t, nil)
			for range 10 {
				_, err := f.q.Enqueue(f.ctx, "t", nil, nil)
				require.NoError(t, err)
			}
			first, err := f.q.Claim(f.ctx, "w") // the others wait in the pool
			require.NoError(t, err)
			admin := queueOn(t, redistest.Client(t, nil), f.q.cfg.Prefix, Config{})
			var paused atomic.Bool
			var sentCmds []string
			f.rdb.AddHook(pipeHook(func(ctx context.Context, cmds []redis.Cmder) error {
				sentCmds = append(sentCmds, names(cmds)...)
				if slices.ContainsFunc(names(cmds), func(n string) bool { return strings.HasPrefix(n, at) }) && paused.CompareAndSwap(false, true) {
					require.NoError(t, admin.Pause(context.Background()))
				}
				return nil
			}))
			out, err := f.q.completeAndClaim(f.ctx, first, []byte("r"), "w")
			require.NoError(t, err)
			require.True(t, paused.Load())
			require.False(t, slices.ContainsFunc(sentCmds, func(n string) bool { return strings.HasPrefix(n, "zrangebyscore") }),
				"the pool held enough: nothing was read ahead")
			require.Equal(t, StateSucceeded, out.done.State)
			require.Nil(t, out.next, "Pause landed before the complete-and-claim transaction's %s", at)
			st, err := f.q.Stats(f.ctx)
			require.NoError(t, err)
			require.Equal(t, int64(9), st.Due)
			require.Equal(t, int64(0), st.Active)
		})
	}
}

// One read of shards' flags names each flag once, a shard's pause flag
// and its priority flag beside it, and tells which is set: Pause's flag
// on shard 2 and a priority flag on shard 1 are told apart, in one MGET
// on a single Redis.
func TestShardFlagsTellPauseFromPriorityInOneRead(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 3})
	fl := &shardFlags{}
	fl.add(f.q.ks, 1, false)
	fl.add(f.q.ks, 2, true)
	fl.add(f.q.ks, 1, true)
	fl.add(f.q.ks, 2, true)
	require.Equal(t, []string{f.q.ks.pauseKey(1), f.q.ks.pauseKey(2), f.q.ks.index(2, prioFlag), f.q.ks.index(1, prioFlag)}, fl.keys)
	require.NoError(t, f.rdb.Set(f.ctx, f.q.ks.pauseKey(2), "1", 0).Err())
	var set func() []bool
	f.hook.Reset()
	_, err := f.rdb.Pipelined(f.ctx, func(p redis.Pipeliner) error {
		set = f.q.readFlags(f.ctx, p, fl)
		return nil
	})
	require.NoError(t, err)
	require.EqualValues(t, 1, f.hook.Cmds.Load())
	got := set()
	require.False(t, fl.paused(got, 1))
	require.True(t, fl.paused(got, 2))
	require.False(t, fl.paused(got, 0), "not read")
	require.False(t, fl.anyPrio(got))

	require.NoError(t, f.rdb.Set(f.ctx, f.q.ks.index(1, prioFlag), "1", 0).Err())
	_, err = f.rdb.Pipelined(f.ctx, func(p redis.Pipeliner) error {
		set = f.q.readFlags(f.ctx, p, fl)
		return nil
	})
	require.NoError(t, err)
	got = set()
	require.True(t, fl.anyPrio(got))
	require.False(t, fl.paused(got, 1), "the priority flag is not a pause")
}

// Work: a paused queue lets the handler in flight finish and record its
// outcome, takes nothing new, and picks up again at Resume without waiting
// for its poll interval.
func TestPauseWork(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.q.clock.Fake = nil // Work's leases run on real time
	release := make(chan struct{})
	started := make(chan string, 10)
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- f.q.Work(ctx, HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
			started <- j.ID
			if j.Type == "slow" {
				<-release
			}
			return nil, nil
		}), &WorkOpts{Concurrency: 2, PollInterval: time.Hour})
	}()
	slow, err := f.q.Enqueue(f.ctx, "slow", nil, nil)
	require.NoError(t, err)
	require.Equal(t, slow.ID, <-started)
	require.NoError(t, f.q.Pause(f.ctx))
	late, err := f.q.Enqueue(f.ctx, "fast", nil, nil)
	require.NoError(t, err)
	close(release)
	require.Eventually(t, func() bool {
		j, err := f.q.Get(f.ctx, slow.ID)
		return err == nil && j.State == StateSucceeded
	}, 5*time.Second, 10*time.Millisecond, "the job in flight finishes")
	select {
	case id := <-started:
		t.Fatalf("job %s started while paused", id)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, f.q.Resume(f.ctx))
	select {
	case id := <-started:
		require.Equal(t, late.ID, id)
	case <-time.After(5 * time.Second):
		t.Fatal("Resume did not wake the worker")
	}
	cancel()
	require.NoError(t, <-done)
	_, err = f.q.Get(f.ctx, late.ID)
	require.False(t, errors.Is(err, ErrNotFound))
}

// dropKey is a hook that leaves out of every pipeline the commands on key,
// answering them with a connection error, as a node that is down would.
type dropKey string

func (h dropKey) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h dropKey) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h dropKey) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var keep []redis.Cmder
		for _, c := range cmds {
			if a := c.Args(); len(a) > 1 && a[1] == string(h) {
				c.SetErr(errors.New("dial tcp 10.0.0.9:6379: connect: connection refused"))
				continue
			}
			keep = append(keep, c)
		}
		return next(ctx, keep)
	}
}

// A Pause that could not write a shard's flag says it could not be
// written (not read), names it, and the other shards are paused.
func TestPauseNamesTheShardsItCouldNotWrite(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	f.rdb.AddHook(dropKey(f.q.ks.pauseKey(2)))
	err := f.q.Pause(f.ctx)
	var se *ShardsError
	require.ErrorAs(t, err, &se)
	require.Equal(t, []int{2}, se.Shards)
	require.True(t, se.Write)
	require.ErrorContains(t, err, "1 of 4 shards could not be written ([2])")
	plain := redistest.Client(t, nil)
	for s := range 4 {
		n, err := plain.Exists(f.ctx, f.q.ks.pauseKey(s)).Result()
		require.NoError(t, err)
		require.Equal(t, int64(map[bool]int{true: 0, false: 1}[s == 2]), n, "shard %d's flag", s)
	}
}
