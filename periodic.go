package jobkey

import (
	"context"
	"errors"
	"fmt"
	"reflect"
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
// second), placed in its concurrency key's shard by Queue.IDFor when Opts
// sets one. The enqueue also records the tick in a small marker of the
// schedule in the same EXEC (on a cluster, one per shard, beside the
// job); a tick whose job exists, or that its marker says ran (or a later
// tick did), is not enqueued again, even after its job was deleted or
// expired. So one job exists per tick however many processes run. On a
// cluster, a ConcurrencyKey changed between deploys moves the ticks to
// another shard, whose marker does not know them: the tick current at the
// change may be enqueued once more.
//
// Ticks are judged by Redis's clock, at millisecond precision; a schedule
// whose ticks come less than a millisecond apart is refused by Work, and
// one that turns so later is logged and looked at once per PollInterval.
// A process that starts, or wakes from a pause, after ticks went by
// enqueues the latest of them only, never a backlog: at most one missed
// tick. A missed tick older than the queue's Retention is left alone. The
// same holds for Pause: while the tick's shard is paused its job is not
// enqueued, and on Resume the latest tick missed is. A schedule Redis has
// not seen before is not behind: it starts at its next tick, unless
// StartWithLatestTick asks for its latest at once. Redis records each
// schedule in its marker in the name's shard; deleting the schedule's
// markers makes it new again.
type PeriodicJob struct {
	// Name identifies the schedule within the queue: 1..64 bytes, no
	// braces. Processes that share a Name share its ticks.
	Name     string
	Schedule Schedule
	Type     string
	Payload  []byte
	// Opts set the jobs' other options; ID, RunAt, Delay, UniqueBy and
	// IfExists must be unset (the tick sets them; a tick's job is refused
	// when it exists). Work refuses options Enqueue would refuse.
	// Nil means defaults.
	Opts *EnqueueOpts
	// StartWithLatestTick makes a schedule that Redis has not seen before
	// enqueue its latest tick at once, as a process that was down catches
	// up on the tick it missed. By default a new schedule starts at its
	// next tick: a daily 08:00 job first deployed at 04:21 first runs at
	// 08:00 that day, not for yesterday's 08:00. Redis records the first
	// sighting, so "new" holds across processes and restarts. River's
	// RunOnStart is the like of it, at every start rather than once per
	// schedule (default: false).
	StartWithLatestTick bool
}

// maxPeriodicName bounds PeriodicJob.Name, so the IDs stay within MaxIDLen.
const maxPeriodicName = 64

// lastMilli is the latest tick a job value can hold: its ID is the
// longest a tick's can be, so a job checked with it is checked for size.
var lastMilli = time.UnixMilli(253402300799999).UTC() // 9999-12-31T23:59:59.999Z

// validPeriodic refuses, before Work starts, a periodic job whose ticks
// could never be enqueued: a bad name, a schedule that is missing, a nil
// pointer, panics or ticks less than a millisecond apart, and options
// Enqueue would refuse.
func (q *Queue) validPeriodic(ps []PeriodicJob, now time.Time) error {
	seen := map[string]bool{}
	for _, p := range ps {
		switch {
		case p.Name == "" || len(p.Name) > maxPeriodicName || validID(p.Name) != nil:
			return fmt.Errorf("%w: PeriodicJob name %q: want 1..%d bytes, no braces", ErrInvalid, p.Name, maxPeriodicName)
		case seen[p.Name]:
			return fmt.Errorf("%w: two PeriodicJobs named %q", ErrInvalid, p.Name)
		case nilSchedule(p.Schedule):
			return fmt.Errorf("%w: PeriodicJob %q has no Schedule (or a nil %T)", ErrInvalid, p.Name, p.Schedule)
		case p.Opts != nil && (p.Opts.ID != "" || !p.Opts.RunAt.IsZero() || p.Opts.Delay != 0 || p.Opts.UniqueBy != nil || p.Opts.IfExists != IfExistsRefuse):
			return fmt.Errorf("%w: PeriodicJob %q: Opts.ID, RunAt, Delay, UniqueBy and IfExists are the tick's", ErrInvalid, p.Name)
		}
		if _, _, _, err := look(p.Schedule, now); err != nil {
			return fmt.Errorf("%w: PeriodicJob %q: %w", ErrInvalid, p.Name, err)
		}
		if _, err := q.tickJob(p, lastMilli); err != nil {
			return fmt.Errorf("PeriodicJob %q: %w", p.Name, err)
		}
		seen[p.Name] = true
	}
	return nil
}

// nilSchedule reports a Schedule that is nil, or holds a nil pointer (or
// map, func, ...): calling its Next would panic, or mean nothing.
func nilSchedule(s Schedule) bool {
	if s == nil {
		return true
	}
	switch v := reflect.ValueOf(s); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return v.IsNil()
	}
	return false
}

// tickJob is p's job of tick t, checked as Enqueue checks a job.
func (q *Queue) tickJob(p PeriodicJob, t time.Time) (*enqueueIn, error) {
	o := EnqueueOpts{}
	if p.Opts != nil {
		o = *p.Opts
	}
	// A keyed job lives in its key's shard: IDFor places the tick's ID
	// there, the same for every process. A tick's ID never ends in
	// "~<digits>", so it is the ID IDFor gave before it was injective.
	id, err := q.IDFor(o.ConcurrencyKey, periodicID(p.Name, t))
	if err != nil {
		return nil, err
	}
	o.ID, o.RunAt = id, t
	return q.newJob(context.Background(), JobSpec{Type: p.Type, Payload: p.Payload, Opts: &o})
}

