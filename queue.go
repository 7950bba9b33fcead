package jobkey

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jobkey/jobkey/internal/cas"
	"github.com/jobkey/jobkey/internal/cluster"
	"github.com/jobkey/jobkey/internal/expiring"
	"github.com/jobkey/jobkey/internal/readahead"
	"github.com/jobkey/jobkey/internal/redisclock"
	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// Queue is one named job queue. Every job of it lives under one key, and
// every change to a job is a compare-and-set on that key, so a change
// happens whole or not at all. A Queue is safe for concurrent use.
type Queue struct {
	decider     // the queue's name, config and keys: what its decisions use
	rdb         redis.UniversalClient
	cas         *cas.Engine
	clock       *redisclock.Clock
	newerFormat *expiring.Set[string] // jobs of a newer format that claimers look past
	down        *cluster.Down         // shards whose node could not be reached
	srv         serverCheck           // what the first call checks about Redis
	pool        *readahead.Pool       // due entries read ahead, for the claims that follow
	// listeners counts the Works of this Queue subscribed to the wake-up
	// hints: only then do claims take entries from the pool, since only
	// then do other processes' hints drop what a higher priority passes.
	listeners atomic.Int32
	// prios says that the queue has had jobs of a priority above 0 (a
	// shard's prioFlag, or this process wrote one): reads of due entries
	// then take every priority's index.
	prios    atomic.Bool
	fullRead atomic.Int64 // unix ns of the last read of every index while !prios (dueIdx)
	// paused says that the last read of due entries found every shard it
	// read paused: idle workers then ignore enqueues' wake-up hints.
	paused atomic.Bool
	// eventsSeen says, per shard, that the last transaction of the shard
	// found its events on (events.go).
	eventsSeen []atomic.Bool

	// Group commit of concurrent calls; nil when Config.DisableGroupCommit.
	claims    *cas.Group[string, *Job]
	enqueues  *cas.Group[*enqueueIn, *Job]
	completes *cas.Group[completeIn, *Job]
	extends   *cas.Group[*Job, *Job]
	finishes  *cas.Group[finishIn, finishOut] // Work's complete-and-claim
	// afterBulkPage, in tests, runs after each page a bulk action acted on.
	afterBulkPage func()
	handlers      handlerMetrics // stuck handlers of this process's Works
	written       writtenMetrics // batch callbacks and events this process's transactions wrote
	work          workMetrics    // what this process's Works recorded, and their runners
}

// NewQueue returns the queue name on rdb. It never closes rdb, which stays
// the caller's. A nil cfg means all defaults. Bad names and bad settings
// are refused here with an error that says what is wrong.
func NewQueue(rdb redis.UniversalClient, name string, cfg *Config) (*Queue, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil Redis client", ErrInvalid)
	}
	if err := validName("queue name", name, false); err != nil {
		return nil, err
	}
	_, onCluster := rdb.(*redis.ClusterClient)
	c := cfg.withDefaults(onCluster)
	if err := c.validate(); err != nil {
		return nil, err
	}
	clock := &redisclock.Clock{Local: c.Now}
	q := &Queue{decider: decider{name: name, cfg: c, ks: newKeyspace(c.Prefix, name, c.Shards)}, rdb: rdb, clock: clock,
		newerFormat: &expiring.Set[string]{TTL: skipFor, Max: maxSkip}, eventsSeen: make([]atomic.Bool, c.Shards)}
	engine, err := cas.New(rdb, cas.Options{Attempts: c.CASAttempts, BaseBackoff: c.CASBackoff, MaxBackoff: c.CASMaxBackoff,
		Clock: clock, MinReplicas: c.MinReplicas, ReplicaTimeout: c.ReplicaTimeout, SyncKey: syncKey,
		Check: func(ctx context.Context) error { return q.check(ctx, true) },
		Failed: func(ctx context.Context, err error) {
			if q.unreachable(ctx, err) {
				q.down.HashSlots.Reload()
			}
		}})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	q.cas = engine
	crdb, _ := rdb.(*redis.ClusterClient)
	q.down = cluster.NewDown(&cluster.HashSlots{RDB: crdb}, func(s int) string { return q.ks.index(s, idxReady) }, downFor, maxShards)
	q.pool = readahead.New(c.Shards, q.down.Has, q.down.Moved, downFor)
	if !c.DisableGroupCommit {
		q.claims = &cas.Group[string, *Job]{Max: c.MaxBatch, Flush: q.flushClaims, Fill: batchFill,
			Unknown: func(w string, err error) error { return outcomeUnknown("claim", w, err) },
			Orphan:  q.giveBack}
		q.enqueues = &cas.Group[*enqueueIn, *Job]{Max: c.MaxBatch, Flush: q.flushEnqueues, Lanes: enqueueLanes, Fill: batchFill,
			Unknown: func(in *enqueueIn, err error) error { return outcomeUnknown("enqueue", in.job.ID, err) }}
		q.completes = &cas.Group[completeIn, *Job]{Max: c.MaxBatch, Flush: q.flushCompletes, Fill: batchFill,
			Unknown: func(in completeIn, err error) error { return outcomeUnknown("complete", in.job.ID, err) }}
		q.extends = &cas.Group[*Job, *Job]{Max: c.MaxBatch, Flush: q.flushExtends, Fill: batchFill,
			Unknown: func(j *Job, err error) error { return outcomeUnknown("extend", j.ID, err) }}
		q.finishes = &cas.Group[finishIn, finishOut]{Max: c.MaxBatch, Flush: q.flushFinishes, HandOver: true,
			Unknown: func(in finishIn, err error) error { return outcomeUnknown("complete", in.job.ID, err) },
			Orphan: func(t *cas.Trail, out finishOut) {
				for _, j := range append(out.claimed(), out.unsure) {
					q.giveBack(t, j)
				}
				for _, j := range out.unsureMore {
					q.giveBack(t, j)
				}
			}}
	}
	return q, nil
}

