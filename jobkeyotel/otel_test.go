package jobkeyotel_test

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	jobkeyotel "github.com/jobkey/jobkey/jobkeyotel"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// seen holds the span context each handled job's ctx carried, by job ID.
var seen sync.Map

// handler succeeds for type "ok", fails for "bad", and panics for "boom".
var handler = jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
	seen.Store(j.ID, trace.SpanContextFromContext(ctx))
	switch j.Type {
	case "bad":
		return nil, errors.New("smtp: 550 no such user")
	case "boom":
		panic("handler bug")
	}
	return []byte("done"), nil
})

// The producer's span context travels in the job's Meta and comes out as
// the parent of the consumer's span, with the job's attributes and its
// outcome.
func TestTraceFromProducerToConsumer(t *testing.T) {
	t.Parallel()
	q := newQueue(t, "emails")
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	opts := []jobkeyotel.Option{jobkeyotel.WithTracerProvider(tp), jobkeyotel.WithPropagator(propagation.TraceContext{})}

	// Inject, by hand, under the caller's span.
	pctx, producer := tp.Tracer("test").Start(ctx, "signup")
	caller := &jobkey.EnqueueOpts{ID: "ok", MaxAttempts: 3, Meta: map[string]string{"tenant": "acme"}}
	in := jobkeyotel.Inject(pctx, caller, opts...)
	require.Equal(t, map[string]string{"tenant": "acme"}, caller.Meta, "the caller's map is not changed")
	require.Contains(t, in.Meta, "traceparent")
	require.Equal(t, "acme", in.Meta["tenant"])
	_, err := q.Enqueue(pctx, "ok", nil, in)
	require.NoError(t, err)
	producer.End()
	stored, err := q.Get(ctx, "ok")
	require.NoError(t, err)
	require.Equal(t, in.Meta, stored.Meta, "the trace context is stored with the job")

	// The Enqueue wrapper, which starts a producer span of its own.
	_, err = jobkeyotel.Enqueue(ctx, q, "bad", nil, &jobkey.EnqueueOpts{ID: "bad", MaxAttempts: 1}, opts...)
	require.NoError(t, err)
	// No trace context at all: a root span.
	_, err = q.Enqueue(ctx, "ok", nil, &jobkey.EnqueueOpts{ID: "orphan"})
	require.NoError(t, err)

	recorded, stop := work(t, q, jobkeyotel.Middleware(handler, opts...))
	jobs := waitRecorded(t, recorded, 3)
	stop()
	require.Equal(t, jobkey.StateSucceeded, jobs["ok"].State)
	require.Equal(t, jobkey.StateFailed, jobs["bad"].State)

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindConsumer {
			spans[s.Attributes()[0].Value.AsString()+"/"+attrs(s.Attributes())[jobkeyotel.KeyJobID].AsString()] = s
		} else {
			spans[s.Name()] = s
		}
	}
	ok := spans["jobkey/ok"]
	require.NotNil(t, ok, "a consumer span for job ok: %v", spans)
	require.Equal(t, "jobkey.work ok", ok.Name())
	require.Equal(t, producer.SpanContext().TraceID(), ok.Parent().TraceID())
	require.Equal(t, producer.SpanContext().SpanID(), ok.Parent().SpanID(), "the producer's span is the parent")
	require.True(t, ok.Parent().IsRemote())
	a := attrs(ok.Attributes())
	require.Equal(t, "emails", a[jobkeyotel.KeyQueue].AsString())
	require.Equal(t, "ok", a[jobkeyotel.KeyType].AsString())
	require.EqualValues(t, 1, a[jobkeyotel.KeyAttempt].AsInt64())
	require.EqualValues(t, 3, a[jobkeyotel.KeyMaxAttempts].AsInt64())
	require.Equal(t, jobkeyotel.OutcomeSucceeded, a[jobkeyotel.KeyOutcome].AsString())
	require.Equal(t, codes.Unset, ok.Status().Code)
	inHandler, _ := seen.Load("ok")
	require.Equal(t, ok.SpanContext(), inHandler, "the handler's ctx holds the consumer span")

	enq := spans["jobkey.enqueue bad"]
	require.NotNil(t, enq, "the wrapper's producer span: %v", spans)
	require.Equal(t, trace.SpanKindProducer, enq.SpanKind())
	require.Equal(t, "bad", attrs(enq.Attributes())[jobkeyotel.KeyJobID].AsString())
	bad := spans["jobkey/bad"]
	require.NotNil(t, bad)
	require.Equal(t, enq.SpanContext().SpanID(), bad.Parent().SpanID(), "the wrapper's span is the parent")
	require.Equal(t, enq.SpanContext().TraceID(), bad.SpanContext().TraceID())
	a = attrs(bad.Attributes())
	require.Equal(t, jobkeyotel.OutcomeFailed, a[jobkeyotel.KeyOutcome].AsString())
	require.EqualValues(t, 1, a[jobkeyotel.KeyMaxAttempts].AsInt64())
	require.Equal(t, codes.Error, bad.Status().Code)
	require.Equal(t, "smtp: 550 no such user", bad.Status().Description)
	require.Len(t, bad.Events(), 1, "the error is recorded")

	orphan := spans["jobkey/orphan"]
	require.NotNil(t, orphan)
	require.False(t, orphan.Parent().IsValid(), "no trace context: a root span")
	require.Equal(t, jobkeyotel.OutcomeSucceeded, attrs(orphan.Attributes())[jobkeyotel.KeyOutcome].AsString())
}

