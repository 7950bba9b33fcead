package jobkeyotel_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/jobkey/jobkey"
	jobkeyotel "github.com/jobkey/jobkey/jobkeyotel"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// A producer enqueues under its request's span; the worker's span for the
// job is a child of it, in the same trace.
func ExampleMiddleware() {
	q, done := exampleQueue("emails")
	defer done()

	// In a program: the TracerProvider of your exporter, and the W3C
	// propagator (or otel.SetTracerProvider and otel.SetTextMapPropagator
	// once, and no options). Here a recorder keeps the spans to print.
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	opts := []jobkeyotel.Option{jobkeyotel.WithTracerProvider(tp), jobkeyotel.WithPropagator(propagation.TraceContext{})}

	// The producer.
	ctx, request := tp.Tracer("web").Start(context.Background(), "POST /signup")
	if _, err := jobkeyotel.Enqueue(ctx, q, "send-welcome", []byte(`{"to":"a@example.com"}`), nil, opts...); err != nil {
		panic(err)
	}
	request.End()

	// The worker: it stops after one job, for the example's sake.
	wctx, stop := context.WithCancel(context.Background())
	h := jobkeyotel.Middleware(jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
		defer stop()
		return nil, nil // send the email
	}), opts...)
	if err := q.Work(wctx, h, &jobkey.WorkOpts{Concurrency: 1, Logger: quiet}); err != nil {
		panic(err)
	}

	for _, s := range spans.Ended() {
		fmt.Printf("%-28s %-9s same trace: %v\n", s.Name(), s.SpanKind(), s.SpanContext().TraceID() == request.SpanContext().TraceID())
	}
	// Output:
	// jobkey.enqueue send-welcome  producer  same trace: true
	// POST /signup                 internal  same trace: true
	// jobkey.work send-welcome     consumer  same trace: true
}

// Inject puts the trace context into EnqueueOpts, for Queue.Enqueue or a
// batch of EnqueueMany.
func ExampleInject() {
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("importer").Start(context.Background(), "import")
	defer span.End()
	opts := jobkeyotel.Inject(ctx, &jobkey.EnqueueOpts{MaxAttempts: 3}, jobkeyotel.WithPropagator(propagation.TraceContext{}))
	batch := []jobkey.JobSpec{{Type: "resize", Payload: []byte("a.png"), Opts: opts}}
	fmt.Println(len(batch), "job; traceparent carries the trace:", strings.Contains(opts.Meta["traceparent"], span.SpanContext().TraceID().String()))
	// Output: 1 job; traceparent carries the trace: true
}

// NewPrometheus serves the queues' metrics at /metrics; a worker passes
// its MeterProvider to Middleware to serve its handler metrics too.
func ExampleNewPrometheus() {
	q, done := exampleQueue("reports")
	defer done()
	p, err := jobkeyotel.NewPrometheus(q)
	if err != nil {
		panic(err)
	}
	defer p.MeterProvider.Shutdown(context.Background())
	mux := http.NewServeMux()
	mux.Handle("/metrics", p)
	srv := httptest.NewServer(mux) // in a program: http.ListenAndServe
	defer srv.Close()

	if _, err := q.Enqueue(context.Background(), "monthly", nil, nil); err != nil {
		panic(err)
	}
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(body), "\n") {
		if strings.HasPrefix(line, `jobkey_queue_jobs{jobkey_queue="reports",jobkey_state="pending"`) {
			fmt.Println("pending:", line[strings.LastIndex(line, " ")+1:])
		}
	}
	// Output: pending: 1
}

// RegisterPrometheus puts the queues' metrics on a registry the program
// already serves, beside its own, with no otel_scope_* labels.
func ExampleRegisterPrometheus() {
	q, done := exampleQueue("invoices")
	defer done()
	reg := prometheus.NewRegistry() // the program's own, served at its /metrics
	mp, err := jobkeyotel.RegisterPrometheus(reg, q)
	if err != nil {
		panic(err)
	}
	defer mp.Shutdown(context.Background())
	// A worker passes mp to Middleware for its handler metrics:
	// q.Work(ctx, jobkeyotel.Middleware(h, jobkeyotel.WithMeterProvider(mp)), nil)

	if _, err := q.Enqueue(context.Background(), "monthly", nil, nil); err != nil {
		panic(err)
	}
	families, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, f := range families {
		if f.GetName() != "jobkey_queue_jobs" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["jobkey_state"] == "pending" {
				fmt.Println("pending:", m.GetGauge().GetValue(), "labels:", len(labels))
			}
		}
	}
	// Output: pending: 1 labels: 2
}
