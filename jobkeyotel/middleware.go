package jobkeyotel

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobkey/jobkey"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// durationBuckets are the histogram's bounds, in seconds: from 5ms to 10
// minutes, for handlers that take anything from a cache write to a report.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

type middleware struct {
	next      jobkey.Handler
	cfg       config
	tracer    trace.Tracer
	processed metric.Int64Counter
	duration  metric.Float64Histogram
}

// Middleware wraps a Work handler so that every job it handles gets a span
// and is counted.
//
// The span, named "jobkey.work <type>" and of kind consumer, is a child of
// the span whose context the producer put into the job's Meta (see Inject
// and Enqueue); without one it starts a trace of its own. It carries the
// queue, type, job ID, attempt, max attempts and outcome (KeyOutcome), and
// ends when the handler returns. The handler's ctx holds the span.
//
// Each run adds one to jobkey.jobs.processed and its handler's run time,
// in seconds, to jobkey.job.duration, both by queue, type and the run's
// outcome (KeyOutcome): what the handler did, not what became of the job.
// What Work recorded of the job (a retry scheduled, a job failed for good)
// is counted by ObserveQueues from Queue.Metrics.
//
// A nil next gives a nil Handler, which Work refuses with ErrInvalid.
func Middleware(next jobkey.Handler, opts ...Option) jobkey.Handler {
	if next == nil {
		return nil
	}
	cfg := newConfig(opts)
	m := &middleware{next: next, cfg: cfg, tracer: cfg.tracer()}
	meter := cfg.meter()
	var err1, err2 error
	m.processed, err1 = meter.Int64Counter("jobkey.jobs.processed",
		metric.WithDescription("Jobs handled, by queue, type and outcome."), metric.WithUnit("{job}"))
	m.duration, err2 = meter.Float64Histogram("jobkey.job.duration",
		metric.WithDescription("How long handlers ran, by queue, type and outcome."), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	if err := errors.Join(err1, err2); err != nil {
		otel.Handle(err) // the instruments still work, as no-ops if need be
	}
	return m
}

// Work runs the job under its span and records its outcome.
func (m *middleware) Work(ctx context.Context, j *jobkey.Job) (result []byte, err error) {
	parent := m.cfg.prop.Extract(ctx, propagation.MapCarrier(j.Meta))
	ctx, span := m.tracer.Start(parent, "jobkey.work "+j.Type,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "jobkey"),
			KeyQueue.String(j.Queue), KeyType.String(j.Type), KeyJobID.String(j.ID),
			KeyAttempt.Int(j.Attempt), KeyMaxAttempts.Int(j.MaxAttempts),
		))
	start := time.Now()
	panicked := true
	defer func() {
		outcome := OutcomePanic
		if !panicked {
			outcome = outcomeOf(ctx, err)
		}
		switch outcome {
		case OutcomeSucceeded:
		case OutcomeCanceled:
			span.SetAttributes(KeyCause.String(fmt.Sprint(context.Cause(ctx))))
			if err != nil {
				span.RecordError(err)
			}
		case OutcomePanic:
			span.SetStatus(codes.Error, "handler panicked")
		default:
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.SetAttributes(KeyOutcome.String(outcome))
		span.End()
		// The measurements must not be lost with the handler's ctx, which
		// may be canceled by now.
		mctx := context.WithoutCancel(ctx)
		set := metric.WithAttributeSet(attribute.NewSet(KeyQueue.String(j.Queue), KeyType.String(j.Type), KeyOutcome.String(outcome)))
		m.processed.Add(mctx, 1, set)
		m.duration.Record(mctx, time.Since(start).Seconds(), set)
	}()
	result, err = m.next.Work(ctx, j)
	panicked = false
	return result, err
}

// outcomeOf judges a run as Work will: a run stopped because the job was
// canceled or its lease lost is canceled whatever the handler returned; a
// success otherwise stands; an error after the job's own Timeout or
// Deadline ran out is a failed attempt, as Work records it (the job is
// retried under backoff); an error after a stop from outside (shutdown, a
// lease not renewed) is a cancellation; any other error is a failure.
func outcomeOf(ctx context.Context, err error) string {
	cause := context.Cause(ctx)
	switch {
	case errors.Is(cause, jobkey.ErrLeaseLost), errors.Is(cause, jobkey.ErrJobCanceled):
		return OutcomeCanceled
	case err == nil:
		return OutcomeSucceeded
	case errors.Is(cause, jobkey.ErrTimeout), errors.Is(cause, jobkey.ErrDeadline):
		return OutcomeFailed
	case cause != nil:
		return OutcomeCanceled
	}
	return OutcomeFailed
}
