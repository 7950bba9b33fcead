package jobkeyotel

import (
	"context"
	"errors"
	"net/http"

	"github.com/jobkey/jobkey"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Prometheus serves the metrics of a MeterProvider of its own in
// Prometheus's text format: mount it at /metrics. It observes the queues
// given to NewPrometheus; pass MeterProvider to Middleware (with
// WithMeterProvider) to serve the handler metrics of this process too.
type Prometheus struct {
	http.Handler
	// MeterProvider feeds the handler. It is the program's to use, and
	// its to shut down when done with it.
	MeterProvider *sdkmetric.MeterProvider
}

// NewPrometheus builds a MeterProvider that exports to a Prometheus
// registry of its own (not the global one), observes the queues on it
// (see ObserveQueues), and returns it with the registry's HTTP handler.
// Each scrape reads every queue's Stats.
func NewPrometheus(queues ...*jobkey.Queue) (*Prometheus, error) {
	reg := prometheus.NewRegistry()
	mp, err := RegisterPrometheus(reg, queues...)
	if err != nil {
		return nil, err
	}
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
	return &Prometheus{Handler: h, MeterProvider: mp}, nil
}

// RegisterPrometheus builds a MeterProvider that exports to reg, a
// registry the program already serves (its own /metrics), and observes
// the queues on it (see ObserveQueues). Pass the MeterProvider to
// Middleware (WithMeterProvider) for the handler metrics too; shut it down
// when done with it. The series carry no otel_scope_* labels.
func RegisterPrometheus(reg prometheus.Registerer, queues ...*jobkey.Queue) (*sdkmetric.MeterProvider, error) {
	if reg == nil {
		return nil, errors.New("jobkeyotel: RegisterPrometheus with nil registerer")
	}
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	if _, err := ObserveQueues(mp.Meter(ScopeName), queues...); err != nil {
		_ = mp.Shutdown(context.Background())
		return nil, err
	}
	return mp, nil
}
