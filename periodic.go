package jobkey

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Schedule says when a periodic job's ticks fall: Next returns the first
// tick after t, or the zero time when there is none. The schedules of
// github.com/robfig/cron/v3 (cron.ParseStandard("0 * * * *"), for example)
// satisfy it as they are; Every makes a fixed interval. A schedule must be
// a pure function of t, so that every process computes the same ticks.
type Schedule interface {
	Next(t time.Time) time.Time
}

// Every returns a schedule with a tick every d, at the multiples of d since
// the Unix epoch, so that every process computes the same ticks wherever
// and whenever it starts (cron's "@every" counts from when it was asked,
// which differs between processes). A d under a millisecond has no ticks:
// tick IDs are in milliseconds.
func Every(d time.Duration) Schedule { return every(d) }

type every time.Duration

func (e every) Next(t time.Time) time.Time {
	d := int64(e)
	if d < int64(time.Millisecond) {
		return time.Time{}
	}
	return time.Unix(0, (t.UnixNano()/d+1)*d).UTC()
}

// PeriodicJob is a job that Work enqueues at every tick of its schedule.
// Every process whose Work has it runs the schedule, with no leader: each
// enqueues the tick's job under the ID "periodic:<Name>:<tick>", where tick
// is the tick's Unix time in seconds (with ".mmm" when it falls within a
// second), and ErrJobExists makes every enqueue after the first a no-op. So
// one job exists per tick however many processes run.
//
// Ticks are judged by Redis's clock. A process that starts, or wakes from a
// pause, after ticks went by enqueues the latest of them only, never a
// backlog: at most one missed tick. A missed tick older than the queue's
// Retention is left alone, since its job may have expired and the ID no
// longer proves it ran: keep Retention longer than the schedule's period.
type PeriodicJob struct {
	// Name identifies the schedule within the queue: 1..64 bytes, no
	// braces. Processes that share a Name share its ticks.
	Name     string
	Schedule Schedule
	Type     string
	Payload  []byte
	// Opts set the jobs' other options; ID, RunAt and Delay must be unset
	// (the tick sets them). Nil means defaults.
	Opts *EnqueueOpts
}

// maxPeriodicName bounds PeriodicJob.Name, so the IDs stay within MaxIDLen.
const maxPeriodicName = 64

func validPeriodic(ps []PeriodicJob) error {
	seen := map[string]bool{}
	for _, p := range ps {
		switch {
		case p.Name == "" || len(p.Name) > maxPeriodicName || validID(p.Name) != nil:
			return fmt.Errorf("%w: PeriodicJob name %q: want 1..%d bytes, no braces", ErrInvalid, p.Name, maxPeriodicName)
		case seen[p.Name]:
			return fmt.Errorf("%w: two PeriodicJobs named %q", ErrInvalid, p.Name)
		case p.Schedule == nil:
			return fmt.Errorf("%w: PeriodicJob %q has no Schedule", ErrInvalid, p.Name)
		case p.Opts != nil && (p.Opts.ID != "" || !p.Opts.RunAt.IsZero() || p.Opts.Delay != 0):
			return fmt.Errorf("%w: PeriodicJob %q: Opts.ID, RunAt and Delay are the tick's", ErrInvalid, p.Name)
		}
		if p.Type == "" || len(p.Type) > MaxTypeLen {
			return fmt.Errorf("%w: PeriodicJob %q: job type must be 1..%d bytes", ErrInvalid, p.Name, MaxTypeLen)
		}
		seen[p.Name] = true
	}
	return nil
}

// periodicID is the ID of p's job for tick t.
func periodicID(name string, t time.Time) string {
	id := "periodic:" + name + ":" + strconv.FormatInt(t.Unix(), 10)
	if ms := t.UnixMilli() % 1000; ms != 0 {
		id += fmt.Sprintf(".%03d", ms)
	}
	return id
}

// lastTick returns the latest tick of s at or before now, or the zero time
// when there is none within the last 2^20 minutes (about two years). It
// looks back over a window that doubles until it holds a tick, then walks
// forward tick by tick, so its cost follows the ticks in one window, not
// the schedule's age.
func lastTick(s Schedule, now time.Time) time.Time {
	for w := time.Minute; w <= 1<<20*time.Minute; w *= 2 {
		t := s.Next(now.Add(-w))
		if t.IsZero() || t.After(now) {
			continue
		}
		for range 1 << 20 {
			n := s.Next(t)
			if n.IsZero() || n.After(now) || !n.After(t) {
				break
			}
			t = n
		}
		return t
	}
	return time.Time{}
}

// periodic runs one schedule for Work until ctx ends: at each tick (by
// Redis's clock), it enqueues the tick's job, retrying until the job
// exists or the next tick is due.
func (w *worker) periodic(ctx context.Context, p PeriodicJob) {
	var done time.Time // the latest tick whose job this process saw exist
	for ctx.Err() == nil {
		now, err := w.q.clock.now(ctx, w.q.rdb)
		if err != nil {
			_ = sleepCtx(ctx, w.o.PollInterval)
			continue
		}
		if t := lastTick(p.Schedule, now); !t.IsZero() && t.After(done) {
			switch {
			case now.Sub(t) > w.q.cfg.Retention:
				// Too old to tell whether it ran: its job may have expired,
				// and its ID proves nothing any more. This holds after a
				// long cut from Redis as much as at the start.
				done = t
			case w.enqueueTick(ctx, p, t):
				done = t
			default:
				// Not written; try again shortly, unless the next tick
				// has come by then (it supersedes this one).
				_ = sleepCtx(ctx, min(w.o.PollInterval, time.Second))
				continue
			}
		}
		next := p.Schedule.Next(now)
		switch {
		case next.IsZero():
			return // the schedule has no more ticks
		case !next.After(now):
			// A schedule whose next tick is not ahead: look again at the
			// poll interval rather than spin.
			w.o.Logger.Warn("jobkey: a periodic schedule's next tick is not after now", "queue", w.q.name, "schedule", p.Name, "next", next)
			_ = sleepCtx(ctx, w.o.PollInterval)
			continue
		}
		t := time.NewTimer(next.Sub(now))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// enqueueTick enqueues p's job of tick t and reports whether it exists now.
func (w *worker) enqueueTick(ctx context.Context, p PeriodicJob, t time.Time) bool {
	o := EnqueueOpts{}
	if p.Opts != nil {
		o = *p.Opts
	}
	// A keyed job lives in its key's shard: IDFor places the tick's ID
	// there, the same for every process.
	id, err := w.q.IDFor(o.ConcurrencyKey, periodicID(p.Name, t))
	if err == nil {
		o.ID, o.RunAt = id, t
		_, err = w.q.Enqueue(ctx, p.Type, p.Payload, &o)
	}
	switch {
	case err == nil:
		w.o.Logger.Debug("jobkey: periodic job enqueued", "queue", w.q.name, "schedule", p.Name, "job", o.ID)
		return true
	case errors.Is(err, ErrJobExists):
		return true // another process, or this one before a restart, was first
	case ctx.Err() == nil:
		w.o.Logger.Warn("jobkey: could not enqueue a periodic job; retrying", "queue", w.q.name, "schedule", p.Name, "job", o.ID, "err", err)
	}
	return false
}
