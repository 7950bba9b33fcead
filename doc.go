// Package jobkey is a job queue on Redis in which each job and its whole
// queued state live in one key, written whole and changed only through a
// WATCH-based optimistic compare-and-set.
//
// # Why one key
//
// Queues that spread a job over several keys (a record, a pending set,
// counters) change them with MULTI/EXEC groups or scripts, and Redis never
// rolls a group back: when one step errors while applying, the others stay
// applied, and a sweeper has to repair the record nothing points at. In
// jobkey a change to a job is a compare-and-set of one value, so it happens
// whole or not at all, and nothing needs repair. The price is a larger value
// rewritten on every transition and contention on that key; the benchmarks
// in this repository measure it against the multi-key design.
//
// # Producing and consuming
//
// NewQueue wraps a caller's redis.UniversalClient, which jobkey never
// closes. Enqueue stores a job in two round trips; a caller's ID makes it
// idempotent (ErrJobExists returns the stored job), and EnqueueOpts.IfExists
// may keep or replace the stored job instead, by its state, in the same
// compare-and-set; EnqueueOpts.UniqueBy derives the ID from the arguments
// and a period. Claim takes a due job
// under a lease with a token of its own; Extend, Complete, Fail and Release
// are fenced: they write only while the stored job is still active under
// the caller's token, and otherwise return ErrLeaseLost. Work runs handlers
// with lease renewal until the outcome is recorded, self-fencing (a handler
// whose lease cannot be renewed is told to stop, by its context, before it
// can run out), cancellation, panic recovery and graceful shutdown; a
// handler that ignores its context is reported stuck and keeps its runner
// (WorkOpts.StuckAfter). A failed run's retry is decided in its outcome's
// write by a RetryPolicy (per Work or per type), or by the error itself:
// Snooze gives the attempt back, RetryAfter sets the delay. Every run is
// kept in Job.History, and a handler reports SetProgress. Args, EnqueueArgs,
// DecodeArgs, HandleArgs and Mux give typed job types, so a team can move
// one job type at a time.
//
// # Time
//
// Every decision about time (is a job due, has a lease run out, when does
// a new one end) is made by Redis's clock, read with TIME in the same round
// trip as the job, so clients whose clocks disagree still agree on every
// decision. Config.Now is only this host's clock.
//
// # Where things live
//
// A job's value is at <prefix>:{<shard tag>}:job:<id>, the shard tag being
// <queue>/<shard> (Queue.Keys names the keys). Each shard keeps sorted sets
// of job IDs (ready, leased, succeeded, failed, canceled, corrupt) that are
// derived from the values and written in the same MULTI/EXEC; they are hints
// for finding work, never a second truth. Shards are Redis Cluster hash
// tags, so on a *redis.ClusterClient one queue spreads over every master.
// Counts come from the indexes, so no stored counter can disagree. Finished
// jobs expire by their key's own TTL. No sweeper, reaper or recoverer runs:
// an expired lease is found and taken over by the next claimer. The design,
// and why, is in docs/design.md.
//
// # Round trips
//
// Enqueue, EnqueueMany (per batch), Extend, Complete, Fail, Release,
// Cancel and Retry cost two round trips when uncontended: WATCH with the
// reads and type checks, then MULTI..EXEC. Claim costs three, Get and Stats
// one. Concurrent calls of one kind share transactions (group commit), each
// job still decided under its own WATCH.
package jobkey
