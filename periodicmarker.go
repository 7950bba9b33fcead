package jobkey

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// A periodic schedule's markers say which of its ticks ran: the EXEC that
// enqueues a tick's job writes the tick in the schedule's marker, and a
// tick at or before a marker is not enqueued again. The marker in the
// schedule's name's shard also records that Redis has seen the schedule,
// so that a new one starts at its next tick (registerSchedule).

// enqueueTick writes p's job of tick t and the tick's marker in one
// compare-and-set, unless the job exists, the schedule's marker
// (markerShard) says the tick (or a later one) ran, or the job's shard is
// paused. Two round trips, as an Enqueue.
func (q *Queue) enqueueTick(ctx context.Context, p PeriodicJob, t time.Time) (tickOutcome, string, error) {
	in, err := q.tickJob(p, t)
	if err != nil {
		return 0, "", err
	}
	j := in.job
	key, shard := q.ks.jobKeyOf(j.ID)
	marker := q.ks.periodicKey(q.markerShard(p.Name, shard), p.Name)
	tick := toMillis(t)
	var out tickOutcome
	_, _, err = q.run(ctx, &casTxn{
		keys: []string{key}, checks: q.checksFor(shard, readyIndex(j.Priority)),
		guards: []string{q.ks.pauseKey(shard)}, aux: []string{marker},
		decide: func(r *casRead) (*casPlan, error) {
			last, err := readMarker(marker, r.aux[marker])
			switch {
			case err != nil:
				return nil, err
			case last >= tick:
				out = tickRan
				return nil, nil
			case r.errs[0] != nil:
				return nil, fmt.Errorf("jobkey: enqueue %q: %w", j.ID, r.errs[0])
			case r.jobs[0] != nil:
				// It ran before markers were written, or its marker was
				// lost: record it.
				out = tickRan
				return &casPlan{aux: []auxWrite{{key: marker, val: markerValue(tick)}}}, nil
			case r.guarded[0]:
				out = tickPaused
				return nil, nil
			}
			out = tickWritten
			j.CreatedAt, j.UpdatedAt = r.now, r.now
			plan := &casPlan{writes: []casWrite{{key: key, job: j}}, aux: []auxWrite{{key: marker, val: markerValue(tick)}}}
			var ip indexPlan
			q.move(&ip, shard, j.ID, nil, j, "")
			plan.index(&ip)
			plan.steps = append(plan.steps, []any{"publish", q.ks.wakeChannel(), wakeHint(j.Priority)})
			return plan, nil
		}})
	if err != nil {
		return 0, j.ID, err
	}
	return out, j.ID, nil
}

// registerSchedule makes sure Redis records that it has seen schedule p,
// and returns the time at or before which p's ticks are settled: before
// the schedule existed, or superseded by a tick that ran. first says this
// call recorded a schedule Redis had not seen.
//
// The record is the schedule's marker in its name's shard: on one Redis the
// schedule's only marker; on a cluster also the marker of the ticks whose
// jobs land in that shard, which a record only ever moves to a time no
// later tick of that shard is asked at. A schedule is new when that marker
// is missing and no trace of an earlier build is found either (the latest
// tick's job, written by a build older than markers, or the marker of any
// shard, written beside the jobs on a cluster); then the record holds
// seenAt, when this process first looked, so that a tick at or before it
// is skipped by every process, and a later one is not: two processes
// deploying the schedule at once write one record, in a compare-and-set
// of that key alone, and the one that loses the race reads the winner's.
// With StartWithLatestTick the record holds 0, claiming no tick. A schedule
// an earlier build ran is recorded at the latest tick its traces prove
// ran.
func (q *Queue) registerSchedule(ctx context.Context, p PeriodicJob, seenAt, tick time.Time) (since time.Time, first bool, err error) {
	if err := q.check(ctx, false); err != nil {
		return time.Time{}, false, err
	}
	record := q.ks.periodicKey(q.ks.shardOf(p.Name), p.Name)
	switch v, err := q.rdb.Get(ctx, record).Result(); {
	case err == nil:
		n, err := readMarker(record, rawRead{S: v})
		return time.UnixMilli(n), false, err
	case reply.IsWrongType(err):
		return time.Time{}, false, &WrongTypeError{Key: record, Want: "string", Got: "non-string"}
	case !errors.Is(err, redis.Nil):
		return time.Time{}, false, fmt.Errorf("jobkey: read the record of periodic schedule %q: %w", p.Name, err)
	}
	ran, err := q.scheduleTraces(ctx, p, tick)
	if err != nil {
		return time.Time{}, false, err
	}
	want := ran
	switch {
	case ran >= 0:
	case p.StartWithLatestTick:
		want = 0
	default:
		want = toMillis(seenAt)
	}
	var got int64
	_, _, err = q.run(ctx, &casTxn{aux: []string{record}, decide: func(r *casRead) (*casPlan, error) {
		if raw := r.aux[record]; !raw.Missing {
			// Another process recorded it first (or this one, whose reply
			// was lost): its record stands.
			n, err := readMarker(record, raw)
			got, first = n, false
			return nil, err
		}
		got, first = want, ran < 0
		return &casPlan{aux: []auxWrite{{key: record, val: markerValue(want)}}}, nil
	}})
	if err != nil {
		return time.Time{}, false, err
	}
	return time.UnixMilli(got), first, nil
}

