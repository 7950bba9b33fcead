package jobkey

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"
)

// Config configures a Queue. The zero value works: every field has a
// default, written beside it.
type Config struct {
	// Prefix starts every key and channel of the queue (default: "jobkey").
	Prefix string
	// Shards splits the queue's indexes so one logical queue can spread over
	// a Redis Cluster: each shard is one hash slot, and the shards' slots are
	// spread evenly over the hash slot range. It must stay the same for the
	// queue's whole life, because a job's shard is derived from its ID
	// (default: 1 on a single Redis; 16 on a *redis.ClusterClient, which puts
	// about a third of a queue's jobs on each of three masters; at most 1024).
	Shards int
	// Lease is how long a claim holds a job before another worker may take
	// it over. Work renews it every Lease/3 (default: 30s; at least 100ms).
	Lease time.Duration
	// MaxAttempts is how many times a job may be claimed before it fails for
	// good; EnqueueOpts.MaxAttempts overrides it per job (default: 25).
	MaxAttempts int
	// Backoff returns how long to wait before retrying a job whose
	// attempt-th attempt failed (default: DefaultBackoff).
	Backoff func(attempt int) time.Duration
	// MaxSnoozes bounds how often one job may snooze (Snooze; Job.Snoozes):
	// the snooze after that many fails the job for good with
	// ErrSnoozeLimit, so a job cannot snooze for ever unnoticed (default:
	// 1000; at most MaxAttemptsLimit).
	MaxSnoozes int
	// Retention keeps succeeded and canceled jobs readable this long; their
	// keys expire by themselves (default: 24h; at least 1s). A job canceled
	// while it ran keeps its key, and its ID, at least until that run's
	// lease ends.
	Retention time.Duration
	// FailedRetention keeps failed jobs this long (default: 7 days).
	FailedRetention time.Duration
	// MaxValueBytes refuses jobs whose stored value would be larger, with
	// ErrTooLarge, before anything is written (default: 1 MiB; at most
	// MaxValueBytes, 64 MiB).
	MaxValueBytes int
	// EventsMaxLen bounds each shard's event stream, once
	// Queue.EnableEvents turned it on: every event's XADD trims it to about
	// this many entries (MAXLEN ~; default: 10000; at most 1<<30).
	EventsMaxLen int
	// ClaimWindow is how many due jobs a claimer picks among at random, so
	// concurrent claimers rarely race for the same job (default: 8).
	ClaimWindow int
	// CASAttempts bounds the tries of one compare-and-set before it gives up
	// with ErrConflict (default: 32).
	CASAttempts int
	// CASBackoff is the first retry delay after a conflict; later retries
	// double it, with full jitter, up to CASMaxBackoff (default: 1ms).
	CASBackoff time.Duration
	// CASMaxBackoff caps the delay between compare-and-set retries
	// (default: 100ms).
	CASMaxBackoff time.Duration
	// MaxBatch bounds how many jobs one EnqueueMany transaction carries;
	// larger batches are split (default: 256; at most 4096).
	MaxBatch int
	// DisableGroupCommit makes every Enqueue, Claim, Complete and Extend run
	// its own transaction. By default, calls made while another of the same
	// kind is in flight share the next transaction's round trips; each job is
	// still decided under its own WATCH (default: false).
	DisableGroupCommit bool
	// SkipEvictionCheck skips reading maxmemory-policy (INFO memory) at a
	// Queue's first call. Without the check, jobkey cannot refuse a Redis
	// that may evict the keys of acknowledged jobs (allkeys-* policies).
	// Set it only where INFO is not allowed and the policy is known to be
	// noeviction (default: false: check, and refuse writes under allkeys-*).
	SkipEvictionCheck bool
	// ConcurrencyLimit is the limit of a concurrency key that has none of
	// its own (Queue.SetConcurrencyLimit): at most this many jobs with one
	// EnqueueOpts.ConcurrencyKey are active at once. Give every process of
	// a queue the same value (default: 1; at most MaxConcurrencyLimit).
	ConcurrencyLimit int
	// Logger receives what jobkey notices but cannot return: a job that
	// vanished from Redis, a risky server setting (default: slog.Default()).
	Logger *slog.Logger
	// MinReplicas makes every write wait, before it is answered, until this
	// many replicas confirm it (WAIT, sent after EXEC in the same round
	// trip), so an acknowledged write survives the loss of its master to a
	// failover that promotes one of them. A write they do not confirm within
	// ReplicaTimeout returns a *ReplicationError (ErrNotReplicated): it was
	// applied on the master and is not yet safe; call again with the same
	// ID. It is not consensus: see docs/operations.md, "Running with
	// replicas". The ACL needs +wait (default: 0, no wait).
	MinReplicas int
	// ReplicaTimeout bounds how long a write waits for MinReplicas (default:
	// 1s; from 1ms to 1 minute). It may exceed the client's ReadTimeout:
	// the WAIT in the write's round trip waits at most half of ReadTimeout,
	// and a WAIT of its own, with its own read deadline, waits for the rest
	// when the replicas are that slow.
	ReplicaTimeout time.Duration
	// Now is this host's clock (default: time.Now). jobkey does not decide
	// by it: whether a job is due, whether a lease has run out and when a
	// new lease ends are judged by Redis's clock (TIME, read in the same
	// round trip as the job), so clients whose clocks disagree still agree
	// on every decision. Now only carries the estimate of Redis's clock
	// from one TIME reply to the next, for reads that look for candidates
	// (see docs/design.md, "Time"). Tests set it to simulate a skewed host.
	Now func() time.Time
}

