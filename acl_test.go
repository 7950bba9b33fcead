package jobkey

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// The ACL lines of the README ("Least privilege and TLS"), one per role, for
// the default prefix "jobkey". The tests below run them exactly as written,
// each on a redis-server of its own (ACL users are server-wide), and
// TestACLLinesInREADME keeps the README showing these very lines.
//
// Every line has TIME (jobkey decides by Redis's clock) and INFO (a
// Queue's first call reads maxmemory-policy, to refuse a Redis that may
// evict acknowledged jobs).
const (
	// A producer enqueues, and reads its jobs (Get) and the counts (Stats).
	aclProducer = "ACL SETUSER jobkey-producer on >PASSWORD resetkeys ~jobkey:* resetchannels &jobkey:*:wake -@all " +
		"+watch +unwatch +multi +exec +get +mget +exists +type +set +zadd +zcard +zcount +publish +time +info"
	// A worker claims, extends, completes, fails and releases jobs, runs
	// Work (pub/sub wake-ups and cancel messages) and reads Get and Stats.
	aclWorker = "ACL SETUSER jobkey-worker on >PASSWORD resetkeys ~jobkey:* resetchannels &jobkey:* -@all " +
		"+watch +unwatch +multi +exec +get +mget +exists +type +set +zadd +zrem +zremrangebyscore +zrange +zrangebyscore +zcard +zcount +subscribe +ping +time +info"
	// An admin does everything: Cancel, Retry, Update, Verify, List,
	// Delete, the bulk actions, Pause, Resume and Queues too. Verify and
	// Queues are the only users of SCAN, whose results ACL key patterns do
	// not filter; Delete is the only user of DEL.
	aclAdmin = "ACL SETUSER jobkey-admin on >PASSWORD resetkeys ~jobkey:* resetchannels &jobkey:* -@all " +
		"+watch +unwatch +multi +exec +get +mget +exists +type +set +zadd +zrem +zremrangebyscore +zrange +zrangebyscore +zcard +zcount +zscore +del +publish +subscribe +ping +scan +time +info"

	// A reader sees everything and changes nothing: Get, Stats, List,
	// Verify without Fix, Queues and LookupShards, as a read-only UI does.
	// Its keys are read-only (%R~), so no grant can make it write.
	aclReader = "ACL SETUSER jobkey-reader on >PASSWORD resetkeys %R~jobkey:* resetchannels -@all " +
		"+get +mget +exists +type +zrange +zrangebyscore +zcard +zcount +zscore +scan +time +info"

	// Appended to every line on a Redis Cluster: go-redis's ClusterClient
	// loads the slot map with CLUSTER SLOTS, reads the command table
	// (COMMAND) once for the first command it routes by itself, and sends
	// ASKING before a command it follows to a slot being migrated.
	aclCluster = "+cluster|slots +command +asking"
	// Appended to every line when the client selects a DB other than 0:
	// go-redis sends SELECT on each new connection then.
	aclSelect = "+select"
	// Appended to every line that writes when Config.MinReplicas is set:
	// each write ends with WAIT. A call that answers from a write it
	// recognises first writes a key of the queue's with SET, which every
	// line that writes already grants.
	aclReplicas = "+wait"
	// Appended to every line that writes when the queue's events are on
	// (Queue.EnableEvents): each transition's EXEC appends its event. A
	// line without it has every transition refused whole (EXECABORT).
	aclEvents = "+xadd"
	// Appended to the reader's line to read the events (Queue.Events,
	// FollowEvents): each shard's XINFO STREAM and XRANGE in a MULTI.
	aclEventsReader = "+xinfo|stream +xrange +xread +multi +exec"
)

// aclPassword is the password of every line.
const aclPassword = "PASSWORD"

// aclUser returns the user an ACL line creates.
func aclUser(line string) string { return strings.Fields(line)[2] }

