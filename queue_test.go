package jobkey

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestNewQueueRefuses(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t, nil)
	for name, c := range map[string]struct {
		queue string
		cfg   Config
		want  string
	}{
		"empty name":     {"", Config{}, "queue name is empty"},
		"brace":          {"a{b", Config{}, "hash tag"},
		"close brace":    {"a}", Config{}, "hash tag"},
		"colon":          {"a:b", Config{}, "contains"},
		"space":          {"a b", Config{}, "space"},
		"long":           {strings.Repeat("q", 200), Config{}, "limit 128"},
		"shards":         {"q", Config{Shards: 5000}, "Shards"},
		"lease":          {"q", Config{Lease: time.Millisecond}, "Lease"},
		"attempts":       {"q", Config{MaxAttempts: -1}, "MaxAttempts"},
		"attempts limit": {"q", Config{MaxAttempts: MaxAttemptsLimit + 1}, "MaxAttempts"},
		"value limit":    {"q", Config{MaxValueBytes: MaxValueBytes + 1}, "MaxValueBytes"},
		"prefix brace":   {"q", Config{Prefix: "x{"}, "hash tag"},
		"cas backoff":    {"q", Config{CASBackoff: time.Second, CASMaxBackoff: time.Millisecond}, "CASBackoff"},
		"two at once":    {"q", Config{Shards: -1, ClaimWindow: -2}, "ClaimWindow"},
		"negative batch": {"q", Config{MaxBatch: -1}, "MaxBatch"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewQueue(rdb, c.queue, &c.cfg)
			require.ErrorContains(t, err, c.want)
		})
	}
	_, err := NewQueue(nil, "q", nil)
	require.Error(t, err)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	_, err = NewQueue(ring, "q", nil)
	require.ErrorContains(t, err, "unsupported client")
	require.NoError(t, ring.Close())
	q, err := NewQueue(rdb, "q", nil)
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, q.cfg.Lease)
	require.Equal(t, 25, q.cfg.MaxAttempts)
}