// DefaultBackoff waits 1s·2^(attempt-1), capped at one hour, with jitter
// between half and all of it.
func DefaultBackoff(attempt int) time.Duration {
	d := time.Hour
	if attempt >= 1 && attempt <= 12 {
		d = min(d, time.Second<<(attempt-1))
	}
	return d/2 + rand.N(d/2+1)
}

// defaultClusterShards is Config.Shards on a cluster; maxShards bounds it.
const (
	defaultClusterShards = 16
	maxShards            = 1024
	maxReplicas          = 64      // Config.MinReplicas
	maxEventsLen         = 1 << 30 // Config.EventsMaxLen
)

func (c *Config) withDefaults(cluster bool) Config {
	var out Config
	if c != nil {
		out = *c
	}
	out.Prefix = cmp.Or(out.Prefix, "jobkey")
	if cluster {
		out.Shards = cmp.Or(out.Shards, defaultClusterShards)
	}
	out.Shards = cmp.Or(out.Shards, 1)
	out.Lease = cmp.Or(out.Lease, 30*time.Second)
	out.MaxAttempts = cmp.Or(out.MaxAttempts, 25)
	out.MaxSnoozes = cmp.Or(out.MaxSnoozes, 1000)
	if out.Backoff == nil {
		out.Backoff = DefaultBackoff
	}
	out.Retention = cmp.Or(out.Retention, 24*time.Hour)
	out.FailedRetention = cmp.Or(out.FailedRetention, 7*24*time.Hour)
	out.MaxValueBytes = cmp.Or(out.MaxValueBytes, 1<<20)
	out.EventsMaxLen = cmp.Or(out.EventsMaxLen, 10000)
	out.ClaimWindow = cmp.Or(out.ClaimWindow, 8)
	out.CASAttempts = cmp.Or(out.CASAttempts, 32)
	out.CASBackoff = cmp.Or(out.CASBackoff, time.Millisecond)
	out.CASMaxBackoff = cmp.Or(out.CASMaxBackoff, 100*time.Millisecond)
	out.MaxBatch = cmp.Or(out.MaxBatch, 256)
	out.ConcurrencyLimit = cmp.Or(out.ConcurrencyLimit, 1)
	out.ReplicaTimeout = cmp.Or(out.ReplicaTimeout, time.Second)
	if out.Now == nil {
		out.Now = time.Now
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

func (c *Config) validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: config: %s", ErrInvalid, fmt.Sprintf(format, args...)))
	}
	if err := validName("prefix", c.Prefix, true); err != nil {
		errs = append(errs, err)
	}
	if c.Shards < 1 || c.Shards > maxShards {
		bad("Shards is %d, want 1..%d", c.Shards, maxShards)
	}
	if c.Lease < 100*time.Millisecond {
		bad("Lease is %v, want at least 100ms", c.Lease)
	}
	if c.MaxAttempts < 1 || c.MaxAttempts > MaxAttemptsLimit {
		bad("MaxAttempts is %d, want 1..%d", c.MaxAttempts, MaxAttemptsLimit)
	}
	if c.MaxSnoozes < 1 || c.MaxSnoozes > MaxAttemptsLimit {
		bad("MaxSnoozes is %d, want 1..%d", c.MaxSnoozes, MaxAttemptsLimit)
	}
	if c.Retention < time.Second || c.FailedRetention < time.Second {
		bad("Retention %v and FailedRetention %v must be at least 1s", c.Retention, c.FailedRetention)
	}
	if c.MaxValueBytes < 256 || c.MaxValueBytes > MaxValueBytes {
		bad("MaxValueBytes is %d, want 256..%d", c.MaxValueBytes, MaxValueBytes)
	}
	if c.EventsMaxLen < 1 || c.EventsMaxLen > maxEventsLen {
		bad("EventsMaxLen is %d, want 1..%d", c.EventsMaxLen, maxEventsLen)
	}
	if c.ClaimWindow < 1 || c.ClaimWindow > 1000 {
		bad("ClaimWindow is %d, want 1..1000", c.ClaimWindow)
	}
	if c.CASAttempts < 1 {
		bad("CASAttempts is %d, want at least 1", c.CASAttempts)
	}
	if c.CASBackoff < 0 || c.CASMaxBackoff < c.CASBackoff {
		bad("CASBackoff %v and CASMaxBackoff %v: want 0 <= CASBackoff <= CASMaxBackoff", c.CASBackoff, c.CASMaxBackoff)
	}
	if c.ConcurrencyLimit < 1 || c.ConcurrencyLimit > MaxConcurrencyLimit {
		bad("ConcurrencyLimit is %d, want 1..%d", c.ConcurrencyLimit, MaxConcurrencyLimit)
	}
	if c.MinReplicas < 0 || c.MinReplicas > maxReplicas {
		bad("MinReplicas is %d, want 0..%d", c.MinReplicas, maxReplicas)
	}
	if c.ReplicaTimeout < time.Millisecond || c.ReplicaTimeout > time.Minute {
		bad("ReplicaTimeout is %v, want 1ms..1m", c.ReplicaTimeout)
	}
	if c.MaxBatch < 1 || c.MaxBatch > 4096 {
		bad("MaxBatch is %d, want 1..4096", c.MaxBatch)
	}
	return errors.Join(errs...)
}

// MaxConcurrencyLimit bounds a concurrency key's limit.
const MaxConcurrencyLimit = 10000