// createUser runs line, with extra rules appended, on every addr (ACL
// SETUSER is per node on a cluster) and clears the ACL log.
func createUser(t *testing.T, line, extra string, addrs ...string) {
	t.Helper()
	var cmd []any
	for _, f := range strings.Fields(line + " " + extra) {
		cmd = append(cmd, f)
	}
	for _, a := range addrs {
		root := redistest.ClientFor(t, "redis://"+a, nil)
		require.NoError(t, root.Do(context.Background(), cmd...).Err())
		require.NoError(t, root.Do(context.Background(), "acl", "log", "reset").Err())
	}
}

// asUser returns a client of url that authenticates as line's user.
func asUser(t *testing.T, url, line string) *redis.Client {
	t.Helper()
	return redistest.ClientFor(t, url, func(o *redis.Options) { o.Username, o.Password = aclUser(line), aclPassword })
}

// aclLog returns the entries of ACL LOG on every addr, one line each.
func aclLog(t *testing.T, addrs ...string) []string {
	t.Helper()
	var out []string
	for _, a := range addrs {
		root := redistest.ClientFor(t, "redis://"+a, nil)
		entries, err := root.Do(context.Background(), "acl", "log").Slice()
		require.NoError(t, err)
		for _, e := range entries {
			m, _ := e.(map[any]any)
			out = append(out, fmt.Sprintf("%s: %v refused %v %v (in %v)", a, m["username"], m["reason"], m["object"], m["context"]))
		}
	}
	return out
}

// requireNothingRefused checks that Redis refused no command on any addr.
func requireNothingRefused(t *testing.T, addrs ...string) {
	t.Helper()
	require.Empty(t, aclLog(t, addrs...), "commands jobkey sent were refused")
}

// requireTime checks that the user may read Redis's clock (TIME).
func requireTime(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	now, err := rdb.Time(context.Background()).Result()
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), now, time.Minute)
}

// produce does what a producer does: enqueue (a new ID, a taken one, a
// batch, a delayed job), Get and Stats. It leaves tag-a, tag-b, tag-c and
// tag-e due and tag-d scheduled an hour ahead.
func produce(t *testing.T, q *Queue, tag string) {
	t.Helper()
	ctx := context.Background()
	_, err := q.Enqueue(ctx, "t", []byte("p"), &EnqueueOpts{ID: tag + "-a"})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "t", []byte("p"), &EnqueueOpts{ID: tag + "-a"})
	require.ErrorIs(t, err, ErrJobExists) // writes nothing: UNWATCH
	_, err = q.EnqueueMany(ctx, []JobSpec{
		{Type: "t", Opts: &EnqueueOpts{ID: tag + "-b"}},
		{Type: "t", Opts: &EnqueueOpts{ID: tag + "-c"}},
		{Type: "t", Opts: &EnqueueOpts{ID: tag + "-d", Delay: time.Hour}},
		{Type: "t", Opts: &EnqueueOpts{ID: tag + "-e"}},
	})
	require.NoError(t, err)
	j, err := q.Get(ctx, tag+"-a")
	require.NoError(t, err)
	require.Equal(t, StatePending, j.State)
	_, err = q.Get(ctx, tag+"-missing")
	require.ErrorIs(t, err, ErrNotFound)
	_, err = q.Stats(ctx)
	require.NoError(t, err)
}

// work does what a worker does, one call at a time, on a queue with four due
// jobs and a Backoff of zero: Claim, Extend, Release, Fail (once with a
// retry, once for good), Complete, ClaimMany and CompleteMany of the other
// two (on a single Redis, one transaction of MGET and EXISTS), Get and Stats,
// until nothing is due.
func work(t *testing.T, q *Queue) {
	t.Helper()
	ctx := context.Background()
	claim := func() *Job {
		t.Helper()
		j, err := q.Claim(ctx, "w")
		require.NoError(t, err)
		return j
	}
	j, err := q.Extend(ctx, claim())
	require.NoError(t, err)
	j, err = q.Release(ctx, j)
	require.NoError(t, err)
	require.Equal(t, StatePending, j.State)
	j, err = q.Fail(ctx, claim(), errors.New("again"))
	require.NoError(t, err)
	require.Equal(t, StatePending, j.State)
	j, err = q.Fail(ctx, claim(), fmt.Errorf("for good: %w", ErrSkipRetry))
	require.NoError(t, err)
	require.Equal(t, StateFailed, j.State)
	j, err = q.Complete(ctx, claim(), []byte("ok"))
	require.NoError(t, err)
	require.Equal(t, StateSucceeded, j.State)
	many, err := q.ClaimMany(ctx, "w", 100)
	require.NoError(t, err)
	require.NotEmpty(t, many)
	_, err = q.CompleteMany(ctx, many, nil)
	require.NoError(t, err)
	_, err = q.Claim(ctx, "w")
	require.ErrorIs(t, err, ErrNoJob)
	_, err = q.Get(ctx, j.ID)
	require.NoError(t, err)
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Due+st.Active)
}

