package jobkey

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// A handler whose context has ended but that goes on running cannot be
// stopped: Go has no way to end a goroutine from outside. When its job was
// canceled or its lease lost, another worker may be running the job beside
// it, and jobkey cannot prevent that. What it can do is make it visible and
// keep Concurrency a true bound:
//
//   - a handler still running WorkOpts.StuckAfter after its context ended is
//     reported stuck: one WARN log line, Queue.Metrics (StuckHandlers, and
//     StuckDetected for ever), and a report in Redis that Stats counts
//     (Stats.StuckHandlers) for every process, and the UI shows;
//   - its runner takes no other job until it returns, since the runner is the
//     very goroutine that called it;
//   - at shutdown, Work returns without the handlers still stuck once
//     nothing else is left (see drain), with ErrHandlerStuck.
//
// The report is an entry of the shard's stuck set (seenStuck), scored by
// when it lapses on Redis's clock: renewed every Lease/3 while the handler
// runs, removed when it returns, and left to lapse one Lease after its
// process stops renewing it (the process died, or shutdown gave up on it).

// handlerMetrics counts stuck handlers of this process's Works.
type handlerMetrics struct {
	stuck    atomic.Int64 // reported stuck, not returned yet
	detected atomic.Int64 // ever reported stuck
}

// stuckWatch watches one handler call: from the moment its context ends,
// it gives the handler StuckAfter to return, then reports it stuck until
// it does.
type stuckWatch struct {
	w *worker
	r *run
	// stopAfter unregisters ended from the handler's context.
	stopAfter func() bool

	mu       sync.Mutex
	done     bool        // the handler has returned
	endedAt  time.Time   // when its context ended
	cause    error       // why it ended
	timer    *time.Timer // fires StuckAfter after endedAt
	stuck    bool        // reported stuck
	quit     chan struct{}
	reported chan struct{} // closed when the report's goroutine has ended
}

// watch starts watching the handler call of r, whose context is hctx.
// Until hctx ends it costs nothing but the registration.
//
// When hctx is the run's own context, every way it ends is a call of this
// package's: the run's end (a lost lease, a cancel, the self-fence) or
// shutdown's endRuns, each of which tells the watch. So the watch is only
// registered with the run, where context.AfterFunc would cost a handful of
// allocations per run (its context, the parent's children map, two
// closures). A handler context with a timer of its own (Timeout,
// Deadline) is watched with AfterFunc.
func (w *worker) watch(r *run, hctx context.Context) *stuckWatch {
	s := &stuckWatch{w: w, r: r}
	if hctx != r.ctx {
		s.stopAfter = context.AfterFunc(hctx, func() { s.ended(context.Cause(hctx)) })
		return s
	}
	r.watching.Store(s)
	s.stopAfter = func() bool { return r.watching.CompareAndSwap(s, nil) }
	if r.ctx.Err() != nil {
		// Ended before the watch was registered: the call that ended it may
		// have looked for the watch first (ended runs at most once).
		s.ended(context.Cause(r.ctx))
	}
	return s
}

// ended starts the clock when the handler's context ends.
func (s *stuckWatch) ended(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done || !s.endedAt.IsZero() {
		return // returned, or told already
	}
	s.endedAt, s.cause = time.Now(), cause
	s.timer = time.AfterFunc(s.w.o.StuckAfter, s.expired)
}

// expired reports the handler stuck, unless it returned meanwhile.
func (s *stuckWatch) expired() {
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return
	}
	s.stuck = true
	s.quit, s.reported = make(chan struct{}), make(chan struct{})
	go s.report(s.quit, s.reported)
	// Counted under s.mu, so that returned cannot take it back first.
	s.w.q.handlers.stuck.Add(1)
	s.w.q.handlers.detected.Add(1)
	since, cause := s.endedAt, s.cause
	s.w.mu.Lock()
	s.w.stuck[s.r] = since
	s.w.mu.Unlock()
	s.mu.Unlock()
	s.w.changedNow()
	j := s.r.job
	msg := "jobkey: handler stuck: it has not returned since its context ended; its runner stays taken until it does"
	if errors.Is(cause, ErrJobCanceled) || errors.Is(cause, ErrLeaseLost) || errors.Is(cause, ErrLeaseExpired) {
		msg += ", and its lease is no longer kept: another worker may run the job beside it"
	}
	s.w.o.Logger.Warn(msg, "queue", s.w.q.name, "job", j.ID, "type", j.Type, "attempt", j.Attempt, "worker", j.LeaseOwner,
		"cause", cause, "since", time.Since(since).Round(time.Millisecond))
}

