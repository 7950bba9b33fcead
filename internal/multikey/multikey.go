// Package multikey is the multi-key queue design of docs/design.md, built as
// well as that design allows, as the baseline jobkey's benchmarks and fault
// tests measure against. It is not part of jobkey's API.
//
// A job is spread over several keys, all under one hash tag so a group is
// legal on a cluster:
//
//	<p>:{<q>}:job:<id>  hash    the job record
//	<p>:{<q>}:pending   list    IDs consumers pop, oldest at the right
//	<p>:{<q>}:active    list    IDs claimed, moved there by an atomic pop
//	<p>:{<q>}:leases    zset    ID -> lease deadline (unix ms)
//	<p>:{<q>}:count     string  queued-count: jobs in pending
//
// Every operation is a MULTI/EXEC group, pipelined to one round trip where
// the design allows. A claim is an atomic LMOVE from pending to active
// followed by a group that records the lease, because the popped ID is not
// known until the pop returns. Redis runs a group without interleaving but
// never rolls it back, so the package also carries the repair the design
// needs: compensation from per-step results, and a reconciling Sweep.
package multikey

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNoJob reports an empty pending list.
var ErrNoJob = errors.New("multikey: no job pending")

// Queue is one multi-key queue.
type Queue struct {
	rdb   redis.UniversalClient
	tag   string
	Lease time.Duration // default 30s
	// Retention is how long finished records live (default 24h).
	Retention time.Duration
	// Compensate makes Enqueue repair a partial group from its per-step
	// results (default true in New).
	Compensate bool
}

// New returns the queue name under prefix on rdb.
func New(rdb redis.UniversalClient, prefix, name string) *Queue {
	return &Queue{rdb: rdb, tag: prefix + ":{" + name + "}", Lease: 30 * time.Second, Retention: 24 * time.Hour, Compensate: true}
}

// Keys of the queue.
func (q *Queue) JobKey(id string) string { return q.tag + ":job:" + id }
func (q *Queue) PendingKey() string      { return q.tag + ":pending" }
func (q *Queue) ActiveKey() string       { return q.tag + ":active" }
func (q *Queue) LeasesKey() string       { return q.tag + ":leases" }
func (q *Queue) CountKey() string        { return q.tag + ":count" }

// Job is a claimed job.
type Job struct {
	ID      string
	Payload []byte
	Attempt int64
	Owner   string
}

// Step is the result of one command of a group.
type Step struct {
	Cmd string
	Err error
}

// GroupError is a group in which some step failed; Steps says which.
type GroupError struct{ Steps []Step }

func (e *GroupError) Error() string {
	s := "multikey: group step failed: ["
	for i, st := range e.Steps {
		if i > 0 {
			s += ", "
		}
		if st.Err != nil {
			s += "error"
		} else {
			s += "ok"
		}
	}
	return s + "]"
}

// Compensation records what Enqueue did after a partial group.
type Compensation struct {
	Direction string // "withdraw": the record was deleted and the count re-derived
	Err       error  // the compensation's own failure, if any
}

// EnqueueResult is what an Enqueue left behind.
type EnqueueResult struct {
	Steps        []Step
	Compensation *Compensation
}

func steps(cmds []redis.Cmder) []Step {
	out := make([]Step, 0, len(cmds))
	for _, c := range cmds {
		if n := c.Name(); n == "multi" || n == "exec" {
			continue
		}
		out = append(out, Step{Cmd: fmt.Sprint(c.Args()[0], " ", c.Args()[1]), Err: c.Err()})
	}
	return out
}

// Enqueue writes the record, lists the ID as pending and counts it, in one
// group: MULTI; HSET; LPUSH; INCR; EXEC. One round trip.
func (q *Queue) Enqueue(ctx context.Context, id string, payload []byte) (*EnqueueResult, error) {
	now := time.Now().UnixMilli()
	cmds, err := q.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, q.JobKey(id), "state", "pending", "payload", payload, "attempt", 0, "created", now)
		p.LPush(ctx, q.PendingKey(), id)
		p.Incr(ctx, q.CountKey())
		return nil
	})
	res := &EnqueueResult{Steps: steps(cmds)}
	if err == nil {
		return res, nil
	}
	if !isRedisErr(err) || redis.IsExecAbortError(err) {
		return res, err // nothing applied, or unknown
	}
	gerr := &GroupError{Steps: res.Steps}
	if q.Compensate {
		res.Compensation = q.compensateEnqueue(ctx, id, res.Steps)
	}
	return res, gerr
}

// compensateEnqueue repairs a partial enqueue from its per-step results.
// The record is meaningless unless listed, so the direction is withdraw:
// delete the record by key (idempotent) and re-derive the count from the
// pending list with a whole-value write (idempotent), instead of a DECR
// that would be wrong if run twice.
func (q *Queue) compensateEnqueue(ctx context.Context, id string, st []Step) *Compensation {
	if len(st) != 3 || st[1].Err == nil {
		return nil
	}
	c := &Compensation{Direction: "withdraw"}
	if st[0].Err == nil {
		c.Err = q.rdb.Del(ctx, q.JobKey(id)).Err()
	}
	if st[2].Err == nil && c.Err == nil {
		n, err := q.rdb.LLen(ctx, q.PendingKey()).Result()
		if err != nil {
			n = 0 // the list itself is broken: nothing is pending
		}
		c.Err = q.rdb.Set(ctx, q.CountKey(), n, 0).Err()
	}
	return c
}