// Without a propagator, nothing is carried and nothing breaks.
func TestInjectWithoutPropagator(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("test").Start(context.Background(), "x")
	defer span.End()
	out := jobkeyotel.Inject(ctx, nil, jobkeyotel.WithPropagator(propagation.NewCompositeTextMapPropagator()))
	require.NotNil(t, out)
	require.Nil(t, out.Meta)
	out = jobkeyotel.Inject(ctx, nil, jobkeyotel.WithPropagator(propagation.TraceContext{}))
	require.Len(t, out.Meta, 1)
	require.True(t, strings.HasPrefix(out.Meta["traceparent"], "00-"+span.SpanContext().TraceID().String()+"-"))
}

// The processed counter, the duration histogram, the depth gauges and the
// compare-and-set counters read what happened.
func TestMetrics(t *testing.T) {
	t.Parallel()
	q := newQueue(t, "reports")
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	_, err := jobkeyotel.ObserveQueues(mp.Meter("test"), q)
	require.NoError(t, err)

	for _, s := range []jobkey.JobSpec{
		{Type: "ok"}, {Type: "ok"}, {Type: "ok"},
		{Type: "bad", Opts: &jobkey.EnqueueOpts{MaxAttempts: 1}},
		{Type: "boom", Opts: &jobkey.EnqueueOpts{MaxAttempts: 1}},
		{Type: "later", Opts: &jobkey.EnqueueOpts{Delay: time.Hour}},
	} {
		_, err := q.EnqueueMany(ctx, []jobkey.JobSpec{s})
		require.NoError(t, err)
	}
	m := collect(t, reader)
	depth := m["jobkey.queue.jobs"].Data.(metricdata.Gauge[int64])
	got := map[string]int64{}
	for _, dp := range depth.DataPoints {
		v, _ := dp.Attributes.Value(jobkeyotel.KeyQueue)
		require.Equal(t, "reports", v.AsString())
		s, _ := dp.Attributes.Value(jobkeyotel.KeyState)
		got[s.AsString()] = dp.Value
	}
	require.Equal(t, map[string]int64{"pending": 6, "due": 5, "scheduled": 1, "active": 0, "expired_leases": 0,
		"succeeded": 0, "failed": 0, "canceled": 0, "corrupt": 0, "newer": 0, "vanished": 0}, got)

	recorded, stop := work(t, q, jobkeyotel.Middleware(handler, jobkeyotel.WithMeterProvider(mp)))
	waitRecorded(t, recorded, 5)
	stop()

	m = collect(t, reader)
	processed := m["jobkey.jobs.processed"]
	require.Equal(t, "{job}", processed.Unit)
	sum := processed.Data.(metricdata.Sum[int64])
	require.True(t, sum.IsMonotonic)
	counts := map[attribute.Set]int64{}
	for _, dp := range sum.DataPoints {
		counts[dp.Attributes] = dp.Value
	}
	q1 := jobkeyotel.KeyQueue.String("reports")
	outcome := func(typ, o string) attribute.Set {
		return set(q1, jobkeyotel.KeyType.String(typ), jobkeyotel.KeyOutcome.String(o))
	}
	require.Equal(t, map[attribute.Set]int64{
		outcome("ok", jobkeyotel.OutcomeSucceeded): 3,
		outcome("bad", jobkeyotel.OutcomeFailed):   1,
		outcome("boom", jobkeyotel.OutcomePanic):   1,
	}, counts)

	dur := m["jobkey.job.duration"]
	require.Equal(t, "s", dur.Unit)
	hist := dur.Data.(metricdata.Histogram[float64])
	hcounts := map[attribute.Set]uint64{}
	for _, dp := range hist.DataPoints {
		hcounts[dp.Attributes] = dp.Count
		require.Greater(t, dp.Sum, 0.0)
		require.Less(t, dp.Sum, 10.0, "seconds, not nanoseconds")
	}
	require.Equal(t, map[attribute.Set]uint64{
		outcome("ok", jobkeyotel.OutcomeSucceeded): 3,
		outcome("bad", jobkeyotel.OutcomeFailed):   1,
		outcome("boom", jobkeyotel.OutcomePanic):   1,
	}, hcounts)

	depth = m["jobkey.queue.jobs"].Data.(metricdata.Gauge[int64])
	got = map[string]int64{}
	for _, dp := range depth.DataPoints {
		s, _ := dp.Attributes.Value(jobkeyotel.KeyState)
		got[s.AsString()] = dp.Value
	}
	require.Equal(t, int64(1), got["pending"])
	require.Equal(t, int64(1), got["scheduled"])
	require.Equal(t, int64(3), got["succeeded"])
	require.Equal(t, int64(2), got["failed"], "bad and boom, out of attempts")
	pausedShards := func() int64 {
		g := collect(t, reader)["jobkey.queue.paused_shards"].Data.(metricdata.Gauge[int64])
		require.Len(t, g.DataPoints, 1)
		require.Equal(t, set(jobkeyotel.KeyQueue.String("reports")), g.DataPoints[0].Attributes)
		return g.DataPoints[0].Value
	}
	require.Zero(t, pausedShards())
	require.NoError(t, q.Pause(ctx))
	require.EqualValues(t, 1, pausedShards(), "the queue's one shard")
	require.NoError(t, q.Resume(ctx))
	require.Zero(t, pausedShards())

	m = collect(t, reader)
	snap := q.Metrics()
	for name, want := range map[string]int64{
		"jobkey.cas.transactions": snap.Txns, "jobkey.cas.round_trips": snap.RoundTrips,
		"jobkey.cas.conflicts": snap.Conflicts, "jobkey.cas.commands": snap.Commands,
		"jobkey.cas.attempts": snap.Attempts, "jobkey.cas.unwatches": snap.Unwatches,
		"jobkey.cas.rides": snap.Rides,
	} {
		c, ok := m[name].Data.(metricdata.Sum[int64])
		require.True(t, ok, name)
		require.True(t, c.IsMonotonic, name)
		require.Len(t, c.DataPoints, 1, name)
		require.Equal(t, set(q1), c.DataPoints[0].Attributes, name)
		require.Equal(t, want, c.DataPoints[0].Value, "%s: nothing ran since the collection", name)
	}
	require.GreaterOrEqual(t, snap.Txns, int64(6+5), "the enqueues and the outcomes at least")
	// Two round trips per transaction, less one for each read that rode
	// behind the EXEC before it.
	require.GreaterOrEqual(t, snap.RoundTrips+snap.Rides, 2*snap.Txns)
}