// returned ends the watch once the handler has returned: a stuck handler's
// report is taken back, and its runner is free again.
func (s *stuckWatch) returned() {
	s.stopAfter()
	s.mu.Lock()
	s.done = true
	if s.timer != nil {
		s.timer.Stop()
	}
	stuck, since := s.stuck, s.endedAt
	if stuck {
		s.w.q.handlers.stuck.Add(-1)
		s.w.mu.Lock()
		delete(s.w.stuck, s.r)
		s.w.mu.Unlock()
		close(s.quit)
	}
	s.mu.Unlock()
	if !stuck {
		return
	}
	<-s.reported
	s.w.changedNow()
	j := s.r.job
	s.w.o.Logger.Info("jobkey: stuck handler returned; its runner is free again",
		"queue", s.w.q.name, "job", j.ID, "type", j.Type, "attempt", j.Attempt, "worker", j.LeaseOwner,
		"after", time.Since(since).Round(time.Millisecond))
}

// report keeps the handler's entry in its shard's stuck set until quit is
// closed, then removes it; if Work gives up on the handler first, the
// entry is left to lapse.
func (s *stuckWatch) report(quit, reported chan struct{}) {
	defer close(reported)
	q := s.w.q
	j := s.r.job
	key := q.ks.index(q.ks.shardOf(j.ID), seenStuck)
	member := stuckMember(j)
	every := q.cfg.Lease / 3
	t := time.NewTimer(0)
	defer t.Stop()
	failing := false // warn once per run of failures, not at every renewal
	for {
		select {
		case <-quit:
			ctx, cancel := context.WithTimeout(s.w.writes, every)
			err := q.rdb.ZRem(ctx, key, member).Err()
			cancel()
			if err != nil {
				s.w.o.Logger.Warn("jobkey: could not take back a stuck handler's report; it lapses by itself",
					"queue", q.name, "job", j.ID, "lapses_within", q.cfg.Lease, "err", err)
			}
			return
		case <-s.w.abandoned:
			return
		case <-t.C:
		}
		t.Reset(every)
		ctx, cancel := context.WithTimeout(s.w.writes, every)
		now, err := q.clock.Now(ctx, q.rdb)
		if err == nil {
			err = q.rdb.ZAdd(ctx, key, redis.Z{Score: float64(toMillis(now.Add(q.cfg.Lease))), Member: member}).Err()
		}
		cancel()
		if err != nil && !failing {
			s.w.o.Logger.Warn("jobkey: could not report a stuck handler in Redis; Stats may not count it",
				"queue", q.name, "job", j.ID, "err", err)
		}
		failing = err != nil
	}
}

// stuckMember names one run in the stuck set: its lease token, then the
// job's ID. Two stuck runs of one job are two entries.
func stuckMember(j *Job) string { return strconv.FormatUint(j.LeaseToken, 10) + ":" + j.ID }

// changedNow tells drain that the runners or the stuck handlers changed.
func (w *worker) changedNow() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// runnerDone counts a runner that has returned.
func (w *worker) runnerDone() {
	w.mu.Lock()
	w.live--
	w.mu.Unlock()
	w.changedNow()
}

// maxNamedStuck bounds the jobs ErrHandlerStuck's message names.
const maxNamedStuck = 10

// giveUp returns, once every runner still running is held by a stuck
// handler, an error that names them, and stops renewing their leases and
// reports. It returns nil while any other runner is still busy.
func (w *worker) giveUp() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.stuck) == 0 || len(w.stuck) < w.live {
		return nil
	}
	var names []string
	for r, since := range w.stuck {
		if len(names) == maxNamedStuck {
			names = append(names, "…")
			break
		}
		names = append(names, fmt.Sprintf("%q (%s, context ended %v ago)", r.job.ID, r.job.Type, time.Since(since).Round(time.Millisecond)))
	}
	// Their runs only: a success handed to the feeder (workahead.go), whose
	// runner has returned, keeps its lease until its outcome is written.
	for r := range w.stuck {
		r.abandoned.Store(true)
	}
	close(w.abandoned)
	return fmt.Errorf("%w: Work returns without %d handlers of queue %q that ignored their context: %s; their leases are no longer renewed, so their jobs may run again elsewhere beside them",
		ErrHandlerStuck, len(w.stuck), w.q.name, strings.Join(names, ", "))
}