// enqueueLanes is how many enqueue flushes may run at once, each past the
// first opening only when the ones running are saturated (a full batch
// queued): with lanes that opened whenever one was busy, 8 producers'
// batches averaged 1.5 jobs, each paying a batch's fixed cost.
const enqueueLanes = 4

// batchFill bounds how long a leader waits for its next batch to fill
// under load (cas.Group.Fill): a few percent of a round trip on
// loopback.
const batchFill = 50 * time.Microsecond

// Name returns the queue's name.
func (q *Queue) Name() string { return q.name }

// Config returns the queue's configuration as NewQueue took it, with every
// default filled in: a copy, which changes nothing when changed. A tool
// that writes on the queue's behalf (asynqcompat's migrations) reads its
// MinReplicas and ReplicaTimeout from it, so that its own writes wait as
// the queue's do.
func (q *Queue) Config() Config { return q.cfg }

// Get returns the job with the given ID in one round trip. It returns
// ErrNotFound when there is none, and ErrCorrupt or ErrUnsupportedFormat
// when the stored value cannot be read (the value is left as it is).
func (q *Queue) Get(ctx context.Context, id string) (*Job, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	if err := q.check(ctx, false); err != nil {
		return nil, err
	}
	key, _ := q.ks.jobKeyOf(id)
	s, err := q.rdb.Get(ctx, key).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return nil, fmt.Errorf("%w: %q in queue %q", ErrNotFound, id, q.name)
	case err != nil && reply.IsWrongType(err):
		return nil, &WrongTypeError{Key: key, Want: "string", Got: "non-string"}
	case err != nil:
		return nil, fmt.Errorf("jobkey: get %q: %w", id, err)
	}
	j := new(Job)
	if err := unmarshalString(s, j); err != nil {
		return nil, keyed(err, key)
	}
	if err := storedAt(key, j); err != nil {
		return nil, err
	}
	return j, nil
}

// storedAt refuses a value found at a job key that names another job, or
// another queue: a value copied or forged from elsewhere would otherwise
// run one job's payload under another's ID, and one copied from another
// queue would run under a lease that no write of its run can renew or end
// (checkJob), again at each lease's end. Keys that are not job keys are not
// judged.
func storedAt(key string, j *Job) error {
	queue, id, ok := parseJobKey(key)
	if !ok {
		return nil
	}
	if id != j.ID {
		return &CorruptError{Key: key, Field: "ID", Reason: fmt.Sprintf("the value names job %q, not the job of its key (copied or forged)", j.ID)}
	}
	if queue != j.Queue {
		return &CorruptError{Key: key, Field: "Queue",
			Reason: fmt.Sprintf("the value names queue %q, not %q, the queue of its key (copied or restored from another queue)", j.Queue, queue)}
	}
	return nil
}

// keyed attaches the Redis key to a decode error.
func keyed(err error, key string) error {
	var ce *CorruptError
	if errors.As(err, &ce) {
		ce.Key = key
		return err
	}
	return fmt.Errorf("key %q: %w", key, err)
}