// A handler that ignores its canceled context shows in the stuck gauges,
// of this process and of every process, and in the detections counter;
// the gauges drop when it returns.
func TestObserveQueuesReportsStuckHandlers(t *testing.T) {
	t.Parallel()
	q := newQueue(t, "stuck")
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	_, err := jobkeyotel.ObserveQueues(mp.Meter("test"), q)
	require.NoError(t, err)
	started, release := make(chan struct{}), make(chan struct{})
	returned := make(chan struct{})
	_, err = q.Enqueue(ctx, "stubborn", nil, &jobkey.EnqueueOpts{ID: "s"})
	require.NoError(t, err)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, jobkey.HandlerFunc(func(context.Context, *jobkey.Job) ([]byte, error) {
			close(started)
			<-release // ignores its context
			close(returned)
			return nil, nil
		}), &jobkey.WorkOpts{Concurrency: 1, StuckAfter: 100 * time.Millisecond, Logger: quiet, TrimInterval: -1})
	}()
	<-started
	_, err = q.Cancel(ctx, "s")
	require.NoError(t, err)

	q1 := set(jobkeyotel.KeyQueue.String("stuck"))
	// read returns the gauges of this process and of every process, and
	// the detections; -1 for an instrument that is missing or not shaped
	// as documented.
	read := func() [3]int64 {
		var rm metricdata.ResourceMetrics
		if reader.Collect(context.Background(), &rm) != nil {
			return [3]int64{-1, -1, -1}
		}
		m := map[string]metricdata.Metrics{}
		for _, sm := range rm.ScopeMetrics {
			for _, x := range sm.Metrics {
				m[x.Name] = x
			}
		}
		value := func(name string) int64 {
			var dps []metricdata.DataPoint[int64]
			switch d := m[name].Data.(type) {
			case metricdata.Gauge[int64]:
				dps = d.DataPoints
			case metricdata.Sum[int64]:
				if d.IsMonotonic {
					dps = d.DataPoints
				}
			}
			if len(dps) != 1 || dps[0].Attributes != q1 {
				return -1
			}
			return dps[0].Value
		}
		return [3]int64{value("jobkey.work.stuck_handlers"), value("jobkey.queue.stuck_handlers"), value("jobkey.work.stuck_detections")}
	}
	waitFor := func(want [3]int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		got := read()
		for got != want && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
			got = read()
		}
		require.Equal(t, want, got, "stuck here, stuck everywhere, detections")
	}
	waitFor([3]int64{1, 1, 1})
	close(release)
	<-returned
	waitFor([3]int64{0, 0, 1})
	stop()
	require.NoError(t, <-done)
}

