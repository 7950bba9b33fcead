package jobkey

import (
	"sync/atomic"

	"github.com/jobkey/jobkey/internal/cas"
)

// MetricsSnapshot is a copy of a Queue's counters in this process: the
// CAS engine's, and the stuck handlers of its Works.
type MetricsSnapshot struct {
	Txns       int64 // compare-and-set transactions run
	Attempts   int64 // attempts, including retries after conflicts
	Conflicts  int64 // EXECs aborted because a watched key changed
	RoundTrips int64 // network round trips made by the engine
	Commands   int64 // Redis commands sent, MULTI and EXEC included
	Unwatches  int64 // UNWATCHes sent on paths that did not reach EXEC
	// Rides counts transactions whose round trip 1 was carried behind the
	// EXEC of the batch before them, on the same connection, which was
	// then handed over to them: a round trip saved each.
	Rides int64
	// StuckHandlers is how many handlers of this process's Works on the
	// Queue are stuck now: still running WorkOpts.StuckAfter after their
	// contexts ended (a gauge).
	StuckHandlers int64
	// StuckDetected counts the handlers ever reported stuck.
	StuckDetected int64
	// What this process's Works recorded of their runs (counters):
	// Succeeded, the jobs completed; AttemptsFailed, the attempts that
	// failed (an error, a panic, a timeout, a deadline), of which
	// RetriesScheduled put the job back to run again and FailedForGood
	// failed it with no retry left (or ErrSkipRetry); Released, the runs
	// given back with their attempt unspent (shutdown, a claim that came
	// too late); Snoozed, the runs that snoozed (Snooze: their attempt
	// unspent too, and not among Released); and Canceled, the runs stopped
	// because their job was canceled while it ran.
	Succeeded, AttemptsFailed, RetriesScheduled, FailedForGood, Released, Snoozed, Canceled int64
	// BatchCallbacks counts the batch callbacks (and chain steps) this
	// process's transactions wrote, enqueued or canceled by their
	// condition; EventsAppended, the transitions' events they appended to
	// the queue's streams (not EnableEvents' and DisableEvents' entries).
	// Both are counters of the EXECs this process saw commit: one whose
	// reply was lost (ErrOutcomeUnknown) may have landed and is not
	// counted, nor is the retry that recognises it, which writes nothing.
	// They never count a write twice, or one that did not land.
	BatchCallbacks, EventsAppended int64
	// Prefetched counts the jobs Work's bulk transactions claimed for its
	// runners (WorkOpts.Prefetch); PrefetchReturned, those of them given
	// back unrun, their attempts unspent, because no slot took them in
	// time or Work stopped (not counted in Released).
	Prefetched, PrefetchReturned int64
	// Runners is how many runners this process's Works on the queue have,
	// and BusyRunners how many of them run a handler now (gauges).
	Runners, BusyRunners int64
	// The sizes of the batches that group commit flushed, by call:
	// enqueues, claims, completions, lease extensions and Work's
	// complete-and-claim, whether its runners' calls shared a batch or
	// Work wrote their successes in bulk (WorkOpts.Prefetch) (all zero
	// with Config.DisableGroupCommit).
	EnqueueBatches, ClaimBatches, CompleteBatches, ExtendBatches, FinishBatches BatchSizes
}

// Metrics returns the queue's counters in this process since the Queue
// was made: the compare-and-set engine's attempts, conflicts, round trips
// and commands, and the stuck handlers of its Works.
//
// It is API because the counters are what an operator watches and no
// other call exposes them: the otel module exports them as OpenTelemetry
// instruments, the bench module reads conflicts and retries from them, and
// an application may feed them to its own metrics.
func (q *Queue) Metrics() MetricsSnapshot {
	c := q.cas.Counts()
	m := MetricsSnapshot{Txns: c.Txns, Attempts: c.Attempts, Conflicts: c.Conflicts, RoundTrips: c.RoundTrips,
		Commands: c.Commands, Unwatches: c.Unwatches, Rides: c.Handovers}
	m.StuckHandlers, m.StuckDetected = q.handlers.stuck.Load(), q.handlers.detected.Load()
	w := &q.work
	m.Succeeded, m.AttemptsFailed, m.RetriesScheduled = w.succeeded.Load(), w.attemptsFailed.Load(), w.retries.Load()
	m.FailedForGood, m.Released, m.Canceled = w.failedForGood.Load(), w.released.Load(), w.canceled.Load()
	m.Snoozed = w.snoozed.Load()
	m.Prefetched, m.PrefetchReturned = w.prefetched.Load(), w.prefetchReturned.Load()
	m.Runners, m.BusyRunners = w.runners.Load(), w.busy.Load()
	m.BatchCallbacks, m.EventsAppended = q.written.callbacks.Load(), q.written.events.Load()
	if q.enqueues != nil {
		m.EnqueueBatches, m.ClaimBatches = batchSizes(q.enqueues.Sizes()), batchSizes(q.claims.Sizes())
		m.CompleteBatches, m.ExtendBatches = batchSizes(q.completes.Sizes()), batchSizes(q.extends.Sizes())
		m.FinishBatches = batchSizes(q.finishes.Sizes())
	}
	return m
}

// batchSizes is a group's histogram as the public type.
func batchSizes(s cas.Sizes) BatchSizes {
	return BatchSizes{Flushes: s.Flushes, Calls: s.Calls, Buckets: s.Buckets}
}

// BatchSizes is a histogram of one kind of group-committed call (enqueue,
// claim, ...): how many flushes ran and how many calls they carried.
// Buckets[0] counts flushes of one call, and Buckets[i] those of more than
// 2^(i-1) and at most 2^i calls.
type BatchSizes struct {
	Flushes int64
	Calls   int64
	Buckets [cas.SizeBuckets]int64
}

// Mean is the average number of calls per flush.
func (s BatchSizes) Mean() float64 {
	if s.Flushes == 0 {
		return 0
	}
	return float64(s.Calls) / float64(s.Flushes)
}

// Sub returns s less an earlier snapshot o.
func (s BatchSizes) Sub(o BatchSizes) BatchSizes {
	s.Flushes -= o.Flushes
	s.Calls -= o.Calls
	for i := range s.Buckets {
		s.Buckets[i] -= o.Buckets[i]
	}
	return s
}

// workMetrics counts what this process's Works did on a Queue (see
// MetricsSnapshot).
type workMetrics struct {
	succeeded, attemptsFailed, retries, failedForGood, released, snoozed, canceled atomic.Int64
	runners, busy                                                                  atomic.Int64
	prefetched, prefetchReturned                                                   atomic.Int64
}

// count counts an outcome a runner recorded: j as stored, written for the
// run that claimed claimed.
func (m *workMetrics) count(claimed, j *Job) {
	switch j.State {
	case StateSucceeded:
		m.succeeded.Add(1)
	case StateFailed:
		m.attemptsFailed.Add(1)
		m.failedForGood.Add(1)
	case StatePending:
		if j.Snoozes > claimed.Snoozes {
			m.snoozed.Add(1) // snoozed: its attempt unspent
			return
		}
		if j.Attempt < claimed.Attempt {
			m.released.Add(1) // given back: its attempt unspent
			return
		}
		m.attemptsFailed.Add(1)
		m.retries.Add(1)
	}
}

// writtenMetrics counts what this process's transactions wrote beside the
// jobs themselves.
type writtenMetrics struct {
	callbacks atomic.Int64 // batch callbacks written
	events    atomic.Int64 // events appended
}
