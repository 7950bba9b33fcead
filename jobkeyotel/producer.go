package jobkeyotel

import (
	"context"
	"errors"
	"maps"

	"github.com/jobkey/jobkey"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Inject returns a copy of opts (nil means the defaults) whose Meta also
// holds the trace context of ctx's span, written by the configured
// propagator: traceparent and tracestate with the W3C propagator. The
// caller's opts and its Meta map are not changed. Pass the result to
// Queue.Enqueue, or as a JobSpec's Opts; Middleware makes the span it
// names the parent of the job's consumer span.
func Inject(ctx context.Context, opts *jobkey.EnqueueOpts, options ...Option) *jobkey.EnqueueOpts {
	return inject(ctx, newConfig(options), opts)
}

func inject(ctx context.Context, cfg config, opts *jobkey.EnqueueOpts) *jobkey.EnqueueOpts {
	var out jobkey.EnqueueOpts
	if opts != nil {
		out = *opts
	}
	carrier := propagation.MapCarrier{}
	cfg.prop.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return &out
	}
	meta := make(map[string]string, len(out.Meta)+len(carrier))
	maps.Copy(meta, out.Meta)
	maps.Copy(meta, carrier)
	out.Meta = meta
	return &out
}

// Enqueue enqueues a job under a producer span, "jobkey.enqueue <type>",
// and carries that span's context into the job (see Inject), so the
// job's consumer span is its child. It returns what q.Enqueue returns. An
// ID that is taken (jobkey.ErrJobExists) is not a span error: the span
// names the stored job.
func Enqueue(ctx context.Context, q *jobkey.Queue, typ string, payload []byte, opts *jobkey.EnqueueOpts, options ...Option) (*jobkey.Job, error) {
	cfg := newConfig(options)
	ctx, span := cfg.tracer().Start(ctx, "jobkey.enqueue "+typ,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(KeyQueue.String(q.Name()), KeyType.String(typ)))
	defer span.End()
	j, err := q.Enqueue(ctx, typ, payload, inject(ctx, cfg, opts))
	if j != nil {
		span.SetAttributes(KeyJobID.String(j.ID))
	}
	if err != nil && !errors.Is(err, jobkey.ErrJobExists) {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return j, err
}
