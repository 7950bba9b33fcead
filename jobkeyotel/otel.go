package jobkeyotel

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of this package's tracer and
// meter.
const ScopeName = "github.com/jobkey/jobkey/jobkeyotel"

// Attribute keys of the spans and metrics.
const (
	KeyQueue       = attribute.Key("jobkey.queue")            // the queue's name
	KeyType        = attribute.Key("jobkey.job.type")         // the job's Type
	KeyJobID       = attribute.Key("jobkey.job.id")           // the job's ID (spans only)
	KeyAttempt     = attribute.Key("jobkey.job.attempt")      // the attempt being run, from 1 (spans only)
	KeyMaxAttempts = attribute.Key("jobkey.job.max_attempts") // attempts allowed (spans only)
	KeyOutcome     = attribute.Key("jobkey.outcome")          // one of the Outcome* values
	KeyState       = attribute.Key("jobkey.state")            // a state of Stats (queue depth gauge)
	KeyCause       = attribute.Key("jobkey.cancel.cause")     // why a canceled run was stopped (spans only)
)

// Outcomes of a handled job, the values of KeyOutcome.
const (
	// OutcomeSucceeded: the handler returned no error.
	OutcomeSucceeded = "succeeded"
	// OutcomeFailed: the attempt failed: the handler returned an error,
	// or ran past the job's Timeout or Deadline. The job is retried if it
	// has attempts left and the error does not wrap jobkey.ErrSkipRetry.
	OutcomeFailed = "failed"
	// OutcomeCanceled: the run was stopped from outside (the job was
	// canceled, its lease lost or not renewed in time, or shutdown's grace
	// ran out) and the handler did not succeed before; KeyCause says why.
	// A run stopped by the job's own Timeout is a failed attempt.
	OutcomeCanceled = "canceled"
	// OutcomePanic: the handler panicked. The panic goes on to Work, which
	// fails the attempt with it.
	OutcomePanic = "panic"
)

// Option configures Middleware, Inject, Enqueue and ObserveQueues.
type Option func(*config)

type config struct {
	tp   trace.TracerProvider
	mp   metric.MeterProvider
	prop propagation.TextMapPropagator
}

func newConfig(opts []Option) config {
	c := config{tp: otel.GetTracerProvider(), mp: otel.GetMeterProvider(), prop: otel.GetTextMapPropagator()}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// WithTracerProvider sets where spans go (default: otel.GetTracerProvider()).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) {
		if tp != nil {
			c.tp = tp
		}
	}
}

// WithMeterProvider sets where measurements go (default:
// otel.GetMeterProvider()).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) {
		if mp != nil {
			c.mp = mp
		}
	}
}

// WithPropagator sets how trace context is written into and read from a
// job's Meta (default: otel.GetTextMapPropagator(), which carries nothing
// until the program sets one).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) {
		if p != nil {
			c.prop = p
		}
	}
}

func (c config) tracer() trace.Tracer { return c.tp.Tracer(ScopeName) }

func (c config) meter() metric.Meter { return c.mp.Meter(ScopeName) }
