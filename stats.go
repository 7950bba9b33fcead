package jobkey

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// Stats counts a queue's jobs from its indexes.
type Stats struct {
	Pending       int64 // waiting: Due + Scheduled
	Due           int64 // pending with RunAt reached
	Scheduled     int64 // pending with RunAt in the future
	Active        int64 // claimed, lease included those expired
	ExpiredLeases int64 // active with the lease run out, waiting to be reclaimed
	Succeeded     int64 // within Config.Retention
	Failed        int64 // within Config.FailedRetention
	Canceled      int64 // within Config.Retention
	// Corrupt counts jobs whose stored value could not be read (corrupt,
	// or not a string). Claimers set them aside; their bytes are kept for
	// inspection (see Verify).
	Corrupt int64
	// Newer counts jobs written in a newer major format that claimers of an
	// older jobkey met in the last 10 minutes and left where they were, for
	// the workers that can read them. Not zero for long during a rolling
	// upgrade means no worker of the newer version is taking them.
	Newer int64
	// Vanished counts index entries that claimers found pointing at no
	// value, within Config.Retention: a job key deleted outside jobkey, or
	// evicted by a maxmemory policy other than noeviction. Each is a job
	// that was acknowledged and is gone.
	Vanished int64
	// Paused says that the queue is paused (see Queue.Pause): claims take
	// nothing new. It is true when any shard is paused; a Pause or Resume
	// that could not reach every shard leaves the queue in between, and
	// PausedShards says how far.
	Paused       bool
	PausedShards int
	// StuckHandlers counts the handlers that Work reports stuck, in every
	// process: still running WorkOpts.StuckAfter after their contexts
	// ended (canceled job, lost lease, timeout, shutdown). Go cannot stop
	// them; each holds its worker's runner until it returns, and may run
	// beside a new run of its job. A worker renews its report every
	// Lease/3; the report of a process that died or gave up on it at
	// shutdown lapses within one Lease.
	StuckHandlers int64
	// DueByPriority counts the due jobs of each priority: DueByPriority[p]
	// is those of priority p. Due jobs of a lower priority wait while a
	// higher one has some (Job.Priority).
	DueByPriority [MaxPriority + 1]int64
}

// newerWindow is how far back Stats.Newer looks (and Trim keeps the log
// it counts): a fixed part of Stats.Newer's meaning, stated in its doc,
// not a setting.
const newerWindow = 10 * time.Minute

// Stats returns exact counts of pending, due, scheduled, active and expired
// jobs, read from the indexes in one round trip per node. Finished counts
// cover the jobs still retained. Due and expired are judged by the estimate
// of Redis's clock (see Config.Now); the round trip refreshes it.
//
// When some shards cannot be read (their cluster node is down, or an index
// holds the wrong type), Stats returns the counts of the others with a
// *ShardsError that names the missing shards.
func (q *Queue) Stats(ctx context.Context) (Stats, error) {
	if err := q.check(ctx, false); err != nil {
		return Stats{}, err
	}
	now, err := q.clock.Now(ctx, q.rdb)
	if err != nil {
		return Stats{}, err
	}
	since := func(d time.Duration) string { return strconv.FormatInt(toMillis(now.Add(-d)), 10) }
	nowS := since(0)
	type counts struct {
		ready, due                                                                     [MaxPriority + 1]*redis.IntCmd
		leased, expired, ok, failed, canceled, corrupt, newer, vanished, stuck, paused *redis.IntCmd
	}
	per := make([]counts, q.ks.shards)
	var clock *redis.TimeCmd
	sent := q.clock.Local()
	cmds, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		if !q.cluster() {
			clock = p.Time(ctx) // on a cluster, to a node at random: the estimate serves
		}
		for s := range q.ks.shards {
			key := func(idx string) string { return q.ks.index(s, idx) }
			card := func(idx string) *redis.IntCmd { return p.ZCard(ctx, key(idx)) }
			after := func(idx string, d time.Duration) *redis.IntCmd { return p.ZCount(ctx, key(idx), since(d), "+inf") }
			for prio := range MaxPriority + 1 {
				per[s].ready[prio] = card(readyIndex(prio))
				per[s].due[prio] = p.ZCount(ctx, key(readyIndex(prio)), "-inf", nowS)
			}
			c := &per[s]
			c.leased, c.expired = card(idxLeased), p.ZCount(ctx, key(idxLeased), "-inf", nowS)
			c.ok, c.failed = after(idxSucceeded, q.cfg.Retention), after(idxFailed, q.cfg.FailedRetention)
			c.canceled, c.corrupt = after(idxCanceled, q.cfg.Retention), card(idxCorrupt)
			c.newer, c.vanished = after(seenNewerFormat, newerWindow), after(seenLost, q.cfg.Retention)
			c.stuck = p.ZCount(ctx, key(seenStuck), "("+nowS, "+inf") // reports not lapsed
			c.paused = p.Exists(ctx, q.ks.pauseKey(s))
		}
		return nil
	})
	if err := reply.Unanswered(cmds, err); err != nil {
		return Stats{}, fmt.Errorf("jobkey: stats of %q: %w", q.name, err)
	}
	if clock != nil && clock.Err() == nil {
		q.clock.Observe(clock.Val(), sent, q.clock.Local())
	}
	var st Stats
	missing := &ShardsError{Of: q.ks.shards}
	for s, c := range per {
		all := slices.Concat(c.ready[:], c.due[:], []*redis.IntCmd{c.leased, c.expired, c.ok, c.failed, c.canceled, c.corrupt, c.newer, c.vanished, c.stuck, c.paused})
		if i := slices.IndexFunc(all, func(c *redis.IntCmd) bool { return c.Err() != nil }); i >= 0 {
			missing.add(s, readErr(all[i].Args()[1].(string), all[i].Err()))
			continue
		}
		for prio := range MaxPriority + 1 {
			st.Pending += c.ready[prio].Val()
			st.Due += c.due[prio].Val()
			st.DueByPriority[prio] += c.due[prio].Val()
		}
		st.Active += c.leased.Val()
		st.ExpiredLeases += c.expired.Val()
		st.Succeeded += c.ok.Val()
		st.Failed += c.failed.Val()
		st.Canceled += c.canceled.Val()
		st.Corrupt += c.corrupt.Val()
		st.Newer += c.newer.Val()
		st.Vanished += c.vanished.Val()
		st.StuckHandlers += c.stuck.Val()
		if c.paused.Val() > 0 {
			st.PausedShards++
		}
	}
	st.Paused = st.PausedShards > 0
	st.Scheduled = st.Pending - st.Due
	return st, missing.orNil()
}

// readErr names the key a read failed on, as a *WrongTypeError when the key
// holds another type.
func readErr(key string, err error) error {
	if reply.IsWrongType(err) {
		return &WrongTypeError{Key: key, Want: "zset", Got: "non-zset"}
	}
	return fmt.Errorf("jobkey: read %s: %w", key, err)
}