// periodicID is the ID of p's job for tick t.
func periodicID(name string, t time.Time) string {
	id := "periodic:" + name + ":" + strconv.FormatInt(t.Unix(), 10)
	if ms := t.UnixMilli() % 1000; ms != 0 {
		id += fmt.Sprintf(".%03d", ms)
	}
	return id
}

// errTicksTooClose marks a schedule whose ticks come less than a
// millisecond apart: tick IDs and markers are in milliseconds.
var errTicksTooClose = errors.New("its ticks come less than a millisecond apart")

// lastTick returns the latest tick of s at or before now, or the zero time
// when there is none within the last 2^20 minutes (about two years), or
// when s ticks less than a millisecond apart.
func lastTick(s Schedule, now time.Time) time.Time {
	t, _ := latestTick(s, now)
	return t
}

// latestTick is lastTick, with ticks less than a millisecond apart
// refused (errTicksTooClose), so that a walk is at most a million steps.
// It looks back over a window that doubles until it holds a tick, then
// walks forward tick by tick, so its cost follows the ticks in one window,
// not the schedule's age.
func latestTick(s Schedule, now time.Time) (time.Time, error) {
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
			if n.Sub(t) < time.Millisecond {
				return time.Time{}, fmt.Errorf("%w (%v, then %v)", errTicksTooClose, t, n)
			}
			t = n
		}
		return t, nil
	}
	return time.Time{}, nil
}

// look asks s for the latest tick at or before now, the next tick after
// now and the one after that, and checks that they are at least a
// millisecond apart. A panic of s is returned as an error: it must not
// take the process down.
func look(s Schedule, now time.Time) (last, next, after time.Time, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("its Schedule.Next panicked: %v", r)
		}
	}()
	if last, err = latestTick(s, now); err != nil {
		return last, next, after, err
	}
	if next = s.Next(now); next.After(now) {
		after = s.Next(next)
		if after.After(next) && after.Sub(next) < time.Millisecond {
			err = fmt.Errorf("%w (%v, then %v)", errTicksTooClose, next, after)
		}
	}
	return last, next, after, err
}

// periodic runs one schedule for Work until ctx ends: at each tick (by
// Redis's clock), it enqueues the tick's job, retrying until the tick is
// settled or the next tick is due.
func (w *worker) periodic(ctx context.Context, p PeriodicJob) {
	var done time.Time   // ticks at or before it are settled, as far as this process knows
	var seenAt time.Time // when this process first looked at the schedule, by Redis's clock
	known := false       // Redis records the schedule (registerSchedule)
	for ctx.Err() == nil {
		now, err := w.q.clock.Now(ctx, w.q.rdb)
		if err != nil {
			_ = sleepCtx(ctx, w.o.PollInterval)
			continue
		}
		if seenAt.IsZero() {
			seenAt = now
		}
		tick, next, _, err := look(p.Schedule, now)
		if err != nil {
			// A schedule that Work accepted turned bad: nothing of it is
			// enqueued until it is sound again.
			w.o.Logger.Error("jobkey: a periodic schedule cannot be followed; looking again at the poll interval",
				"queue", w.q.name, "schedule", p.Name, "err", err)
			_ = sleepCtx(ctx, w.o.PollInterval)
			continue
		}
		if !known {
			// Before any tick: a schedule Redis has not seen starts at its
			// next tick, unless it asks for its latest.
			since, first, err := w.q.registerSchedule(ctx, p, seenAt, tick)
			if err != nil {
				if ctx.Err() == nil {
					w.o.Logger.Warn("jobkey: could not look up a periodic schedule's record; retrying", "queue", w.q.name, "schedule", p.Name, "err", err)
				}
				_ = sleepCtx(ctx, min(w.o.PollInterval, time.Second))
				continue
			}
			known = true
			if first {
				w.o.Logger.Debug("jobkey: a new periodic schedule", "queue", w.q.name, "schedule", p.Name,
					"starts_with_latest_tick", p.StartWithLatestTick)
			}
			if since.After(done) {
				done = since
			}
		}
		if !tick.IsZero() && tick.After(done) {
			switch {
			case now.Sub(tick) > w.q.cfg.Retention:
				// Left alone, as documented: a tick this old may have run
				// under a build that wrote no marker, its job expired since.
				done = tick
			case w.enqueueTick(ctx, p, tick):
				done = tick
			default:
				// Not settled; try again shortly, unless the next tick
				// has come by then (it supersedes this one).
				_ = sleepCtx(ctx, min(w.o.PollInterval, time.Second))
				continue
			}
		}
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

// tickOutcome is what one enqueue of a tick found.
type tickOutcome int

const (
	tickWritten tickOutcome = iota + 1 // its job and its marker were written
	tickRan                            // its job exists, or its marker says it (or a later tick) ran
	tickPaused                         // its shard is paused: nothing was written
)

// enqueueTick enqueues p's job of tick t and reports whether the tick is
// settled: its job written now or before, or its marker says it ran.
func (w *worker) enqueueTick(ctx context.Context, p PeriodicJob, t time.Time) bool {
	out, id, err := w.q.enqueueTick(ctx, p, t)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			w.o.Logger.Warn("jobkey: could not enqueue a periodic job; retrying", "queue", w.q.name, "schedule", p.Name, "job", id, "err", err)
		}
		return false
	case out == tickPaused:
		w.o.Logger.Debug("jobkey: periodic job not enqueued: its shard is paused", "queue", w.q.name, "schedule", p.Name, "job", id)
		return false
	case out == tickWritten:
		w.o.Logger.Debug("jobkey: periodic job enqueued", "queue", w.q.name, "schedule", p.Name, "job", id)
	}
	return true // or another process, or this one before a restart, was first
}
