package jobkey

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// ACLCommands are the only commands jobkey sends (README: "Least
// privilege"). HELLO is go-redis's connection handshake.
const ACLCommands = "+get +mget +set +exists +type +watch +unwatch +multi +exec " +
	"+zadd +zrem +zrange +zrangebyscore +zremrangebyscore +zcard +zcount +scan " +
	"+publish +subscribe +unsubscribe +ping +hello"

// aclLine is the ACL rule of the README for a key prefix.
func aclLine(user, pass, prefix string) string {
	return fmt.Sprintf("ACL SETUSER %s on >%s resetkeys ~%s:* resetchannels &%s:* -@all %s", user, pass, prefix, prefix, ACLCommands)
}

// The full lifecycle and the worker run as a user allowed only jobkey's
// commands on jobkey's keys and channels.
func TestLeastPrivilege(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	admin := redistest.ClientFor(t, srv.URL(), nil)
	prefix := "acl" + strings.ToLower(NewID()[20:])
	args := strings.Fields(aclLine("worker", "s3cret", prefix))
	cmd := make([]any, len(args))
	for i, a := range args {
		cmd[i] = a
	}
	require.NoError(t, admin.Do(ctx, cmd...).Err())

	rdb := redistest.ClientFor(t, srv.URL(), func(o *redis.Options) { o.Username, o.Password = "worker", "s3cret" })
	// The rule is real: other commands and other keys are refused.
	require.ErrorContains(t, rdb.FlushDB(ctx).Err(), "NOPERM")
	require.ErrorContains(t, rdb.Get(ctx, "other:key").Err(), "NOPERM")
	require.NoError(t, admin.Do(ctx, "acl", "log", "reset").Err())

	q, err := NewQueue(rdb, "q", &Config{Prefix: prefix, Lease: time.Second})
	require.NoError(t, err)
	j, err := q.Enqueue(ctx, "t", []byte("p"), &EnqueueOpts{ID: "one"})
	require.NoError(t, err)
	_, err = q.EnqueueMany(ctx, []NewJob{{Type: "t"}, {Type: "t", Opts: &EnqueueOpts{Delay: time.Hour}}})
	require.NoError(t, err)
	c, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	c, err = q.Extend(ctx, c)
	require.NoError(t, err)
	_, err = q.Fail(ctx, c, fmt.Errorf("once"))
	require.NoError(t, err)
	_, err = q.Get(ctx, j.ID)
	require.NoError(t, err)
	_, err = q.Cancel(ctx, j.ID)
	require.NoError(t, err)
	_, err = q.Retry(ctx, j.ID)
	require.NoError(t, err)
	_, err = q.Update(ctx, j.ID, func(j *Job) error { j.Payload = []byte("q"); return nil })
	require.NoError(t, err)

	done := make(chan struct{}, 4)
	wctx, stop := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() {
		werr <- q.Work(wctx, HandlerFunc(func(context.Context, *Job) ([]byte, error) {
			done <- struct{}{}
			return []byte("ok"), nil
		}), &WorkOpts{Logger: quiet, PollInterval: 50 * time.Millisecond})
	}()
	for range 2 { // "one" (retried) and the undelayed batch job
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("worker made no progress as the restricted user")
		}
	}
	require.Eventually(t, func() bool {
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		return st.Succeeded == 2
	}, 10*time.Second, 20*time.Millisecond)
	stop()
	require.NoError(t, <-werr)

	st, err := q.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{Pending: 1, Scheduled: 1, Succeeded: 2}, st)
	rep, err := q.Verify(ctx, false)
	require.NoError(t, err)
	require.Empty(t, rep.Findings)
	log, err := admin.Do(ctx, "acl", "log").Slice()
	require.NoError(t, err)
	require.Empty(t, log, "no command jobkey sent was refused")
}