// runWork runs Work on q until three things have happened as q's user: a
// job enqueued on feed while the worker idled was picked up at once (the
// wake-up message: the poll interval is a minute), a running job canceled
// on admin had its handler's context canceled (the cancel message: the
// lease is renewed only every 10 s), and the idle subscription was checked
// with PING (go-redis pings a subscription quiet for 3 s).
func runWork(t *testing.T, q, feed, admin *Queue, addrs []string) {
	t.Helper()
	ctx := context.Background()
	started := make(chan string, 1)
	handled := make(chan string, 10)
	canceled := make(chan error, 1)
	wctx, stop := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() {
		werr <- q.Work(wctx, HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
			if j.Type == "block" {
				started <- j.ID
				<-ctx.Done()
				canceled <- context.Cause(ctx)
				return nil, ctx.Err()
			}
			handled <- j.ID
			return nil, nil
		}), &WorkOpts{Concurrency: 2, PollInterval: time.Minute, Logger: quiet})
	}()
	defer func() {
		stop()
		require.NoError(t, <-werr)
	}()

	time.Sleep(300 * time.Millisecond) // the worker has found nothing due and waits
	_, err := feed.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "wake"})
	require.NoError(t, err)
	select {
	case id := <-handled:
		require.Equal(t, "wake", id)
	case <-time.After(10 * time.Second):
		t.Fatal("the worker was not woken by the enqueue")
	}

	_, err = feed.Enqueue(ctx, "block", nil, &EnqueueOpts{ID: "blocker"})
	require.NoError(t, err)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the blocking job did not start")
	}
	// The worker's report, written as its user, lists the running job.
	require.Eventually(t, func() bool {
		ws, err := admin.Workers(ctx)
		require.NoError(t, err)
		return len(ws) == 1 && ws[0].Busy == 1 && len(ws[0].Running) == 1 && ws[0].Running[0].ID == "blocker"
	}, 10*time.Second, 20*time.Millisecond, "the worker's report lists its run")
	_, err = admin.Cancel(ctx, "blocker")
	require.NoError(t, err)
	select {
	case cause := <-canceled:
		require.ErrorIs(t, cause, ErrJobCanceled)
	case <-time.After(5 * time.Second):
		t.Fatal("the cancel message did not reach the handler")
	}

	user := "user=" + aclUser(aclWorker) + " "
	require.Eventually(t, func() bool {
		for _, a := range addrs {
			root := redistest.ClientFor(t, "redis://"+a, nil)
			list, err := root.ClientList(ctx).Result()
			require.NoError(t, err)
			for _, c := range strings.Split(list, "\n") {
				if strings.Contains(c, user) && strings.Contains(c, " cmd=ping ") {
					return true
				}
			}
		}
		return false
	}, 10*time.Second, 100*time.Millisecond, "the subscription was never pinged")
}

