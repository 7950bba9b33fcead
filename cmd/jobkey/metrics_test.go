package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/jobkey/jobkey/jobkeyotel"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// scrape GETs h's metrics and parses them with Prometheus's own parser,
// which fails on anything a Prometheus server would not read.
func scrape(t *testing.T, h http.Handler) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	require.NoError(t, err, "%s", body)
	return fams, string(body)
}

// sample is one parsed sample: family, type, help, labels and value.
type sample struct {
	family, kind, help, labels string
	value                      float64
}

// samples flattens families into their samples, leaving out the labels
// and the family (target_info) that only the OpenTelemetry exporter adds.
func samples(fams map[string]*dto.MetricFamily) map[string]sample {
	out := map[string]sample{}
	for name, f := range fams {
		if name == "target_info" {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				if !strings.HasPrefix(l.GetName(), "otel_scope_") {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
			}
			v := m.GetGauge().GetValue()
			if f.GetType() == dto.MetricType_COUNTER {
				v = m.GetCounter().GetValue()
			}
			s := sample{family: name, kind: f.GetType().String(), help: f.GetHelp(), labels: strings.Join(labels, ","), value: v}
			out[name+"{"+s.labels+"}"] = s
		}
	}
	return out
}

// The command's /metrics serves what jobkeyotel's Prometheus exporter
// serves for the same queues (the same names, types, help texts, labels
// and values, without the exporter's otel_scope_* labels and target_info),
// so a scrape config or a dashboard works with either.
func TestQueueMetricsServeWhatJobkeyotelServes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	prefix := redistest.Prefix(t)
	open := func(name string) *jobkey.Queue {
		q, err := jobkey.NewQueue(rdb, name, &jobkey.Config{Prefix: prefix})
		require.NoError(t, err)
		return q
	}
	alpha, beta := open("alpha"), open("beta")
	for range 3 { // one to succeed, one to fail for good, one pending
		_, err := alpha.Enqueue(ctx, "mail", nil, &jobkey.EnqueueOpts{MaxAttempts: 1})
		require.NoError(t, err)
	}
	_, err := alpha.Enqueue(ctx, "mail", nil, &jobkey.EnqueueOpts{Delay: time.Hour})
	require.NoError(t, err)
	j, err := alpha.Claim(ctx, "w1")
	require.NoError(t, err)
	_, err = alpha.Complete(ctx, j, nil)
	require.NoError(t, err)
	j, err = alpha.Claim(ctx, "w1")
	require.NoError(t, err)
	_, err = alpha.Fail(ctx, j, errors.New("boom"))
	require.NoError(t, err)
	_, err = beta.Enqueue(ctx, "bill", nil, nil)
	require.NoError(t, err)
	require.NoError(t, beta.Pause(ctx))

	ours, text := scrape(t, newQueueMetrics(slog.New(slog.DiscardHandler), beta, alpha))
	prom, err := jobkeyotel.NewPrometheus(alpha, beta)
	require.NoError(t, err)
	t.Cleanup(func() { _ = prom.MeterProvider.Shutdown(context.Background()) })
	theirs, _ := scrape(t, prom)
	require.Equal(t, samples(theirs), samples(ours))

	// The values are the queues', not zeros that agree.
	got := samples(ours)
	require.EqualValues(t, 2, got["jobkey_queue_jobs{jobkey_queue=alpha,jobkey_state=pending}"].value, "due and scheduled")
	require.EqualValues(t, 1, got["jobkey_queue_jobs{jobkey_queue=alpha,jobkey_state=due}"].value)
	require.EqualValues(t, 1, got["jobkey_queue_jobs{jobkey_queue=alpha,jobkey_state=scheduled}"].value)
	require.EqualValues(t, 1, got["jobkey_queue_jobs{jobkey_queue=alpha,jobkey_state=succeeded}"].value)
	require.EqualValues(t, 1, got["jobkey_queue_jobs{jobkey_queue=alpha,jobkey_state=failed}"].value)
	require.EqualValues(t, 1, got["jobkey_queue_jobs{jobkey_queue=beta,jobkey_state=pending}"].value)
	require.Positive(t, got["jobkey_queue_paused_shards{jobkey_queue=beta}"].value)
	require.Positive(t, got["jobkey_cas_transactions_total{jobkey_queue=alpha}"].value)
	require.Equal(t, "COUNTER", got["jobkey_cas_transactions_total{jobkey_queue=alpha}"].kind)
	require.Less(t, strings.Index(text, `jobkey_queue="alpha"`), strings.Index(text, `jobkey_queue="beta"`), "queues in order of name")
}

// A queue whose Stats fails has no gauges of Stats in that scrape, and
// the error is logged; its counters and the other queues' metrics are
// served.
func TestQueueMetricsLeaveOutAQueueWhoseStatsFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	prefix := redistest.Prefix(t)
	good, err := jobkey.NewQueue(rdb, "good", &jobkey.Config{Prefix: prefix})
	require.NoError(t, err)
	_, err = good.Enqueue(ctx, "mail", nil, nil)
	require.NoError(t, err)
	// A client that no longer reaches Redis makes every Stats fail.
	down := redistest.Client(t, nil)
	bad, err := jobkey.NewQueue(down, "bad", &jobkey.Config{Prefix: prefix})
	require.NoError(t, err)
	require.NoError(t, down.Close())

	var logged syncBuffer
	fams, _ := scrape(t, newQueueMetrics(slog.New(slog.NewTextHandler(&logged, nil)), good, bad))
	got := samples(fams)
	require.EqualValues(t, 1, got["jobkey_queue_jobs{jobkey_queue=good,jobkey_state=pending}"].value)
	require.Contains(t, got, "jobkey_cas_transactions_total{jobkey_queue=bad}")
	for key := range got {
		if strings.HasPrefix(key, "jobkey_queue_") {
			require.NotContains(t, key, "jobkey_queue=bad", "no depth read, none served")
		}
	}
	require.Contains(t, logged.String(), "queue=bad")
	require.Contains(t, logged.String(), "no depth")
}

// A label value is escaped as the text format requires, so a queue name
// cannot forge a sample or break the scrape.
func TestEscapeLabel(t *testing.T) {
	t.Parallel()
	require.Equal(t, `a\\b\"c\nd`, escapeLabel("a\\b\"c\nd"))
}