// Config hands back the queue's settings with the defaults filled in, as
// a copy: changing it changes nothing in the queue.
func TestConfigIsTheQueuesSettingsWithDefaults(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t, nil)
	q, err := NewQueue(rdb, "q", &Config{Prefix: redistest.Prefix(t), MinReplicas: 2, ReplicaTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	c := q.Config()
	require.Equal(t, 2, c.MinReplicas)
	require.Equal(t, 300*time.Millisecond, c.ReplicaTimeout)
	require.Equal(t, 30*time.Second, c.Lease, "a default, filled in")
	require.Equal(t, 1, c.Shards)
	c.MinReplicas = 0
	require.Equal(t, 2, q.Config().MinReplicas, "a copy")
}

// Round trips, counted by the hook, within the budget of docs/design.md, section 4.
func TestRoundTripBudget(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	measure := func(name string, budget int64, op func() error) {
		t.Helper()
		f.hook.Reset()
		require.NoError(t, op(), name)
		require.LessOrEqual(t, f.hook.RTT.Load(), budget, name)
		t.Logf("%-22s %d round trips, %d commands", name, f.hook.RTT.Load(), f.hook.Cmds.Load())
	}
	measure("Claim (nothing due)", 1, func() error {
		_, err := f.q.Claim(f.ctx, "w")
		if errors.Is(err, ErrNoJob) {
			return nil
		}
		return fmt.Errorf("want ErrNoJob, got %v", err)
	})
	var j *Job
	measure("Enqueue", 2, func() (err error) { j, err = f.q.Enqueue(f.ctx, "t", nil, nil); return })
	measure("Enqueue (caller ID)", 2, func() (err error) {
		_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: "mine", Delay: time.Hour})
		return
	})
	batch := make([]JobSpec, 100)
	for i := range batch {
		batch[i] = JobSpec{Type: "t", Opts: &EnqueueOpts{Delay: time.Hour}}
	}
	measure("EnqueueMany(100)", 2, func() (err error) { _, err = f.q.EnqueueMany(f.ctx, batch); return })
	measure("Get", 1, func() (err error) { _, err = f.q.Get(f.ctx, j.ID); return })
	var c *Job
	measure("Claim", 3, func() (err error) { c, err = f.q.Claim(f.ctx, "w"); return })
	measure("Extend", 2, func() (err error) { c, err = f.q.Extend(f.ctx, c); return })
	measure("Fail", 2, func() (err error) { _, err = f.q.Fail(f.ctx, c, errors.New("x")); return })
	f.clock.Advance(time.Minute)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	measure("Release", 2, func() (err error) { _, err = f.q.Release(f.ctx, c); return })
	c, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	// A snooze, a retry after a delay and a release after one are decided
	// in the outcome's own compare-and-set.
	measure("Fail (Snooze)", 2, func() (err error) { _, err = f.q.Fail(f.ctx, c, Snooze(time.Second)); return })
	f.clock.Advance(time.Second)
	c, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	measure("Fail (RetryAfter)", 2, func() (err error) { _, err = f.q.Fail(f.ctx, c, RetryAfter(time.Second, errors.New("x"))); return })
	f.clock.Advance(time.Second)
	c, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	measure("SetProgress", 0, func() error {
		// Outside a handler it is refused at once; inside, it only stores the
		// value for the run's next write (TestProgressRidesTheRenewalAndTheOutcome).
		if err := SetProgress(f.ctx, []byte("1")); !errors.Is(err, ErrInvalid) {
			return fmt.Errorf("want ErrInvalid, got %v", err)
		}
		return nil
	})
	c.Progress = []byte(`{"done":1}`)
	measure("Extend (with progress)", 2, func() (err error) { c, err = f.q.Extend(f.ctx, c); return })
	measure("ReleaseAfter", 2, func() (err error) { _, err = f.q.ReleaseAfter(f.ctx, c, time.Second); return })
	f.clock.Advance(time.Second)
	c, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	measure("Complete", 2, func() (err error) { _, err = f.q.Complete(f.ctx, c, []byte("r")); return })
	measure("Cancel", 2, func() (err error) { _, err = f.q.Cancel(f.ctx, "mine"); return })
	measure("Retry", 2, func() (err error) { _, err = f.q.Retry(f.ctx, "mine"); return })
	measure("Stats", 1, func() (err error) { _, err = f.q.Stats(f.ctx); return })
	measure("Throughput (an hour by minute)", 1, func() (err error) {
		_, err = f.q.Throughput(f.ctx, f.clock.Now().Add(-time.Hour), f.clock.Now(), time.Minute)
		return
	})
	measure("List (a page)", 2, func() (err error) { _, err = f.q.List(f.ctx, ListOpts{State: StatePending}); return })
	measure("Workers (none)", 1, func() (err error) { _, err = f.q.Workers(f.ctx); return })
	measure("CountByType", 2, func() (err error) { _, err = f.q.CountByType(f.ctx, 0); return })
	measure("Pause", 1, func() error { return f.q.Pause(f.ctx) })
	measure("Resume", 1, func() error { return f.q.Resume(f.ctx) })
	measure("Delete", 2, func() error { return f.q.Delete(f.ctx, "mine") })
	measure("CancelPending (100)", 5, func() (err error) { _, err = f.q.CancelPending(f.ctx, ""); return })

	// Concurrency keys (concurrencykey.go). These counts are exact, not
	// ceilings: a keyed claim learns the job's key only once it read the
	// job, so it makes one more round trip than an unkeyed one, and a
	// fenced write reads the key its caller's copy names in round trip 1.
	// Nothing else is due now.
	exact := func(name string, want int64, op func() error) {
		t.Helper()
		measure(name, want, op)
		require.Equal(t, want, f.hook.RTT.Load(), name)
	}
	exact("SetConcurrencyLimit", 2, func() error { return f.q.SetConcurrencyLimit(f.ctx, "k", 2) })
	exact("Concurrency", 1, func() (err error) { _, err = f.q.Concurrency(f.ctx, "k"); return })
	exact("SetRateLimit", 2, func() error { return f.q.SetRateLimit(f.ctx, "k", 1000, time.Millisecond) })
	for range 3 {
		exact("Enqueue (keyed)", 2, func() (err error) {
			_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ConcurrencyKey: "k"})
			return
		})
	}
	var k1, k2 *Job
	// The due entries; WATCH+GET of the job; WATCH+GET of its key's value;
	// EXEC.
	exact("Claim (keyed)", 4, func() (err error) { k1, err = f.q.Claim(f.ctx, "w"); return })
	exact("Claim (keyed, 2nd)", 4, func() (err error) { k2, err = f.q.Claim(f.ctx, "w"); return })
	// The same four, whose EXEC parks the job (its entry moves to when a
	// lease of the key runs out), then a second read of the due entries
	// that finds nothing.
	exact("Claim (keyed, key full)", 5, func() error {
		_, err := f.q.Claim(f.ctx, "w")
		if errors.Is(err, ErrNoJob) {
			return nil
		}
		return fmt.Errorf("want ErrNoJob, got %v", err)
	})
	exact("Concurrency (full)", 1, func() error {
		info, err := f.q.Concurrency(f.ctx, "k")
		if err == nil && (info.Active != 2 || info.Waiting != 1) {
			err = fmt.Errorf("want 2 active and 1 waiting, got %+v", info)
		}
		return err
	})
	exact("Extend (keyed)", 2, func() (err error) { k1, err = f.q.Extend(f.ctx, k1); return })
	// Frees a slot: the parked job's entry is pulled forward to its RunAt,
	// in the same EXEC, in the ready index whose type round trip 1 checked.
	exact("Complete (keyed, pulls)", 2, func() (err error) { _, err = f.q.Complete(f.ctx, k2, nil); return })
	exact("Claim (keyed, pulled)", 4, func() (err error) { k2, err = f.q.Claim(f.ctx, "w"); return })
	exact("Complete (keyed)", 2, func() (err error) { _, err = f.q.Complete(f.ctx, k1, nil); return })
	exact("Complete (keyed, last)", 2, func() (err error) { _, err = f.q.Complete(f.ctx, k2, nil); return })

	// Uniqueness by state (unique.go): decided in the enqueue's own
	// compare-and-set, whatever it finds.
	exact("Enqueue (IfExistsKeep)", 2, func() (err error) {
		_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: k1.ID, IfExists: IfExistsKeep})
		return
	})
	exact("Enqueue (IfExistsReplaceFinished, finished)", 2, func() (err error) {
		_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: k1.ID, IfExists: IfExistsReplaceFinished})
		return
	})
	exact("Enqueue (IfExistsReplace, pending)", 2, func() (err error) {
		_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: k1.ID, IfExists: IfExistsReplace})
		return
	})
	exact("Enqueue (IfExistsReplace, keyed finished)", 2, func() (err error) {
		_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: k2.ID, ConcurrencyKey: "k", IfExists: IfExistsReplace})
		return
	})
	// A keyed pending job may be listed in its key's value: read in round
	// trip 1, the key being the caller's.
	exact("Enqueue (IfExistsReplace, keyed pending)", 2, func() (err error) {
		_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: k2.ID, ConcurrencyKey: "k", IfExists: IfExistsReplace})
		return
	})
	exact("Enqueue (UniqueBy, Period)", 2, func() (err error) {
		_, err = f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{UniqueBy: &UniqueBy{Period: time.Hour}, IfExists: IfExistsKeep})
		return
	})

	// The caller's own keys (tx.go): watched and read by their types in
	// round trip 1, written in the job's EXEC.
	callers := []TxKey{{Key: "shop-" + f.q.ks.prefix + ":s", Type: KeyString}, {Key: "shop-" + f.q.ks.prefix + ":h", Type: KeyHash},
		{Key: "shop-" + f.q.ks.prefix + ":m", Type: KeySet}}
	writeAll := func(tx *Tx) error {
		v, _ := tx.Get(callers[0].Key)
		tx.Set(callers[0].Key, v+"x")
		tx.HSet(callers[1].Key, "f", "v")
		tx.SAdd(callers[2].Key, tx.Job().ID)
		return nil
	}
	var tj *Job
	exact("EnqueueTx", 2, func() (err error) {
		tj, err = f.q.EnqueueTx(f.ctx, "tx", nil, &EnqueueOpts{Priority: 9}, callers, writeAll)
		return
	})
	exact("Claim (for CompleteTx)", 3, func() (err error) { tj, err = f.q.Claim(f.ctx, "w"); return })
	exact("CompleteTx", 2, func() (err error) { _, err = f.q.CompleteTx(f.ctx, tj, nil, callers, writeAll); return })
	// Batches (batch.go), on a queue of their own so claims find only
	// theirs. A write that ends a batch job reads the batch's value and
	// its callback's key once it has read the job: one round trip more;
	// a Complete reads them in round trip 1, named by the caller's copy.
	// Claims of its jobs, and writes that keep them pending or active, do
	// not.
	bf := setup(t, nil)
	bexact := func(name string, want int64, op func() error) {
		t.Helper()
		bf.hook.Reset()
		require.NoError(t, op(), name)
		t.Logf("%-22s %d round trips, %d commands", name, bf.hook.RTT.Load(), bf.hook.Cmds.Load())
		require.Equal(t, want, bf.hook.RTT.Load(), name)
	}
	var bb *Batch
	bexact("EnqueueBatch(100)", 2, func() (err error) {
		bb, _, err = bf.q.EnqueueBatch(bf.ctx, specs("t", 100), JobSpec{Type: "cb"}, &BatchOpts{Condition: BatchAllSucceeded})
		return
	})
	bexact("Batch", 1, func() (err error) { _, err = bf.q.Batch(bf.ctx, bb.ID); return })
	// Per shard: the IDs, then the values.
	bexact("Batches", 2, func() (err error) { _, err = bf.q.Batches(bf.ctx, 10); return })
	jobs := make([]*Job, 100)
	for i := range jobs {
		bexact("Claim (batch job)", 3, func() (err error) { jobs[i], err = bf.q.Claim(bf.ctx, "w"); return })
	}
	bexact("Extend (batch job)", 2, func() (err error) { jobs[0], err = bf.q.Extend(bf.ctx, jobs[0]); return })
	for i := range 98 {
		bexact("Complete (batch job)", 2, func() (err error) { _, err = bf.q.Complete(bf.ctx, jobs[i], nil); return })
	}
	bexact("Cancel (batch job)", 3, func() (err error) { _, err = bf.q.Cancel(bf.ctx, jobs[98].ID); return })
	// The last also writes the callback (canceled: one job was), and
	// types its index.
	bexact("Complete (batch job, last)", 3, func() (err error) { _, err = bf.q.Complete(bf.ctx, jobs[99], nil); return })
	bexact("Retry (batch job)", 3, func() (err error) { _, err = bf.q.Retry(bf.ctx, jobs[98].ID); return })
	bexact("EnqueueChain(4)", 2, func() (err error) {
		_, err = bf.q.EnqueueChain(bf.ctx, specs("step", 4), nil)
		return
	})
	// The event stream (events.go): a shard's flag is a compare-and-set of
	// its own (the shards at once); a transition's events ride in its own
	// EXEC, and the flag in its round trip 1 (TestEventsAddNoRoundTrip).
	exact("EnableEvents", 2, func() error { return f.q.EnableEvents(f.ctx) })
	exact("Enqueue (events on)", 2, func() (err error) { _, err = f.q.Enqueue(f.ctx, "t", nil, nil); return })
	exact("EnqueueMany(100) (events on)", 2, func() (err error) { _, err = f.q.EnqueueMany(f.ctx, batch); return })
	exact("Events (a page)", 1, func() (err error) { _, err = f.q.Events(f.ctx, "", 0); return })
	exact("EventsCursorNow", 1, func() (err error) { _, err = f.q.EventsCursorNow(f.ctx); return })
	exact("DisableEvents", 2, func() error { return f.q.DisableEvents(f.ctx) })
}