// scheduleTraces returns the latest tick an earlier build is seen to have
// run of p, which has no record: the greatest of its markers in every
// shard (one that cannot be read proves only that the schedule existed:
// 0), and tick when its job exists; -1 when there is no trace.
func (q *Queue) scheduleTraces(ctx context.Context, p PeriodicJob, tick time.Time) (int64, error) {
	jobKey := ""
	if !tick.IsZero() {
		in, err := q.tickJob(p, tick)
		if err != nil {
			return 0, err
		}
		jobKey, _ = q.ks.jobKeyOf(in.job.ID)
	}
	markers := make([]*redis.StringCmd, q.cfg.Shards)
	var job *redis.IntCmd
	// Per command errors are read below: a missing marker answers redis.Nil.
	_, _ = q.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for s := range markers {
			markers[s] = pipe.Get(ctx, q.ks.periodicKey(s, p.Name))
		}
		if jobKey != "" {
			job = pipe.Exists(ctx, jobKey)
		}
		return nil
	})
	ran := int64(-1)
	for s, c := range markers {
		switch v, err := c.Result(); {
		case err == nil:
			n, err := readMarker(q.ks.periodicKey(s, p.Name), rawRead{S: v})
			if err != nil {
				n = 0
			}
			ran = max(ran, n)
		case reply.IsWrongType(err):
			ran = max(ran, 0)
		case !errors.Is(err, redis.Nil):
			return 0, fmt.Errorf("jobkey: read the markers of periodic schedule %q: %w", p.Name, err)
		}
	}
	if job != nil {
		n, err := job.Result()
		if err != nil {
			return 0, fmt.Errorf("jobkey: read the latest tick of periodic schedule %q: %w", p.Name, err)
		}
		if n > 0 {
			ran = max(ran, toMillis(tick))
		}
	}
	return ran, nil
}

// markerShard is the shard of schedule name's marker for a tick whose job
// lives in shard. On one Redis, where one EXEC may write any shard, it is
// the name's own shard, the same whatever the options: a ConcurrencyKey
// changed between deploys moves the ticks' jobs to another shard, and a
// marker beside them would not know the tick ran under the old key. On a
// cluster the marker must share the job's hash slot.
func (q *Queue) markerShard(name string, shard int) int {
	if q.cluster() {
		return shard
	}
	return q.ks.shardOf(name)
}

// markerValue is a periodic marker's value: the latest tick enqueued in
// its shard, in unix milliseconds.
func markerValue(tick int64) []byte { return strconv.AppendInt(nil, tick, 10) }

// readMarker reads a periodic marker: 0 when there is none. One that
// cannot be read is reported and kept: its schedule's ticks in that shard
// wait until it is repaired or deleted.
func readMarker(key string, raw rawRead) (int64, error) {
	switch {
	case raw.Missing:
		return 0, nil
	case raw.Err != nil:
		return 0, &WrongTypeError{Key: key, Want: "string", Got: "non-string"}
	}
	n, err := strconv.ParseInt(raw.S, 10, 64)
	if err != nil || n < 0 {
		return 0, &CorruptError{Key: key, Field: "periodic marker", Reason: fmt.Sprintf("%q is not a tick in unix milliseconds", raw.S)}
	}
	return n, nil
}