// A canceled job's run is a cancellation, not a failure.
func TestOutcomeCanceled(t *testing.T) {
	t.Parallel()
	q := newQueue(t, "cancel")
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	started := make(chan struct{})
	h := jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	_, err := q.Enqueue(ctx, "slow", nil, &jobkey.EnqueueOpts{ID: "c"})
	require.NoError(t, err)
	_, stop := work(t, q, jobkeyotel.Middleware(h, jobkeyotel.WithTracerProvider(tp), jobkeyotel.WithMeterProvider(mp)))
	<-started
	_, err = q.Cancel(ctx, "c")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(rec.Ended()) == 1 }, 10*time.Second, 10*time.Millisecond)
	stop()
	a := attrs(rec.Ended()[0].Attributes())
	require.Equal(t, jobkeyotel.OutcomeCanceled, a[jobkeyotel.KeyOutcome].AsString())
	require.Equal(t, jobkey.ErrJobCanceled.Error(), a[jobkeyotel.KeyCause].AsString())
	sum := collect(t, reader)["jobkey.jobs.processed"].Data.(metricdata.Sum[int64])
	require.Len(t, sum.DataPoints, 1)
	o, _ := sum.DataPoints[0].Attributes.Value(jobkeyotel.KeyOutcome)
	require.Equal(t, jobkeyotel.OutcomeCanceled, o.AsString())
}

// A run stopped by its job's own Timeout is a failed attempt, as Work
// records it (the job is retried), not a cancellation; Work's counters say
// what became of the job.
func TestOutcomeOfARunPastItsTimeoutIsFailed(t *testing.T) {
	t.Parallel()
	q := newQueue(t, "timeout")
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	h := jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	_, err := q.Enqueue(ctx, "slow", nil, &jobkey.EnqueueOpts{ID: "t", Timeout: 50 * time.Millisecond, MaxAttempts: 2})
	require.NoError(t, err)
	_, stop := work(t, q, jobkeyotel.Middleware(h, jobkeyotel.WithTracerProvider(tp), jobkeyotel.WithMeterProvider(mp)))
	require.Eventually(t, func() bool { return len(rec.Ended()) >= 1 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return q.Metrics().AttemptsFailed >= 1 }, 10*time.Second, 10*time.Millisecond)
	stop()
	a := attrs(rec.Ended()[0].Attributes())
	require.Equal(t, jobkeyotel.OutcomeFailed, a[jobkeyotel.KeyOutcome].AsString())
	sum := collect(t, reader)["jobkey.jobs.processed"].Data.(metricdata.Sum[int64])
	o, _ := sum.DataPoints[0].Attributes.Value(jobkeyotel.KeyOutcome)
	require.Equal(t, jobkeyotel.OutcomeFailed, o.AsString())
	m := q.Metrics()
	require.Zero(t, m.Canceled)
	require.GreaterOrEqual(t, m.RetriesScheduled, int64(1), "its first attempt failed and was retried")
}

