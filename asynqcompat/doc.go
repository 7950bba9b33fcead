// Package asynqcompat lets a team move one job type at a time from asynq
// (github.com/hibiken/asynq) to jobkey, beside the asynq servers it runs
// today. It lives in its own module so that asynq's dependency never enters
// the jobkey library module.
//
// It has four parts:
//
//   - Handler and HandlerFunc run an unchanged asynq.Handler as a
//     jobkey.Handler.
//   - Client enqueues each task type to jobkey or to asynq by a per-type
//     route, with asynq.Client's Enqueue and EnqueueContext, so call sites
//     keep their code; every asynq.Option is mapped (ProcessAt, ProcessIn,
//     TaskID, MaxRetry, Queue, Timeout, Deadline, Retention) or refused
//     with an *OptionError (Unique, Group), never dropped.
//   - Migrate moves asynq's waiting tasks (pending, scheduled, retry) of one
//     type into a jobkey queue, with their ID, payload, run time, remaining
//     retries, Timeout, Deadline and Retention: each task is enqueued
//     into jobkey under its asynq task ID first, and only then deleted
//     from asynq, so an interrupted run is rerun safely.
//   - MigrateToAsynq moves a type's pending jobs back, in the same order,
//     with their Timeout, Deadline and Retention, for a rollback.
//   - One migration of an asynq queue runs at a time, in either direction:
//     a run holds the queue's migration lock in Redis, and a second one
//     refuses to start with ErrMigrationRunning.
//
// docs/adopting.md walks through moving one type in five steps.
package asynqcompat