// A producer enqueues and reads its jobs and the counts; it cannot claim,
// cancel, retry, scan, publish a cancel message or touch other keys.
func TestLeastPrivilegeProducer(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	root, err := NewQueue(redistest.ClientFor(t, srv.URL(), nil), "q", nil)
	require.NoError(t, err)
	_, err = root.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "dead", MaxAttempts: 1})
	require.NoError(t, err)
	c, err := root.Claim(ctx, "w")
	require.NoError(t, err)
	_, err = root.Fail(ctx, c, errors.New("no"))
	require.NoError(t, err)
	createUser(t, aclProducer, "", srv.Addr)
	rdb := asUser(t, srv.URL(), aclProducer)
	q, err := NewQueue(rdb, "q", nil)
	require.NoError(t, err)

	produce(t, q, "p")
	requireTime(t, rdb)
	requireNothingRefused(t, srv.Addr)

	// Outside the role.
	_, err = q.Claim(ctx, "w")
	require.ErrorContains(t, err, "NOPERM this user has no permissions to run the 'zrangebyscore' command")
	_, err = q.Cancel(ctx, "p-a")
	require.ErrorContains(t, err, "NOPERM this user has no permissions to run the 'zrem' command")
	j, err := q.Get(ctx, "p-a")
	require.NoError(t, err)
	require.Equal(t, StatePending, j.State, "the refused Cancel wrote nothing")
	_, err = q.Retry(ctx, "dead")
	require.ErrorContains(t, err, "NOPERM this user has no permissions to run the 'zrem' command")
	_, err = q.Verify(ctx, &VerifyOpts{Keys: true})
	require.ErrorContains(t, err, "NOPERM")
	require.ErrorContains(t, rdb.Scan(ctx, 0, "*", 10).Err(), "NOPERM")
	require.ErrorContains(t, rdb.Publish(ctx, q.ks.cancelChannel(), "p-a").Err(), "NOPERM")
	require.ErrorContains(t, rdb.FlushDB(ctx).Err(), "NOPERM")
	require.ErrorContains(t, rdb.Get(ctx, "other:key").Err(), "NOPERM")
	require.ErrorContains(t, rdb.Set(ctx, "other:key", "x", 0).Err(), "NOPERM")
	require.NotEmpty(t, aclLog(t, srv.Addr), "the refusals are logged")
}

// A worker claims, renews, finishes and releases jobs and runs Work with its
// wake-ups and cancel messages; it cannot enqueue (no PUBLISH), scan
// (Verify), publish a cancel message or touch other keys.
func TestLeastPrivilegeWorker(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	cfg := &Config{Lease: 30 * time.Second, Backoff: func(int) time.Duration { return 0 }}
	root, err := NewQueue(redistest.ClientFor(t, srv.URL(), nil), "q", cfg)
	require.NoError(t, err)
	createUser(t, aclWorker, "", srv.Addr)
	rdb := asUser(t, srv.URL(), aclWorker)
	q, err := NewQueue(rdb, "q", cfg)
	require.NoError(t, err)

	produce(t, root, "w")
	work(t, q)
	runWork(t, q, root, root, []string{srv.Addr})
	requireTime(t, rdb)
	requireNothingRefused(t, srv.Addr)

	// Outside the role.
	_, err = q.Enqueue(ctx, "t", nil, nil)
	require.ErrorContains(t, err, "NOPERM this user has no permissions to run the 'publish' command")
	_, err = q.Cancel(ctx, "w-d")
	require.ErrorContains(t, err, "NOPERM this user has no permissions to run the 'publish' command")
	_, err = q.Verify(ctx, &VerifyOpts{Keys: true})
	require.ErrorContains(t, err, "NOPERM this user has no permissions to run the 'scan' command")
	require.ErrorContains(t, rdb.Scan(ctx, 0, "*", 10).Err(), "NOPERM")
	require.ErrorContains(t, rdb.Publish(ctx, q.ks.cancelChannel(), "w-d").Err(), "NOPERM")
	require.ErrorContains(t, rdb.FlushDB(ctx).Err(), "NOPERM")
	require.ErrorContains(t, rdb.Get(ctx, "other:key").Err(), "NOPERM")
	require.ErrorContains(t, rdb.Del(ctx, q.Keys("w-d").Job).Err(), "NOPERM")
	require.NotEmpty(t, aclLog(t, srv.Addr), "the refusals are logged")
}

