package jobkeyotel

import (
	"context"
	"errors"
	"fmt"

	"github.com/jobkey/jobkey"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ObserveQueues registers observable instruments on meter that read the
// given queues at every collection:
//
//   - jobkey.queue.jobs, a gauge of the jobs in each state of Queue.Stats
//     (pending, due, scheduled, active, expired_leases, succeeded, failed,
//     canceled, corrupt, newer, vanished), by queue and state. It costs one
//     Stats call, one round trip per Redis node, per queue and collection.
//     A queue whose Stats fails, wholly or for some shards, reports no
//     depth that time, and the error goes to otel.Handle.
//   - jobkey.queue.paused_shards, a gauge of the shards paused by
//     Queue.Pause, by queue: 0 when the queue runs, its shard count when
//     it is paused, in between when a Pause or Resume did not reach every
//     shard.
//   - jobkey.queue.stuck_handlers, a gauge of the handlers reported stuck
//     in every process (Stats.StuckHandlers), by queue: still running
//     WorkOpts.StuckAfter after their contexts ended.
//   - jobkey.cas.transactions, .attempts, .conflicts, .round_trips,
//     .commands and .unwatches: counters of Queue.Metrics, the
//     compare-and-set engine of this process's Queue, by queue.
//   - jobkey.work.stuck_handlers, a gauge of the stuck handlers of this
//     process's Works, and jobkey.work.stuck_detections, a counter of those
//     ever reported stuck, by queue (Queue.Metrics).
//   - What this process's Works recorded of their jobs, each under its
//     own name, by queue: jobkey.work.jobs_succeeded,
//     jobkey.work.attempts_failed (of which jobkey.work.retries_scheduled
//     put the job back and jobkey.work.jobs_failed failed it for good),
//     jobkey.work.jobs_canceled and jobkey.work.runs_released (counters).
//   - jobkey.work.runners, a gauge of this process's runners by queue and
//     state (KeyState: busy or idle).
//   - jobkey.writes.batch_callbacks and jobkey.writes.events: counters of
//     the batch callbacks written and the events appended by this
//     process's transactions, by queue (Queue.Metrics).
//
// Unregister the returned registration to stop observing.
func ObserveQueues(meter metric.Meter, queues ...*jobkey.Queue) (metric.Registration, error) {
	if meter == nil {
		return nil, errors.New("jobkeyotel: ObserveQueues with nil meter")
	}
	for i, q := range queues {
		if q == nil {
			return nil, fmt.Errorf("jobkeyotel: ObserveQueues: queue %d is nil", i)
		}
	}
	depth, err := meter.Int64ObservableGauge("jobkey.queue.jobs",
		metric.WithDescription("Jobs in each state, from Queue.Stats, by queue and state."), metric.WithUnit("{job}"))
	if err != nil {
		return nil, err
	}
	paused, err := meter.Int64ObservableGauge("jobkey.queue.paused_shards",
		metric.WithDescription("Shards of the queue paused by Queue.Pause, by queue."), metric.WithUnit("{shard}"))
	if err != nil {
		return nil, err
	}
	stuck, err := meter.Int64ObservableGauge("jobkey.queue.stuck_handlers",
		metric.WithDescription("Handlers still running after their contexts ended, in every process, from Queue.Stats, by queue."), metric.WithUnit("{handler}"))
	if err != nil {
		return nil, err
	}
	stuckHere, err := meter.Int64ObservableGauge("jobkey.work.stuck_handlers",
		metric.WithDescription("Handlers still running after their contexts ended, in this process, by queue."), metric.WithUnit("{handler}"))
	if err != nil {
		return nil, err
	}
	detected, err := meter.Int64ObservableCounter("jobkey.work.stuck_detections",
		metric.WithDescription("Handlers reported stuck, in this process, by queue."), metric.WithUnit("{handler}"))
	if err != nil {
		return nil, err
	}
	type counter struct {
		inst metric.Int64ObservableCounter
		get  func(jobkey.MetricsSnapshot) int64
	}
	var cas []counter
	for _, c := range []struct {
		name, unit, desc string
		get              func(jobkey.MetricsSnapshot) int64
	}{
		{"jobkey.cas.transactions", "{txn}", "Compare-and-set transactions run.", func(m jobkey.MetricsSnapshot) int64 { return m.Txns }},
		{"jobkey.cas.attempts", "{attempt}", "Compare-and-set attempts, retries after conflicts included.", func(m jobkey.MetricsSnapshot) int64 { return m.Attempts }},
		{"jobkey.cas.conflicts", "{conflict}", "EXECs aborted because a watched key changed.", func(m jobkey.MetricsSnapshot) int64 { return m.Conflicts }},
		{"jobkey.cas.round_trips", "{round_trip}", "Network round trips of the compare-and-set engine.", func(m jobkey.MetricsSnapshot) int64 { return m.RoundTrips }},
		{"jobkey.cas.commands", "{command}", "Redis commands sent by the compare-and-set engine, MULTI and EXEC included.", func(m jobkey.MetricsSnapshot) int64 { return m.Commands }},
		{"jobkey.cas.unwatches", "{command}", "UNWATCHes sent on paths that did not reach EXEC.", func(m jobkey.MetricsSnapshot) int64 { return m.Unwatches }},
		{"jobkey.cas.rides", "{read}", "Reads sent behind the EXEC of the batch before them, on its connection: a round trip saved each.", func(m jobkey.MetricsSnapshot) int64 { return m.Rides }},
	} {
		inst, err := meter.Int64ObservableCounter(c.name, metric.WithDescription(c.desc+" By queue, in this process."), metric.WithUnit(c.unit))
		if err != nil {
			return nil, err
		}
		cas = append(cas, counter{inst, c.get})
	}
	for _, c := range []struct {
		name, unit, desc string
		get              func(jobkey.MetricsSnapshot) int64
	}{
		{"jobkey.work.jobs_succeeded", "{job}", "Jobs completed by this process's Works.", func(m jobkey.MetricsSnapshot) int64 { return m.Succeeded }},
		{"jobkey.work.attempts_failed", "{attempt}", "Attempts that failed (an error, a panic, a timeout, a deadline), in this process's Works.", func(m jobkey.MetricsSnapshot) int64 { return m.AttemptsFailed }},
		{"jobkey.work.retries_scheduled", "{job}", "Failed attempts whose job was put back to run again under backoff.", func(m jobkey.MetricsSnapshot) int64 { return m.RetriesScheduled }},
		{"jobkey.work.jobs_failed", "{job}", "Jobs failed for good: no attempt left, or ErrSkipRetry.", func(m jobkey.MetricsSnapshot) int64 { return m.FailedForGood }},
		{"jobkey.work.jobs_canceled", "{job}", "Runs stopped because their job was canceled while it ran.", func(m jobkey.MetricsSnapshot) int64 { return m.Canceled }},
		{"jobkey.work.runs_released", "{run}", "Runs given back with their attempt unspent (shutdown, a claim that came too late).", func(m jobkey.MetricsSnapshot) int64 { return m.Released }},
		{"jobkey.work.runs_snoozed", "{run}", "Runs that snoozed: their job runs again later, their attempt unspent.", func(m jobkey.MetricsSnapshot) int64 { return m.Snoozed }},
		{"jobkey.work.jobs_prefetched", "{job}", "Jobs claimed ahead of free slots by this process's Works (WorkOpts.Prefetch).", func(m jobkey.MetricsSnapshot) int64 { return m.Prefetched }},
		{"jobkey.work.prefetch_returned", "{job}", "Jobs claimed ahead and given back unrun: no slot took them in time, or Work stopped.", func(m jobkey.MetricsSnapshot) int64 { return m.PrefetchReturned }},
		{"jobkey.writes.batch_callbacks", "{job}", "Batch callbacks and chain steps written by this process's transactions, enqueued or canceled by their condition.", func(m jobkey.MetricsSnapshot) int64 { return m.BatchCallbacks }},
		{"jobkey.writes.events", "{event}", "Events appended to the queue's streams by this process's transactions.", func(m jobkey.MetricsSnapshot) int64 { return m.EventsAppended }},
	} {
		inst, err := meter.Int64ObservableCounter(c.name, metric.WithDescription(c.desc+" By queue."), metric.WithUnit(c.unit))
		if err != nil {
			return nil, err
		}
		cas = append(cas, counter{inst, c.get})
	}
	runners, err := meter.Int64ObservableGauge("jobkey.work.runners",
		metric.WithDescription("Runners of this process's Works, busy (running a handler) or idle, by queue and state."), metric.WithUnit("{runner}"))
	if err != nil {
		return nil, err
	}
	insts := []metric.Observable{depth, paused, stuck, stuckHere, detected, runners}
	for _, c := range cas {
		insts = append(insts, c.inst)
	}
	queues = append([]*jobkey.Queue(nil), queues...)
	return meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		for _, q := range queues {
			queue := KeyQueue.String(q.Name())
			m := q.Metrics()
			for _, c := range cas {
				o.ObserveInt64(c.inst, c.get(m), metric.WithAttributes(queue))
			}
			o.ObserveInt64(stuckHere, m.StuckHandlers, metric.WithAttributes(queue))
			o.ObserveInt64(runners, m.BusyRunners, metric.WithAttributeSet(attribute.NewSet(queue, KeyState.String("busy"))))
			o.ObserveInt64(runners, max(m.Runners-m.BusyRunners, 0), metric.WithAttributeSet(attribute.NewSet(queue, KeyState.String("idle"))))
			o.ObserveInt64(detected, m.StuckDetected, metric.WithAttributes(queue))
			st, err := q.Stats(ctx)
			if err != nil {
				otel.Handle(fmt.Errorf("jobkeyotel: depth of queue %q: %w", q.Name(), err))
				continue
			}
			for _, s := range statesOf(st) {
				o.ObserveInt64(depth, s.n, metric.WithAttributeSet(attribute.NewSet(queue, KeyState.String(s.state))))
			}
			o.ObserveInt64(paused, int64(st.PausedShards), metric.WithAttributes(queue))
			o.ObserveInt64(stuck, st.StuckHandlers, metric.WithAttributes(queue))
		}
		return nil
	}, insts...)
}

type stateCount struct {
	state string
	n     int64
}

// statesOf lists the counts of Stats under the names of KeyState.
func statesOf(st jobkey.Stats) []stateCount {
	return []stateCount{
		{"pending", st.Pending}, {"due", st.Due}, {"scheduled", st.Scheduled},
		{"active", st.Active}, {"expired_leases", st.ExpiredLeases},
		{"succeeded", st.Succeeded}, {"failed", st.Failed}, {"canceled", st.Canceled},
		{"corrupt", st.Corrupt}, {"newer", st.Newer}, {"vanished", st.Vanished},
	}
}
