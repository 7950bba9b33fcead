package jobkey

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// serverCheck is what a Queue checks once about the Redis it runs on, at
// its first call that reaches Redis: that the queue's shard count is the
// one it was created with, and that Redis will not evict its jobs.
type serverCheck struct {
	ok        atomic.Bool // checked, and nothing is wrong
	mu        sync.Mutex
	done      bool
	retry     time.Time // after a check that could not reach Redis: when to try again
	shardsErr error     // refuses every call
	evictErr  error     // refuses writes
}

// checkRetry is how long a Queue on a cluster waits to check the server
// again after it could not reach the node of the queue's meta key.
const checkRetry = time.Second

func parseShards(key, s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimPrefix(s, "shards="))
	if err != nil || !strings.HasPrefix(s, "shards=") || n < 1 || n > maxShards {
		return 0, fmt.Errorf("%w: %s holds %q, not a shard count", ErrCorrupt, key, s)
	}
	return n, nil
}

// check runs the server checks once (again after a failure to reach
// Redis) and returns what refuses this call: any call, or a write.
func (q *Queue) check(ctx context.Context, write bool) error {
	if q.srv.ok.Load() {
		return nil
	}
	c := &q.srv
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.done && time.Now().After(c.retry) {
		err := q.runChecks(ctx)
		switch {
		case err == nil:
			c.done = true
			c.ok.Store(c.shardsErr == nil && c.evictErr == nil)
		case c.shardsErr != nil:
			// What was found stands, whatever stopped the rest.
		case ctx.Err() != nil || !q.cluster():
			// Not checked yet: the caller gave up, or the one Redis is
			// unreachable (and the call would fail anyway). No call goes
			// through unchecked; the next one checks again.
			return err
		default:
			// On a cluster the node that holds the queue's meta key may
			// be down while the others serve: the call goes ahead, and the
			// checks run again a second later.
			q.cfg.Logger.Warn("jobkey: could not check the server; trying again later", "queue", q.name, "err", err)
			c.retry = time.Now().Add(checkRetry)
		}
	}
	if c.shardsErr != nil {
		return c.shardsErr
	}
	if write {
		return c.evictErr
	}
	return nil
}

// runChecks stores the shard count, or compares it with the stored one,
// reads every master's maxmemory-policy, and takes a first sample of
// Redis's clock.
func (q *Queue) runChecks(ctx context.Context) error {
	c := &q.srv
	key := q.ks.metaKey()
	want := "shards=" + strconv.Itoa(q.ks.shards)
	// The count of a queue that exists is read, not written: a user whose
	// ACL allows reads only (a read-only UI) can then open it. SET NX GET
	// stores it when it is missing, and still reads it if another process
	// stored it in between.
	prev, err := q.rdb.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		prev, err = q.rdb.SetArgs(ctx, key, want, redis.SetArgs{Mode: "NX", Get: true}).Result()
	}
	switch {
	case errors.Is(err, redis.Nil): // stored now
	case reply.IsWrongType(err):
		c.shardsErr = &WrongTypeError{Key: key, Want: "string", Got: "non-string"}
	case err != nil:
		return cmp.Or(unreachable(q.rdb, err), fmt.Errorf("jobkey: store the shard count in %s: %w", key, err))
	case prev != want:
		n, err := parseShards(key, prev)
		if err != nil {
			c.shardsErr = err
			break
		}
		c.shardsErr = fmt.Errorf("%w: queue %q was created with %d shards, and this Queue has Config.Shards %d: "+
			"a job's shard comes from its ID, so every process must use the count the queue was created with",
			ErrInvalid, q.name, n, q.ks.shards)
	}
	sent := q.clock.Local()
	t, err := q.rdb.Time(ctx).Result()
	if recv := q.clock.Local(); err == nil {
		q.clock.Observe(t, sent, recv)
	}
	if q.cfg.SkipEvictionCheck {
		return nil
	}
	policies, err := q.evictionPolicies(ctx)
	switch {
	case err != nil && strings.Contains(err.Error(), "NOPERM"):
		// An ACL refuses INFO: whoever wrote it must say whether Redis may
		// evict, so writes wait for Config.SkipEvictionCheck or +info.
		c.evictErr = fmt.Errorf("%w: cannot read maxmemory-policy (%v): grant +info, or set Config.SkipEvictionCheck",
			ErrEvictionPolicy, err)
		return nil
	case err != nil && reply.IsRedisErr(err):
		// A server without INFO memory (renamed away, or not Redis): say
		// so loudly, and go on.
		q.cfg.Logger.Error("jobkey: cannot read maxmemory-policy; if Redis may evict keys, acknowledged jobs can vanish "+
			"(set Config.SkipEvictionCheck to silence this)", "queue", q.name, "err", err)
		return nil
	case err != nil:
		return cmp.Or(unreachable(q.rdb, err), fmt.Errorf("jobkey: read maxmemory-policy: %w", err))
	}
	for addr, p := range policies {
		switch {
		case p == "noeviction":
		case strings.HasPrefix(p, "volatile-"):
			q.cfg.Logger.Warn("jobkey: Redis may evict finished jobs before their retention ends; pending and active jobs have no TTL and are safe",
				"queue", q.name, "redis", addr, "maxmemory-policy", p)
		default:
			c.evictErr = fmt.Errorf("%w: Redis at %s has maxmemory-policy %s; set noeviction (or a volatile- policy), "+
				"or Config.SkipEvictionCheck to run anyway", ErrEvictionPolicy, addr, p)
			q.cfg.Logger.Error(c.evictErr.Error(), "queue", q.name)
		}
	}
	return nil
}

// evictionPolicies reads maxmemory-policy from INFO memory of every master.
func (q *Queue) evictionPolicies(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	var mu sync.Mutex
	var failed []error
	read := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			mu.Lock()
			failed = append(failed, fmt.Errorf("%s: %w", c.Options().Addr, err))
			mu.Unlock()
			return nil
		}
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "maxmemory_policy:"); ok {
				mu.Lock()
				out[c.Options().Addr] = v
				mu.Unlock()
			}
		}
		return nil
	}
	var err error
	switch c := q.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, read)
	case *redis.Client:
		err = read(ctx, c)
	}
	switch {
	case err != nil:
		return nil, err
	case len(out) == 0 && len(failed) > 0:
		return nil, errors.Join(failed...)
	case len(failed) > 0:
		// A master that is down now is checked by nobody: say so.
		q.cfg.Logger.Warn("jobkey: could not read maxmemory-policy of every master", "queue", q.name, "err", errors.Join(failed...))
	}
	return out, nil
}

// unreachable returns err as an *UnreachableError when it is the
// network's (a connection refused, broken or timed out, a name that does
// not resolve), naming the address rdb tried; else nil. The caller's own
// deadline or cancellation is not the network's.
func unreachable(rdb redis.UniversalClient, err error) error {
	var ne net.Error
	switch {
	case err == nil, errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return nil
	case errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, redis.ErrClosed):
	default:
		return nil
	}
	var ue *UnreachableError
	if errors.As(err, &ue) {
		return ue
	}
	addr := ""
	var oe *net.OpError
	switch c := rdb.(type) {
	case *redis.Client:
		addr = c.Options().Addr
	case *redis.ClusterClient:
		addr = strings.Join(c.Options().Addrs, ",")
	}
	if errors.As(err, &oe) && oe.Addr != nil {
		addr = oe.Addr.String() // on a cluster, the node that failed
	}
	return &UnreachableError{Addr: addr, Err: err}
}