// An admin runs the whole lifecycle, the worker, Stats and Verify (SCAN);
// it still cannot flush, configure or touch keys outside the prefix. SCAN
// lists those keys all the same, which is why only this line grants it.
func TestLeastPrivilegeAdmin(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	plain := redistest.ClientFor(t, srv.URL(), nil)
	require.NoError(t, plain.Set(ctx, "other:key", "x", 0).Err())
	createUser(t, aclAdmin, "", srv.Addr)
	rdb := asUser(t, srv.URL(), aclAdmin)

	q, err := NewQueue(rdb, "q", &Config{Lease: time.Second})
	require.NoError(t, err)
	j, err := q.Enqueue(ctx, "t", []byte("p"), &EnqueueOpts{ID: "one"})
	require.NoError(t, err)
	_, err = q.EnqueueMany(ctx, []JobSpec{{Type: "t"}, {Type: "t", Opts: &EnqueueOpts{Delay: time.Hour}}})
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
	rep, err := q.Verify(ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Empty(t, rep.Findings)
	require.NoError(t, plain.ZRem(ctx, q.Keys(j.ID).Succeeded, j.ID).Err()) // changed outside jobkey
	rep, err = q.Verify(ctx, &VerifyOpts{Keys: true, Fix: true})
	require.NoError(t, err)
	require.Len(t, rep.Findings, 1)

	// The operator's calls.
	page, err := q.List(ctx, ListOpts{State: StateSucceeded})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 2)
	require.NoError(t, q.Pause(ctx))
	require.NoError(t, q.Resume(ctx))
	_, err = q.CancelPending(ctx, "")
	require.NoError(t, err)
	_, err = q.RetryFailed(ctx, "")
	require.NoError(t, err)
	res, err := q.DeleteFinished(ctx, StateCanceled, "")
	require.NoError(t, err)
	require.Equal(t, 1, res.Done, "the scheduled job, canceled")
	require.NoError(t, q.Delete(ctx, j.ID))
	names, err := Queues(ctx, rdb, "")
	require.NoError(t, err)
	require.Equal(t, []string{"q"}, names)
	requireTime(t, rdb)
	requireNothingRefused(t, srv.Addr)

	keys, _, err := rdb.Scan(ctx, 0, "*", 1000).Result()
	require.NoError(t, err)
	require.Contains(t, keys, "other:key", "ACL key patterns do not filter SCAN")
	require.ErrorContains(t, rdb.Get(ctx, "other:key").Err(), "NOPERM")
	require.ErrorContains(t, rdb.FlushDB(ctx).Err(), "NOPERM")
	require.ErrorContains(t, rdb.Keys(ctx, "*").Err(), "NOPERM")
	require.ErrorContains(t, rdb.ConfigGet(ctx, "*").Err(), "NOPERM")
}

// A reader opens a queue that exists and reads all of it, and Redis
// refuses it nothing: opening a queue reads its stored shard count, and
// writes it only when it is missing. It writes nothing, even when it
// tries.
func TestLeastPrivilegeReader(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	plain := redistest.ClientFor(t, srv.URL(), nil)
	admin, err := NewQueue(plain, "q", &Config{Shards: 4})
	require.NoError(t, err)
	produce(t, admin, "r")
	createUser(t, aclReader, "", srv.Addr)
	rdb := asUser(t, srv.URL(), aclReader)

	n, err := LookupShards(ctx, rdb, "jobkey", "q")
	require.NoError(t, err)
	q, err := NewQueue(rdb, "q", &Config{Shards: n})
	require.NoError(t, err)
	j, err := q.Get(ctx, "r-a")
	require.NoError(t, err)
	require.Equal(t, StatePending, j.State)
	st, err := q.Stats(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 5, st.Pending)
	page, err := q.List(ctx, ListOpts{State: StatePending})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 5)
	rep, err := q.Verify(ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Empty(t, rep.Findings)
	_, err = q.Workers(ctx)
	require.NoError(t, err)
	_, err = q.Throughput(ctx, time.Now().Add(-time.Hour), time.Now(), time.Minute)
	require.NoError(t, err)
	names, err := Queues(ctx, rdb, "")
	require.NoError(t, err)
	require.Equal(t, []string{"q"}, names)
	requireTime(t, rdb)
	requireNothingRefused(t, srv.Addr)

	before, err := plain.Get(ctx, q.Keys("r-a").Job).Result()
	require.NoError(t, err)
	_, err = q.Cancel(ctx, "r-a")
	require.ErrorContains(t, err, "NOPERM")
	_, err = q.Enqueue(ctx, "t", nil, nil)
	require.ErrorContains(t, err, "NOPERM")
	after, err := plain.Get(ctx, q.Keys("r-a").Job).Result()
	require.NoError(t, err)
	require.Equal(t, before, after, "nothing was written")
	require.ErrorContains(t, rdb.Set(ctx, "jobkey:{q}:meta", "shards=2", 0).Err(), "NOPERM")
}

