// Package jobkeyotel traces and measures jobkey queues with OpenTelemetry.
//
// It lives in its own module, so the jobkey module keeps its dependencies:
// only programs that import this package depend on OpenTelemetry.
//
//   - Producers call Enqueue (or put Inject's options into Queue.Enqueue):
//     the producer's span context goes into the job's Meta, through the
//     configured propagator (default: otel.GetTextMapPropagator(); set
//     otel.SetTextMapPropagator(propagation.TraceContext{}) or pass
//     WithPropagator, else nothing is carried).
//   - Workers wrap their handler in Middleware: each handled job gets a
//     consumer span whose parent is the producer's span, and counts in the
//     processed-jobs counter and the handler-duration histogram.
//   - ObserveQueues reports queue depth and stuck handlers from
//     Queue.Stats, and the compare-and-set counters and this process's
//     stuck handlers from Queue.Metrics, as observable
//     instruments; NewPrometheus serves them, and whatever else is recorded
//     through its MeterProvider, as a Prometheus /metrics endpoint, and
//     RegisterPrometheus puts them on the program's own registry.
//
// Instruments (Prometheus names in brackets, with the default exporter):
//
//	jobkey.jobs.processed       counter, {job}  [jobkey_jobs_processed_total]   queue, type, outcome
//	jobkey.job.duration         histogram, s    [jobkey_job_duration_seconds]   queue, type, outcome
//	jobkey.queue.jobs           gauge, {job}    [jobkey_queue_jobs]             queue, state
//	jobkey.queue.paused_shards  gauge, {shard}  [jobkey_queue_paused_shards]    queue
//	jobkey.queue.stuck_handlers gauge, {handler} [jobkey_queue_stuck_handlers]  queue
//	jobkey.cas.transactions     counter, {txn}  [jobkey_cas_transactions_total] queue
//	jobkey.cas.attempts         counter         [jobkey_cas_attempts_total]     queue
//	jobkey.cas.conflicts        counter         [jobkey_cas_conflicts_total]    queue
//	jobkey.cas.round_trips      counter         [jobkey_cas_round_trips_total]  queue
//	jobkey.cas.commands         counter         [jobkey_cas_commands_total]     queue
//	jobkey.cas.unwatches        counter         [jobkey_cas_unwatches_total]    queue
//	jobkey.work.stuck_handlers  gauge, {handler} [jobkey_work_stuck_handlers]   queue
//	jobkey.work.stuck_detections counter, {handler} [jobkey_work_stuck_detections_total] queue
//	jobkey.writes.batch_callbacks counter, {job} [jobkey_writes_batch_callbacks_total] queue
//	jobkey.writes.events        counter, {event} [jobkey_writes_events_total]   queue
//	jobkey.work.jobs_succeeded    counter, {job}     [jobkey_work_jobs_succeeded_total]    queue
//	jobkey.work.attempts_failed   counter, {attempt} [jobkey_work_attempts_failed_total]   queue
//	jobkey.work.retries_scheduled counter, {job}     [jobkey_work_retries_scheduled_total] queue
//	jobkey.work.jobs_failed       counter, {job}     [jobkey_work_jobs_failed_total]       queue
//	jobkey.work.jobs_canceled     counter, {job}     [jobkey_work_jobs_canceled_total]     queue
//	jobkey.work.runs_released     counter, {run}     [jobkey_work_runs_released_total]     queue
//	jobkey.work.runners           gauge, {runner}    [jobkey_work_runners]                 queue, state (busy, idle)
//
// jobkey.jobs.processed counts runs by what the handler did (a run past
// its Timeout is a failed attempt); the jobkey.work.* counters count what
// Work recorded of each job: a failed attempt is either a retry scheduled
// or a job failed for good. The Prometheus series carry no otel_scope_*
// labels; RegisterPrometheus puts them on a registry the program already
// serves.
//
// The attribute keys are the Key* constants; outcomes are the Outcome*
// constants.
package jobkeyotel