// 1,000 jobs, 32 claimers on separate connections: every job is completed
// exactly once and no claim is handed out twice while its lease holds.
func TestExactlyOnce(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	const jobs, claimers = 1000, 32
	producer := queueOn(t, redistest.Client(t, nil), prefix, Config{})
	batch := make([]JobSpec, jobs)
	for i := range batch {
		batch[i] = JobSpec{Type: "t", Payload: []byte(fmt.Sprint(i))}
	}
	_, err := producer.EnqueueMany(ctx, batch)
	require.NoError(t, err)

	var mu sync.Mutex
	claims := map[string][]string{} // job -> claimers
	completions := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, claimers)
	for w := range claimers {
		q, err := NewQueue(redistest.Client(t, func(o *redis.Options) { o.PoolSize = 2 }), "q", &Config{Prefix: prefix})
		require.NoError(t, err)
		name := fmt.Sprintf("w%d", w)
		wg.Go(func() {
			for {
				j, err := q.Claim(ctx, name)
				if errors.Is(err, ErrNoJob) {
					return
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				claims[j.ID] = append(claims[j.ID], name)
				mu.Unlock()
				if _, err := q.Complete(ctx, j, []byte(name)); err != nil {
					errs <- fmt.Errorf("complete %s: %w", j.ID, err)
					return
				}
				mu.Lock()
				completions[j.ID]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, completions, jobs)
	for id, n := range completions {
		require.Equal(t, 1, n, "job %s completed %d times", id, n)
		require.Len(t, claims[id], 1, "job %s claimed by %v while the lease held", id, claims[id])
	}
	st, err := producer.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, Stats{Succeeded: jobs}, st)
	m := producer.Metrics()
	t.Logf("producer: %+v", m)
}

// A value whose Queue is not its key's queue (a key copied or restored from
// another queue) is corrupt, as one naming another job's ID is: Get and
// List report it, workers set it aside instead of running it under a lease
// that no write of the run could renew or end, Verify expects it in the
// corrupt index, and nothing deletes it.
func TestValueOfAnotherQueueIsCorrupt(t *testing.T) {
	t.Parallel()
	q := realQueue(t, nil)
	ctx := context.Background()
	other, err := NewQueue(q.rdb, "other", &Config{Prefix: q.cfg.Prefix})
	require.NoError(t, err)
	j, err := other.Enqueue(ctx, "t", []byte("other's payload"), &EnqueueOpts{ID: "x"})
	require.NoError(t, err)
	raw, err := q.rdb.Get(ctx, other.Keys("x").Job).Result()
	require.NoError(t, err)
	// Restored into q, with its index entry.
	require.NoError(t, q.rdb.Set(ctx, q.Keys("x").Job, raw, 0).Err())
	require.NoError(t, q.rdb.ZAdd(ctx, q.Keys("x").Ready, redis.Z{Score: float64(toMillis(j.RunAt)), Member: "x"}).Err())

	_, err = q.Get(ctx, "x")
	var ce *CorruptError
	require.ErrorAs(t, err, &ce, "Get")
	require.Equal(t, "Queue", ce.Field)
	require.Equal(t, q.Keys("x").Job, ce.Key)
	page, err := q.List(ctx, ListOpts{State: StatePending})
	require.NoError(t, err)
	require.Empty(t, page.Jobs)
	require.Len(t, page.Unreadable, 1)
	require.ErrorIs(t, page.Unreadable[0].Err, ErrCorrupt, "List")
	rep, err := q.Verify(ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Len(t, rep.Findings, 1)
	require.Equal(t, Finding{ID: "x", Kind: "wrong-entry", Detail: "in ready, value says corrupt (the value cannot be read)"}, rep.Findings[0])

	var runs atomic.Int32
	stop := startWork(t, q, HandlerFunc(func(context.Context, *Job) ([]byte, error) { runs.Add(1); return nil, nil }),
		&WorkOpts{PollInterval: 10 * time.Millisecond})
	waitFor(t, "a worker to set x aside", func() bool {
		return q.rdb.ZScore(ctx, q.ks.index(0, idxCorrupt), "x").Err() == nil
	})
	stop()
	require.Zero(t, runs.Load(), "Work ran the value of another queue")
	_, err = q.Claim(ctx, "w")
	require.ErrorIs(t, err, ErrNoJob, "Claim")
	page, err = q.List(ctx, ListOpts{Corrupt: true})
	require.NoError(t, err)
	require.Len(t, page.Unreadable, 1)
	rep, err = q.Verify(ctx, &VerifyOpts{Keys: true})
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "set aside where Verify expects it")
	require.ErrorIs(t, q.Delete(ctx, "x"), ErrCorrupt)
	require.Equal(t, raw, q.rdb.Get(ctx, q.Keys("x").Job).Val(), "the value is kept as it was")
	mine, err := other.Get(ctx, "x")
	require.NoError(t, err, "in its own queue the value is a job")
	require.Equal(t, "other", mine.Queue)
}

// A value whose ID is not its key's job is corrupt, even when the key ends
// in ":job:"+ID. A job ID may itself contain ":job:" (validID allows it), so
// the key of job "a:job:b" ends like the key of job b. storedAt compares the
// whole key: job b's value copied (or forged) to that key is refused by Get
// and by the claim, as Verify refuses it, and b's payload never runs under
// b's ID from another job's key.
func TestValueNamingSuffixJobIsCorrupt(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	const x = "a:job:b"
	_, err := f.q.Enqueue(f.ctx, "t", []byte("x's payload"), &EnqueueOpts{ID: x})
	require.NoError(t, err)
	_, err = f.q.Enqueue(f.ctx, "t", []byte("b's payload"), &EnqueueOpts{ID: "b"})
	require.NoError(t, err)
	raw, err := f.rdb.Get(f.ctx, f.q.Keys("b").Job).Result()
	require.NoError(t, err)
	require.NoError(t, f.rdb.Set(f.ctx, f.q.Keys(x).Job, raw, 0).Err()) // x's key now holds b's value
	// b itself is out of the way (it ran elsewhere and expired, say): only
	// x's key, holding b's value, is due.
	require.NoError(t, f.rdb.Del(f.ctx, f.q.Keys("b").Job).Err())
	require.NoError(t, f.rdb.ZRem(f.ctx, f.q.Keys("b").Ready, "b").Err())

	j, getErr := f.q.Get(f.ctx, x)
	if getErr == nil {
		t.Logf("Get(%q) returned job %q, payload %q", x, j.ID, j.Payload)
	}
	got, claimErr := f.q.Claim(f.ctx, "w")
	if claimErr == nil {
		t.Logf("Claim returned job %q, payload %q", got.ID, got.Payload)
	}
	require.ErrorIs(t, getErr, ErrCorrupt, "the value at %q names job b", x)
	require.ErrorIs(t, claimErr, ErrNoJob, "x's value is not x: nothing is due")
}

// The ID inside a stored value is the ID of its key. A value copied (or
// forged) from job y to the key of job x is corrupt: Get says so, a claimer
// sets it aside with its bytes untouched, and no handler runs y's payload as
// x.
func TestValueNamingAnotherJobIsCorrupt(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	_, err := f.q.Enqueue(f.ctx, "t", []byte("x's payload"), &EnqueueOpts{ID: "x"})
	require.NoError(t, err)
	_, err = f.q.Enqueue(f.ctx, "t", []byte("y's payload"), &EnqueueOpts{ID: "y", Delay: time.Hour})
	require.NoError(t, err)
	ky, kx := f.q.Keys("y").Job, f.q.Keys("x").Job
	raw, err := f.rdb.Get(f.ctx, ky).Result()
	require.NoError(t, err)
	require.NoError(t, f.rdb.Set(f.ctx, kx, raw, 0).Err()) // x's key now holds y's value

	_, err = f.q.Get(f.ctx, "x")
	require.ErrorIs(t, err, ErrCorrupt)
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, ErrNoJob, "y is not due, and x's value is not x")
	after, err := f.rdb.Get(f.ctx, kx).Result()
	require.NoError(t, err)
	require.Equal(t, raw, after, "the bytes are kept")
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Corrupt)
	rep, err := f.q.Verify(f.ctx, nil)
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "x's hint is in corrupt, where Verify expects a value that is not x's")
}