// On a 3-master cluster the lines need aclCluster, on every node: without
// it the slot map cannot be loaded, and without COMMAND go-redis logs and
// retries its command-table read. With it, producers, workers and an admin
// run through ClusterClients, across a slot half way through a move (ASK,
// ASKING) and while slots move under load, and no node refuses anything.
func TestLeastPrivilegeCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	ctx := context.Background()
	addrs := cl.Addrs()
	asClusterUser := func(line string) *redis.ClusterClient {
		return cl.Client(t, func(o *redis.ClusterOptions) { o.Username, o.Password = aclUser(line), aclPassword })
	}
	cfg := &Config{Lease: 30 * time.Second, Backoff: func(int) time.Duration { return 0 }}

	// CLUSTER SLOTS and COMMAND are needed (ASKING: below).
	createUser(t, aclProducer, "", addrs...)
	bare, err := NewQueue(asClusterUser(aclProducer), "q", cfg)
	require.NoError(t, err)
	_, err = bare.Get(ctx, "x")
	require.ErrorContains(t, err, "NOPERM")
	require.ErrorContains(t, err, "cluster|slots")
	createUser(t, aclProducer, "+cluster|slots", addrs...)
	noCommand, err := NewQueue(asClusterUser(aclProducer), "q", cfg)
	require.NoError(t, err)
	_, err = noCommand.Get(ctx, "x")
	require.ErrorIs(t, err, ErrNotFound)
	require.Contains(t, strings.Join(aclLog(t, addrs...), "\n"), "refused command command (", "go-redis read the command table")

	for _, line := range []string{aclProducer, aclWorker, aclAdmin} {
		createUser(t, line, aclCluster, addrs...)
	}
	prodRDB, workRDB, adminRDB := asClusterUser(aclProducer), asClusterUser(aclWorker), asClusterUser(aclAdmin)
	prod, err := NewQueue(prodRDB, "q", cfg)
	require.NoError(t, err)
	wrk, err := NewQueue(workRDB, "q", cfg)
	require.NoError(t, err)
	admin, err := NewQueue(adminRDB, "q", cfg)
	require.NoError(t, err)

	produce(t, prod, "c")
	work(t, wrk)
	runWork(t, wrk, prod, admin, addrs)
	for _, rdb := range []redis.UniversalClient{prodRDB, workRDB, adminRDB} {
		requireTime(t, rdb)
	}

	// A slot half way through a move: commands for its keys already moved
	// are answered with ASK, which go-redis follows with ASKING.
	keys := prod.Keys("c-d") // scheduled an hour ahead: still pending
	target, finish := halfMigrate(t, cl, keys.Job, keys.Ready)
	asking := calls(t, target, "asking")
	for _, q := range []*Queue{prod, wrk, admin} {
		j, err := q.Get(ctx, "c-d")
		require.NoError(t, err)
		require.Equal(t, StatePending, j.State)
		st, err := q.Stats(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, st.Scheduled)
	}
	require.Greater(t, calls(t, target, "asking"), asking, "go-redis followed ASK")
	finish()

	// Producers and a worker run while slots move, as the restricted users.
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for p := range 2 {
		wg.Go(func() {
			for n := 0; loadCtx.Err() == nil; n++ {
				if _, err := prod.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("r%d-%d", p, n)}); err != nil {
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	wctx, stopWork := context.WithCancel(ctx)
	werr := make(chan error, 1)
	go func() {
		werr <- wrk.Work(wctx, HandlerFunc(func(context.Context, *Job) ([]byte, error) { return nil, nil }),
			&WorkOpts{Concurrency: 8, PollInterval: 20 * time.Millisecond, Logger: quiet})
	}()
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, cl.Reshard(cl.Nodes[0], cl.Nodes[1], 2000))
	stopLoad()
	wg.Wait()
	require.Eventually(t, func() bool {
		st, err := prod.Stats(ctx)
		return err == nil && st.Due+st.Active == 0
	}, 60*time.Second, 20*time.Millisecond)
	stopWork()
	require.NoError(t, <-werr)

	rep, err := admin.Verify(ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Empty(t, rep.Findings)
	requireNothingRefused(t, addrs...)

	_, err = prod.Claim(ctx, "w")
	require.ErrorContains(t, err, "NOPERM")
	_, err = wrk.Verify(ctx, &VerifyOpts{Keys: true})
	require.ErrorContains(t, err, "NOPERM")
}

// halfMigrate starts moving the slot of keys (one slot) from its master to
// another, as redis-cli --cluster reshard does, and moves only keys: the
// slot is MIGRATING on its owner and IMPORTING on the target, so commands
// for keys are answered with ASK. It returns the target's address and a
// function that completes the move.
func halfMigrate(t *testing.T, cl *redistest.Cluster, keys ...string) (string, func()) {
	t.Helper()
	ctx := context.Background()
	rdb := cl.Client(t, nil)
	node, err := rdb.MasterForKey(ctx, keys[0])
	require.NoError(t, err)
	slot, err := node.ClusterKeySlot(ctx, keys[0]).Result()
	require.NoError(t, err)
	var from, to *redis.Client
	var fromID, toID, toAddr string
	for _, a := range cl.Addrs() {
		c := redistest.ClientFor(t, "redis://"+a, nil)
		id, err := c.ClusterMyID(ctx).Result()
		require.NoError(t, err)
		switch {
		case a == node.Options().Addr:
			from, fromID = c, id
		case to == nil:
			to, toID, toAddr = c, id, a
		}
	}
	host, port, err := net.SplitHostPort(toAddr)
	require.NoError(t, err)
	migrate := func(keys ...string) {
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		require.NoError(t, from.Do(ctx, args...).Err())
	}
	require.NoError(t, to.Do(ctx, "cluster", "setslot", slot, "importing", fromID).Err())
	require.NoError(t, from.Do(ctx, "cluster", "setslot", slot, "migrating", toID).Err())
	migrate(keys...)
	return toAddr, func() {
		for {
			rest, err := from.ClusterGetKeysInSlot(ctx, int(slot), 1000).Result()
			require.NoError(t, err)
			if len(rest) == 0 {
				break
			}
			migrate(rest...)
		}
		require.NoError(t, to.Do(ctx, "cluster", "setslot", slot, "node", toID).Err())
		require.NoError(t, from.Do(ctx, "cluster", "setslot", slot, "node", toID).Err())
		for _, a := range cl.Addrs() {
			c := redistest.ClientFor(t, "redis://"+a, nil)
			require.NoError(t, c.Do(ctx, "cluster", "setslot", slot, "node", toID).Err())
		}
		require.NoError(t, cl.WaitOK(30*time.Second))
	}
}

// calls returns how often addr ran cmd (INFO commandstats).
func calls(t *testing.T, addr, cmd string) int64 {
	t.Helper()
	info, err := redistest.ClientFor(t, "redis://"+addr, nil).Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, err := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	return 0
}

// With a DB other than 0 the lines need aclSelect: go-redis selects the DB
// on every new connection, the subscription's included.
func TestLeastPrivilegeSelectDB(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	url := srv.URL() + "/3"
	cfg := &Config{Lease: 30 * time.Second, Backoff: func(int) time.Duration { return 0 }}

	createUser(t, aclProducer, "", srv.Addr)
	require.ErrorContains(t, asUser(t, url, aclProducer).Get(ctx, "jobkey:x").Err(), "NOPERM")
	require.Contains(t, strings.Join(aclLog(t, srv.Addr), "\n"), "refused command select (")

	for _, line := range []string{aclProducer, aclWorker, aclAdmin} {
		createUser(t, line, aclSelect, srv.Addr)
	}
	prodRDB, workRDB := asUser(t, url, aclProducer), asUser(t, url, aclWorker)
	prod, err := NewQueue(prodRDB, "q", cfg)
	require.NoError(t, err)
	wrk, err := NewQueue(workRDB, "q", cfg)
	require.NoError(t, err)
	admin, err := NewQueue(asUser(t, url, aclAdmin), "q", cfg)
	require.NoError(t, err)

	produce(t, prod, "s")
	work(t, wrk)
	runWork(t, wrk, prod, admin, []string{srv.Addr})
	requireTime(t, prodRDB)
	requireTime(t, workRDB)
	rep, err := admin.Verify(ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Empty(t, rep.Findings)
	require.Positive(t, rep.Jobs)
	requireNothingRefused(t, srv.Addr)

	n, err := redistest.ClientFor(t, url, nil).DBSize(ctx).Result()
	require.NoError(t, err)
	require.Positive(t, n, "the jobs are in DB 3")
	n, err = redistest.ClientFor(t, srv.URL(), nil).DBSize(ctx).Result()
	require.NoError(t, err)
	require.Zero(t, n, "and not in DB 0")
}

// The README shows the very lines the tests run.
func TestACLLinesInREADME(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	readme := string(b)
	for _, line := range []string{aclProducer, aclWorker, aclAdmin, aclReader} {
		require.True(t, strings.Contains(readme, "\n"+line+"\n"), "README.md lacks the line\n%s", line)
	}
	for _, extra := range []string{aclCluster, aclSelect, aclReplicas} {
		require.True(t, strings.Contains(readme, "`"+extra+"`"), "README.md lacks `%s`", extra)
	}
}

// With MinReplicas, the producer, worker and admin lines need aclReplicas,
// and nothing more: every write ends with WAIT, and a retried write that
// recognises its own writes with SET first.
func TestLeastPrivilegeWithReplicas(t *testing.T) {
	t.Parallel()
	set := redistest.StartReplicated(t, 1)
	srv := set.Master
	ctx := context.Background()
	cfg := &Config{MinReplicas: 1, ReplicaTimeout: 5 * time.Second, Backoff: func(int) time.Duration { return 0 }}
	root, err := NewQueue(redistest.ClientFor(t, srv.URL(), nil), "q", cfg)
	require.NoError(t, err)
	for _, line := range []string{aclProducer, aclWorker, aclAdmin} {
		createUser(t, line, aclReplicas, srv.Addr)
	}
	producer, err := NewQueue(asUser(t, srv.URL(), aclProducer), "q", cfg)
	require.NoError(t, err)
	produce(t, producer, "p")
	_, err = producer.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "p-a"})
	require.ErrorIs(t, err, ErrJobExists, "a taken ID: SET, then WAIT")
	worker, err := NewQueue(asUser(t, srv.URL(), aclWorker), "q", cfg)
	require.NoError(t, err)
	produce(t, root, "w")
	work(t, worker)
	admin, err := NewQueue(asUser(t, srv.URL(), aclAdmin), "q", cfg)
	require.NoError(t, err)
	_, err = admin.CancelPending(ctx, "")
	require.NoError(t, err)
	requireNothingRefused(t, srv.Addr)

	// Without +wait the write lands on the master, unconfirmed, and says why.
	createUser(t, aclProducer, "", srv.Addr)
	bare, err := NewQueue(asUser(t, srv.URL(), aclProducer), "q", cfg)
	require.NoError(t, err)
	_, err = bare.Enqueue(ctx, "t", nil, &EnqueueOpts{ID: "bare"})
	require.ErrorIs(t, err, ErrNotReplicated)
	require.ErrorContains(t, err, "NOPERM this user has no permissions to run the 'wait' command")
	require.True(t, final(err), "Work does not retry what only a grant can fix")
}
