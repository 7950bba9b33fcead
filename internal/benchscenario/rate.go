package benchscenario

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// BoundedRate: Producers enqueue Ops jobs between them at Rate jobs/s in
// all, on an open-loop schedule, while Slots worker slots run; reports
// enqueue-to-start latency at p50, p99 and p99.9 counted from each job's
// intended send time, and how far the producers fell behind their
// schedule (Pacing).
const BoundedRate = "bounded-rate"

// DefaultRateSlack is how far behind its schedule, as a share of the
// schedule's length, a bounded-rate run's producers may end before the run
// counts as not keeping its rate.
const DefaultRateSlack = 0.02

// minEndLag is the least end lag (Pacing.EndLag) that counts against a
// run, however short: a stall of the whole process that brief is the
// machine, not producers that cannot keep up.
const minEndLag = 100 * time.Millisecond

// warmUpStamp marks the job a bounded-rate run sends before its timed
// phase, so that start-up is not counted as latency.
const warmUpStamp = math.MaxUint64

// Pacing is how closely a bounded-rate run's producers kept their
// schedule. Job i is due at the start plus i/Rate whether or not the jobs
// before it went out in time (an open loop), and its latency counts from
// then: a producer that falls behind adds its lag to every late job's
// latency instead of hiding it (no coordinated omission).
type Pacing struct {
	Rate float64 `json:"rate"` // jobs/s asked for
	// Sent is the rate the producers achieved: jobs over the time from the
	// start to the last enqueue call's start.
	Sent float64 `json:"sent"`
	// Lag is how late enqueue calls began past their intended time. A
	// stall that the producers recover from shows here (and in the
	// latencies, which count from the intended time), not in EndLag.
	LagP50 time.Duration `json:"lag_p50_ns"`
	LagP99 time.Duration `json:"lag_p99_ns"`
	LagMax time.Duration `json:"lag_max_ns"`
	// EndLag is how far behind the schedule's end the last enqueue call
	// began: producers that cannot keep the rate fall further behind with
	// every job and end late.
	EndLag time.Duration `json:"end_lag_ns"`
	// Slack is the run's tolerance. Kept is EndLag within Slack times the
	// schedule's length, or within 100 ms, whichever is longer. A run that
	// did not keep its rate offered less load than it asked and ended
	// behind its schedule: its figures are not the bounded-rate ones.
	Slack float64 `json:"slack"`
	Kept  bool    `json:"kept"`
}

// schedule is a bounded-rate run's open-loop plan and what came of it.
type schedule struct {
	start time.Time
	rate  float64
	lag   []time.Duration // per job: enqueue call start − intended time
}

func (s *schedule) due(i int) time.Time {
	return s.start.Add(time.Duration(float64(i) * float64(time.Second) / s.rate))
}

// pace starts p.Producers producers on wg that enqueue p.Ops jobs between
// them on s's schedule, each stamped with its intended send time, retrying
// a failed enqueue (the retry's delay counts as latency).
func pace(ctx context.Context, wg *sync.WaitGroup, d WorkerDesign, p WorkParams, s *schedule, payload []byte) {
	var next atomic.Int64
	for range p.Producers {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= p.Ops {
					return
				}
				due := s.due(i)
				if wait := time.Until(due); wait > 0 {
					time.Sleep(wait)
				}
				s.lag[i] = time.Since(due)
				b := slices.Clone(payload)
				binary.BigEndian.PutUint64(b, uint64(due.UnixNano()))
				for d.Enqueue(ctx, b) != nil && ctx.Err() == nil {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
}

// pacing sums up s once every producer has returned.
func (s *schedule) pacing(slack float64) Pacing {
	lag := slices.Clone(s.lag)
	var last time.Time
	for i, l := range lag {
		last = maxTime(last, s.due(i).Add(l))
	}
	slices.Sort(lag)
	pc := Pacing{Rate: s.rate, LagP50: percentile(lag, 0.50), LagP99: percentile(lag, 0.99),
		LagMax: lag[len(lag)-1], Slack: slack}
	if span := last.Sub(s.start); span > 0 && len(lag) > 1 {
		pc.Sent = float64(len(lag)-1) / span.Seconds()
	}
	end := s.due(len(lag) - 1)
	pc.EndLag = max(0, last.Sub(end))
	pc.Kept = pc.EndLag <= max(minEndLag, time.Duration(slack*float64(end.Sub(s.start))))
	return pc
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// warmUp sends one marked job and waits until the worker has handled it,
// so that connections and the worker's start-up are behind the timed
// phase; worked is closed if the worker stops first.
func warmUp(ctx context.Context, d WorkerDesign, payload []byte, warmed, worked <-chan struct{}) error {
	b := slices.Clone(payload)
	binary.BigEndian.PutUint64(b, warmUpStamp)
	if err := d.Enqueue(ctx, b); err != nil {
		return err
	}
	select {
	case <-warmed:
		return nil
	case <-worked:
		return errors.New("the worker stopped")
	case <-ctx.Done():
		return ctx.Err()
	}
}
