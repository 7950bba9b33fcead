package jobkey

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jobkey/jobkey/internal/msgpk"
)

// Rate limits per key (docs/design.md, "Concurrency keys"). A concurrency
// key's value may also hold a rate limit: at most rate starts of its jobs
// within any period, and the times of its latest starts, judged by
// Redis's clock. A claim decides the rate with the concurrency limit, in
// the compare-and-set that takes the job (slotBook.take), so the limit and
// the start are one all-or-nothing change, and no counter or sweeper is
// needed: a start leaves the window by time alone.

// SetRateLimit sets the rate limit of concurrency key key: at most n of
// its jobs start within any period, judged by Redis's clock, across every
// worker and process. n = 0 removes the key's rate limit. The rate and the
// key's latest starts are kept in the key's one value, beside its
// concurrency limit, and a claim decides both in the compare-and-set that
// takes the job: no counter, no lock and no sweeper. A job over the limit
// stays pending, holding no runner and no slot, and its entry comes due
// when the rate lets it start; jobs of other keys are not held back.
//
// The rate composes with the key's concurrency limit, which still holds
// (its own, or Config.ConcurrencyLimit, 1 by default): set both for a key
// whose jobs may run side by side. A start is a claim that took the job:
// each attempt is one; a run renewed or given back is not a new one.
// n is at most MaxRateLimit, period 1ms to MaxRatePeriod. One
// compare-and-set.
//
// A job held back by the rate is looked at again when the rate lets it
// start, or within a minute, so a rate raised or removed holds it back no
// longer than that.
//
// Rollout: a key with a rate is written in the key value's format 2, which
// builds before it cannot read: their claims leave the key's jobs waiting
// and log it, and their running jobs of the key renew their own leases
// but not the key's count of them, so the key may run one more job than
// its limit beside them. Upgrade every worker first.
func (q *Queue) SetRateLimit(ctx context.Context, key string, n int, period time.Duration) error {
	if n < 0 || n > MaxRateLimit {
		return fmt.Errorf("%w: rate limit is %d, want 0..%d", ErrInvalid, n, MaxRateLimit)
	}
	if n > 0 && (period < time.Millisecond || period > MaxRatePeriod || period%time.Millisecond != 0) {
		return fmt.Errorf("%w: rate period is %v, want whole milliseconds from 1ms to %v", ErrInvalid, period, MaxRatePeriod)
	}
	if n == 0 {
		period = 0
	}
	return q.changeSlotValue(ctx, "SetRateLimit", key, func(v *slotValue) bool {
		if v.rate == n && v.period == period.Milliseconds() {
			return false
		}
		v.rate, v.period = n, period.Milliseconds()
		if n == 0 {
			v.starts = nil
		} else {
			keepLatest(&v.starts, n)
		}
		return true // jobs waiting for a slot come due by the new rate
	})
}

// MaxRateLimit bounds a key's rate limit: the value keeps a start time per
// start it counts (about 9 bytes each), rewritten by every claim of the
// key's jobs.
const MaxRateLimit = 1000

// MaxRatePeriod bounds a rate limit's period.
const MaxRatePeriod = 31 * 24 * time.Hour

// decodeRate decodes a format 2 value's rate limit and its recent starts.
func decodeRate(d *msgpk.Decoder, v *slotValue) error {
	if m, err := d.ArrayLen("rate limit"); err != nil {
		return err
	} else if m != 2 {
		return d.Corrupt("rate limit", fmt.Sprintf("array of %d elements, want 2", m))
	}
	rate, err := d.Uint("rate", MaxRateLimit)
	if err != nil {
		return err
	}
	if rate == 0 {
		return d.Corrupt("rate limit", "rate 0 in a format 2 value")
	}
	v.rate = int(rate)
	if v.period, err = d.Int("rate period", 1, MaxRatePeriod.Milliseconds()); err != nil {
		return err
	}
	n, err := d.ArrayLen("starts")
	if err != nil {
		return err
	}
	if n > v.rate {
		return d.Corrupt("starts", fmt.Sprintf("%d starts kept for a rate of %d", n, v.rate))
	}
	v.starts = make([]int64, 0, n)
	for range n {
		// Bounded so that a start plus any period cannot overflow.
		t, err := d.Int("start", -1<<62, 1<<62)
		if err != nil {
			return err
		}
		v.starts = append(v.starts, t)
	}
	return nil
}

// recent counts the starts within the key's rate period before now: the
// starts a new one is judged against.
func (b *slotBook) recent(e *slotEntry) int {
	n := 0
	for _, t := range e.v.starts {
		if t > b.now-e.v.period {
			n++
		}
	}
	return n
}

// rateFull says whether the key's rate limit lets no claim start now.
func (b *slotBook) rateFull(e *slotEntry) bool {
	return e.v.rate > 0 && b.recent(e) >= e.v.rate
}

// rateFreeAt is when the key's rate limit lets a claim start again: the
// rate-th latest start plus the period. Only meaningful when rateFull.
func (b *slotBook) rateFreeAt(e *slotEntry) int64 {
	return e.v.starts[len(e.v.starts)-e.v.rate] + e.v.period
}

// started records a start at now in the key's recent starts, keeping the
// latest rate of them in time order. A claim may commit after one that
// read a later TIME (it read the key's value after that one's EXEC), so a
// start is put in its place, and the oldest go, not the first recorded.
func (b *slotBook) started(e *slotEntry) {
	if e.v.rate == 0 {
		return
	}
	i, _ := slices.BinarySearch(e.v.starts, b.now)
	e.v.starts = slices.Insert(e.v.starts, i, b.now)
	keepLatest(&e.v.starts, e.v.rate)
}

// keepLatest sorts starts and keeps the latest n of them.
func keepLatest(starts *[]int64, n int) {
	slices.Sort(*starts)
	if k := len(*starts) - n; k > 0 {
		*starts = slices.Delete(*starts, 0, k)
	}
}

// rateRecheck bounds how far ahead a job held back by its key's rate is
// parked: it is looked at again at least this often, so that a rate an
// operator raised or removed holds no parked job back for longer.
const rateRecheck = time.Minute
