package jobkey

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// trimStep bounds the entries one trim command removes: a few milliseconds
// of Redis's time at most, whatever the size of the backlog.
const trimStep = 1000

// maxTrimRounds bounds one Trim call: at most this many steps per index.
const maxTrimRounds = 100

// trimTarget is an index whose old entries Trim removes.
type trimTarget struct {
	key string
	age time.Duration // entries older than this go
}

// Trim removes index entries that nothing needs any more: those of
// finished jobs whose keys have expired with their retention (a canceled
// job's a Config.Lease later: a run canceled while it ran keeps its key
// until its lease ends), old sightings of newer-format and vanished jobs
// (Stats.Newer, Stats.Vanished), and reports of stuck handlers that lapsed
// (Stats.StuckHandlers).
// It removes at most a thousand entries per command, so that no command
// blocks Redis for more than a few milliseconds at any queue size, and up
// to a hundred thousand per index per call. It returns how many it removed.
//
// Trimming is housekeeping, not repair: an entry left behind is never
// mistaken for a job (claims never read finished indexes, and Stats counts
// only entries within the retention). Work calls it every
// WorkOpts.TrimInterval; a queue without workers can call it from a timer.
func (q *Queue) Trim(ctx context.Context) (int, error) {
	if err := q.check(ctx, true); err != nil {
		return 0, err
	}
	now, err := q.clock.Now(ctx, q.rdb)
	if err != nil {
		return 0, err
	}
	var targets []trimTarget
	for s := range q.ks.shards {
		targets = append(targets,
			trimTarget{q.ks.index(s, idxSucceeded), q.cfg.Retention},
			// A run canceled while it ran keeps its key until its lease
			// ends (lastrun.go), at most a Lease after the cancel: its
			// entry stays as long, so the job stays listed.
			trimTarget{q.ks.index(s, idxCanceled), q.cfg.Retention + q.cfg.Lease},
			trimTarget{q.ks.index(s, idxFailed), q.cfg.FailedRetention},
			trimTarget{q.ks.index(s, seenNewerFormat), newerWindow},
			trimTarget{q.ks.index(s, seenLost), q.cfg.Retention},
			trimTarget{q.ks.index(s, seenStuck), 0}) // scored by when they lapse
	}
	removed := 0
	for round := 0; round < maxTrimRounds && len(targets) > 0; round++ {
		n, more, err := q.trimStep(ctx, now, targets)
		removed += n
		if err != nil {
			return removed, err
		}
		targets = more
	}
	return removed, nil
}

// trimStep removes up to trimStep old entries of each target, in two round
// trips: the first trimStep old entries (or fewer, when fewer are old),
// then their removal: ZREM of the members read when the read was full,
// else ZREMRANGEBYSCORE of all that is old, which is fewer than a step.
// Either way one command removes at most trimStep entries. It returns the
// targets that may hold more.
func (q *Queue) trimStep(ctx context.Context, now time.Time, targets []trimTarget) (int, []trimTarget, error) {
	cuts := make([]string, len(targets))
	old := make([]*redis.StringSliceCmd, len(targets))
	cmds, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, t := range targets {
			// A second of grace: an entry's score is its transaction's read
			// time, and its key's TTL starts a moment later, at EXEC.
			cuts[i] = strconv.FormatInt(toMillis(now.Add(-t.age-time.Second)), 10)
			old[i] = p.ZRangeByScore(ctx, t.key, &redis.ZRangeBy{Min: "-inf", Max: "(" + cuts[i], Count: trimStep})
		}
		return nil
	})
	if err := reply.Unanswered(cmds, err); err != nil {
		return 0, nil, fmt.Errorf("jobkey: trim: %w", err)
	}
	var more []trimTarget
	var rems []*redis.IntCmd
	cmds, err = q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, t := range targets {
			members, err := old[i].Result()
			switch {
			case err != nil, len(members) == 0:
				// A broken index or a node that is down: left for later.
			case len(members) == trimStep:
				ms := make([]any, len(members))
				for k, m := range members {
					ms[k] = m
				}
				rems = append(rems, p.ZRem(ctx, t.key, ms...))
				more = append(more, t)
			default:
				rems = append(rems, p.ZRemRangeByScore(ctx, t.key, "-inf", "("+cuts[i]))
			}
		}
		return nil
	})
	if err := reply.Unanswered(cmds, err); err != nil {
		return 0, nil, fmt.Errorf("jobkey: trim: %w", err)
	}
	removed := 0
	for _, c := range rems {
		removed += int(c.Val())
	}
	return removed, more, nil
}