// The README's quick start builds a plain redis.NewClient, as a user would:
// go-redis's maintenance notifications in their default "auto" mode, whose
// handshake Redis 7 refuses on each new connection, which the client then
// answers by switching the mode off. go-redis v9.23 writes that switch
// under the client's own lock, so the quick start is safe as written: it
// compiles, and runs under the race detector against a real redis-server
// of its own, with only the address changed, its slots opening connections
// at once.
func TestREADMEQuickStartRunsAsWrittenUnderRace(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	b, err := os.ReadFile("README.md")
	require.NoError(t, err)
	readme := string(b)
	_, after, ok := strings.Cut(readme, "## Quick start\n\n```go\n")
	require.True(t, ok, "README.md has a Go block under \"## Quick start\"")
	src, _, ok := strings.Cut(after, "\n```\n")
	require.True(t, ok)
	require.Equal(t, 1, strings.Count(src, `"localhost:6379"`), "the quick start names its Redis once")
	require.Contains(t, src, "redis.NewClient(&redis.Options{Addr: ", "the quick start builds a plain client")
	src = strings.Replace(src, `"localhost:6379"`, strconv.Quote(srv.Addr), 1)

	root, err := filepath.Abs(".")
	require.NoError(t, err)
	mod, err := os.ReadFile("go.mod")
	require.NoError(t, err)
	sum, err := os.ReadFile("go.sum")
	require.NoError(t, err)
	dir := t.TempDir()
	gomod := strings.Replace(string(mod), "module github.com/jobkey/jobkey", "module quickstart", 1) +
		"\nrequire github.com/jobkey/jobkey v0.0.0\n\nreplace github.com/jobkey/jobkey => " + root + "\n"
	for name, body := range map[string]string{"main.go": src, "go.mod": gomod, "go.sum": string(sum)} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
	}
	goBin, err := exec.LookPath("go")
	require.NoError(t, err, "the go command, to build the quick start")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, goBin, "build", "-race", "-o", "quickstart", ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "the quick start compiles as written:\n%s", out)

	run := exec.CommandContext(ctx, filepath.Join(dir, "quickstart"))
	run.Env = append(os.Environ(), "GORACE=halt_on_error=1")
	out, err = run.CombinedOutput()
	require.NoError(t, err, "the quick start runs, with no race reported:\n%s", out)
	require.NotContains(t, string(out), "DATA RACE")
	require.Equal(t, "welcome {\"to\":\"ada@example.com\"}\nwelcome-ada succeeded\n", string(out))
}