// EnqueueBatch enqueues many jobs in one group: n HSETs, one LPUSH of all
// IDs, one INCRBY. One round trip.
func (q *Queue) EnqueueBatch(ctx context.Context, ids []string, payloads [][]byte) error {
	now := time.Now().UnixMilli()
	members := make([]any, len(ids))
	_, err := q.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			p.HSet(ctx, q.JobKey(id), "state", "pending", "payload", payloads[i], "attempt", 0, "created", now)
			members[i] = id
		}
		p.LPush(ctx, q.PendingKey(), members...)
		p.IncrBy(ctx, q.CountKey(), int64(len(ids)))
		return nil
	})
	return err
}

// Claim pops the oldest pending ID onto active (atomic LMOVE), then records
// state, attempt and lease in one group. Two round trips.
func (q *Queue) Claim(ctx context.Context, worker string) (*Job, error) {
	id, err := q.rdb.LMove(ctx, q.PendingKey(), q.ActiveKey(), "RIGHT", "LEFT").Result()
	if errors.Is(err, redis.Nil) {
		return nil, ErrNoJob
	}
	if err != nil {
		return nil, err
	}
	jobs, err := q.lease(ctx, []string{id}, worker)
	if err != nil {
		return nil, err
	}
	return jobs[0], nil
}

// ClaimMany pops up to n IDs (n LMOVEs pipelined, each atomic) and leases
// them in one group. Two round trips.
func (q *Queue) ClaimMany(ctx context.Context, worker string, n int) ([]*Job, error) {
	var moves []*redis.StringCmd
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for range n {
			moves = append(moves, p.LMove(ctx, q.PendingKey(), q.ActiveKey(), "RIGHT", "LEFT"))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	var ids []string
	for _, m := range moves {
		if id, err := m.Result(); err == nil {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil, ErrNoJob
	}
	return q.lease(ctx, ids, worker)
}

func (q *Queue) lease(ctx context.Context, ids []string, worker string) ([]*Job, error) {
	deadline := time.Now().Add(q.Lease).UnixMilli()
	attempts := make([]*redis.IntCmd, len(ids))
	payloads := make([]*redis.StringCmd, len(ids))
	_, err := q.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			p.HSet(ctx, q.JobKey(id), "state", "active", "owner", worker, "lease", deadline)
			attempts[i] = p.HIncrBy(ctx, q.JobKey(id), "attempt", 1)
			payloads[i] = p.HGet(ctx, q.JobKey(id), "payload")
			p.ZAdd(ctx, q.LeasesKey(), redis.Z{Score: float64(deadline), Member: id})
		}
		p.DecrBy(ctx, q.CountKey(), int64(len(ids)))
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]*Job, len(ids))
	for i, id := range ids {
		out[i] = &Job{ID: id, Payload: []byte(payloads[i].Val()), Attempt: attempts[i].Val(), Owner: worker}
	}
	return out, nil
}

// Extend renews a lease: the lease entry and the record's field, in one
// group. One round trip. Like most multi-key queues without scripts, it
// cannot check that the caller still holds the lease.
func (q *Queue) Extend(ctx context.Context, j *Job) error {
	deadline := time.Now().Add(q.Lease).UnixMilli()
	_, err := q.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAddXX(ctx, q.LeasesKey(), redis.Z{Score: float64(deadline), Member: j.ID})
		p.HSet(ctx, q.JobKey(j.ID), "lease", deadline)
		return nil
	})
	return err
}

// Update sets one field of a job's record: the multi-key design's answer
// to "N writers change one job", which never conflicts but also never
// compares.
func (q *Queue) Update(ctx context.Context, id string, payload []byte) error {
	return q.rdb.HSet(ctx, q.JobKey(id), "payload", payload).Err()
}

// Complete records the result and drops the job from active and leases, in
// one group; the record expires after Retention. One round trip.
func (q *Queue) Complete(ctx context.Context, j *Job, result []byte) error {
	return q.CompleteMany(ctx, []*Job{j}, [][]byte{result})
}

// CompleteMany completes a batch in one group. One round trip.
func (q *Queue) CompleteMany(ctx context.Context, jobs []*Job, results [][]byte) error {
	ids := make([]any, len(jobs))
	_, err := q.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i, j := range jobs {
			p.HSet(ctx, q.JobKey(j.ID), "state", "succeeded", "result", results[i])
			p.PExpire(ctx, q.JobKey(j.ID), q.Retention)
			p.LRem(ctx, q.ActiveKey(), 1, j.ID)
			ids[i] = j.ID
		}
		p.ZRem(ctx, q.LeasesKey(), ids...)
		return nil
	})
	return err
}

// Counts is what the indexes and the counter say.
type Counts struct {
	Pending int64 // LLEN pending
	Count   int64 // the queued-count counter
	Active  int64 // LLEN active
	Leases  int64 // ZCARD leases
}

// Counts reads the indexes and the counter in one round trip.
func (q *Queue) Counts(ctx context.Context) (Counts, error) {
	var c [4]*redis.IntCmd
	var cnt *redis.StringCmd
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		c[0] = p.LLen(ctx, q.PendingKey())
		cnt = p.Get(ctx, q.CountKey())
		c[2] = p.LLen(ctx, q.ActiveKey())
		c[3] = p.ZCard(ctx, q.LeasesKey())
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Counts{}, err
	}
	n, _ := strconv.ParseInt(cnt.Val(), 10, 64)
	return Counts{Pending: c[0].Val(), Count: n, Active: c[2].Val(), Leases: c[3].Val()}, nil
}

func isRedisErr(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}