// update runs one compare-and-set on job id: fn sees the current value
// (never nil: a missing job is ErrNotFound) and Redis's clock, and returns
// the new value, or nil to write nothing. Index entries follow the value in
// the same EXEC. A pending value is never due before its last run's lease
// ends (lastrun.go), whatever RunAt fn gave it.
//
// predict names the indexes the transition is expected to write, so their
// type checks ride in the first round trip. notify, when set, is a channel
// the same EXEC publishes the job's ID on (wake-ups and cancellations).
func (q *Queue) update(ctx context.Context, id string, predict []string, fn func(cur *Job, now time.Time) (*Job, error), notify string) (*Job, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	key, shard := q.ks.jobKeyOf(id)
	var out *Job
	follow := q.slotFollowListed([]int{shard}) // a keyed job's waiting listing may have to go
	_, _, err := q.run(ctx, &casTxn{keys: []string{key}, checks: q.checksFor(shard, predict...), follow: follow, decide: func(r *casRead) (*casPlan, error) {
		if r.errs[0] != nil {
			return nil, r.errs[0]
		}
		cur := r.jobs[0]
		if cur == nil {
			return nil, fmt.Errorf("%w: %q in queue %q", ErrNotFound, id, q.name)
		}
		old := *cur
		next, err := fn(cur, r.now)
		if err != nil {
			return nil, err
		}
		if next == nil {
			// The job is as asked already, maybe by this caller's own
			// write, unconfirmed: with MinReplicas the answer waits for
			// the replicas too, so it never reports what a failover may
			// still undo.
			out = &old
			return &casPlan{confirm: true}, nil
		}
		if next.State == StatePending {
			// Not claimable while the last run may go on (lastrun.go).
			next.RunAt = dueAfterLastRun(&old, next.RunAt)
		}
		next.UpdatedAt = r.now
		var ip indexPlan
		q.move(&ip, shard, id, &old, next, "")
		out = next
		switch {
		case notify == q.ks.wakeChannel() || notify == "" && next.State == StatePending:
			// A job pending now: idle workers wake, and drop what they
			// read ahead below its priority (wakeHint).
			ip.extra = append(ip.extra, []any{"publish", q.ks.wakeChannel(), wakeHint(next.Priority)})
		case notify != "":
			ip.extra = append(ip.extra, []any{"publish", notify, id})
		}
		plan := &casPlan{writes: []casWrite{q.write(key, next)}}
		// A keyed job whose entry moves leaves its key's waiting list.
		b := q.newSlotBook(r)
		b.unlistMoved(shard, &old, next)
		b.finish(plan, &ip)
		plan.index(&ip)
		return plan, nil
	}})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// checksFor returns zset type checks for the named indexes of a shard.
func (q *Queue) checksFor(shard int, indexes ...string) []typeCheck {
	out := make([]typeCheck, len(indexes))
	for i, name := range indexes {
		out[i] = typeCheck{Key: q.ks.index(shard, name), Want: "zset"}
	}
	return out
}

// Keys returns the keys of the job with the given ID and of its shard.
func (q *Queue) Keys(id string) JobKeys {
	key, s := q.ks.jobKeyOf(id)
	return JobKeys{
		Job: key, Ready: q.ks.index(s, idxReady), Leased: q.ks.index(s, idxLeased),
		Succeeded: q.ks.index(s, idxSucceeded), Failed: q.ks.index(s, idxFailed), Canceled: q.ks.index(s, idxCanceled),
		Corrupt: q.ks.index(s, idxCorrupt), Events: q.ks.streamKey(s),
	}
}

// IDFor returns an ID for a job of concurrency key key, made from base. On
// a queue of several shards a keyed job must live in its key's shard, so
// that the job and its key's value share a hash slot and one transaction
// changes both; Enqueue refuses a caller's ID that is not there. IDFor
// returns base itself when it is there and does not end in "~<digits>",
// and else base with the first suffix "~<n>" (n = 1, 2, ...) that is
// there. On a queue of one shard, or for an empty key, it returns base.
//
// Distinct bases always give distinct IDs for one key: an ID that ends in
// "~<digits>" came from the base before its last "~", and any other ID is
// its own base. The same key and base always give the same ID, so it
// deduplicates as base would. A base that is not a valid ID, or too long
// to take its suffix within MaxIDLen, and a key Enqueue would refuse, are
// refused with ErrInvalid.
func (q *Queue) IDFor(key, base string) (string, error) {
	if err := validID(base); err != nil {
		return "", err
	}
	if key != "" {
		if err := validConcurrencyKey(key); err != nil {
			return "", err
		}
	}
	if q.ks.shards == 1 || key == "" {
		return base, nil
	}
	want := q.ks.shardOf(key)
	if q.ks.shardOf(base) == want && !suffixed(base) {
		return base, nil
	}
	for n := 1; n <= maxIDForTries; n++ {
		id := base + "~" + strconv.Itoa(n)
		if len(id) > MaxIDLen {
			break
		}
		if q.ks.shardOf(id) == want {
			return id, nil
		}
	}
	return "", fmt.Errorf("%w: job ID base %q (%d bytes) leaves no room within MaxIDLen (%d) for a suffix that places it in the shard of concurrency key %q",
		ErrInvalid, base, len(base), MaxIDLen, key)
}