// The Prometheus handler serves the queue gauges, the compare-and-set
// counters and what the middleware records through its MeterProvider.
func TestPrometheus(t *testing.T) {
	t.Parallel()
	q := newQueue(t, "prom")
	ctx := context.Background()
	p, err := jobkeyotel.NewPrometheus(q)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.MeterProvider.Shutdown(context.Background()) })
	_, err = q.Enqueue(ctx, "ok", nil, nil)
	require.NoError(t, err)
	recorded, stop := work(t, q, jobkeyotel.Middleware(handler, jobkeyotel.WithMeterProvider(p.MeterProvider)))
	waitRecorded(t, recorded, 1)
	stop()
	_, err = q.Enqueue(ctx, "ok", nil, &jobkey.EnqueueOpts{Delay: time.Hour})
	require.NoError(t, err)

	srv := httptest.NewServer(p)
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	text := string(body)
	for _, want := range []string{
		`jobkey_queue_jobs{jobkey_queue="prom",jobkey_state="scheduled"`,
		`jobkey_queue_jobs{jobkey_queue="prom",jobkey_state="succeeded"`,
		`jobkey_jobs_processed_total{jobkey_job_type="ok",jobkey_outcome="succeeded",jobkey_queue="prom"`,
		`jobkey_job_duration_seconds_bucket{jobkey_job_type="ok",jobkey_outcome="succeeded",jobkey_queue="prom"`,
		`jobkey_cas_transactions_total{jobkey_queue="prom"`,
		`jobkey_cas_conflicts_total{jobkey_queue="prom"`,
		`jobkey_cas_round_trips_total{jobkey_queue="prom"`,
		`jobkey_cas_commands_total{jobkey_queue="prom"`,
		`jobkey_queue_paused_shards{jobkey_queue="prom"`,
		`jobkey_queue_stuck_handlers{jobkey_queue="prom"`,
		`jobkey_work_stuck_handlers{jobkey_queue="prom"`,
		`jobkey_work_stuck_detections_total{jobkey_queue="prom"`,
		`jobkey_work_jobs_succeeded_total{jobkey_queue="prom"} 1`,
		`jobkey_work_attempts_failed_total{jobkey_queue="prom"} 0`,
		`jobkey_work_retries_scheduled_total{jobkey_queue="prom"} 0`,
		`jobkey_work_jobs_failed_total{jobkey_queue="prom"} 0`,
		`jobkey_work_jobs_canceled_total{jobkey_queue="prom"} 0`,
		`jobkey_work_runs_released_total{jobkey_queue="prom"} 0`,
		`jobkey_work_runners{jobkey_queue="prom",jobkey_state="busy"} 0`,
		`jobkey_work_runners{jobkey_queue="prom",jobkey_state="idle"} 0`,
	} {
		require.Contains(t, text, want)
	}
	require.NotContains(t, text, "otel_scope_", "no empty scope labels on the series")
	require.Contains(t, text, `jobkey_queue_jobs{jobkey_queue="prom",jobkey_state="scheduled"} 1`+"\n")
	require.Contains(t, text, `jobkey_jobs_processed_total{jobkey_job_type="ok",jobkey_outcome="succeeded",jobkey_queue="prom"} 1`+"\n")
}

func TestMiddlewareOfNil(t *testing.T) {
	t.Parallel()
	q := newQueue(t, "nil")
	require.Nil(t, jobkeyotel.Middleware(nil))
	require.ErrorIs(t, q.Work(context.Background(), jobkeyotel.Middleware(nil), nil), jobkey.ErrInvalid)
}

// A job whose Meta holds a broken or hostile trace context runs under a
// root span; nothing panics.
func TestMiddlewareHostileMeta(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	h := jobkeyotel.Middleware(handler, jobkeyotel.WithTracerProvider(tp),
		jobkeyotel.WithPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})))
	for i, meta := range []map[string]string{
		nil,
		{"traceparent": "00-00000000000000000000000000000000-0000000000000000-01"},
		{"traceparent": "zz-" + strings.Repeat("f", 3000), "tracestate": strings.Repeat(",=", 500), "baggage": "%%%;;=="},
		{"traceparent": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	} {
		_, err := h.Work(context.Background(), &jobkey.Job{ID: "x", Queue: "q", Type: "ok", Meta: meta})
		require.NoError(t, err, i)
	}
	require.Len(t, rec.Ended(), 4)
	for _, s := range rec.Ended() {
		require.False(t, s.Parent().IsValid(), "no valid parent in %v", s.Attributes())
	}
}

func TestObserveQueuesRefuses(t *testing.T) {
	t.Parallel()
	mp := sdkmetric.NewMeterProvider()
	_, err := jobkeyotel.ObserveQueues(nil)
	require.Error(t, err)
	_, err = jobkeyotel.ObserveQueues(mp.Meter("x"), nil)
	require.Error(t, err)
}
