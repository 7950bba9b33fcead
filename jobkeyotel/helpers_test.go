package jobkeyotel_test

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func TestMain(m *testing.M) { redistest.Main(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newQueue is a queue on the shared real Redis, under a prefix of the
// test's own.
func newQueue(t *testing.T, name string) *jobkey.Queue {
	t.Helper()
	redistest.RequireReal(t)
	q, err := jobkey.NewQueue(redistest.Client(t, nil), name, &jobkey.Config{Prefix: redistest.Prefix(t), Logger: quiet})
	require.NoError(t, err)
	return q
}

// work runs q.Work with h until the returned stop is called (also at the
// test's end). recorded receives every outcome write.
func work(t *testing.T, q *jobkey.Queue, h jobkey.Handler) (recorded <-chan *jobkey.Job, stop func()) {
	t.Helper()
	ch := make(chan *jobkey.Job, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- q.Work(ctx, h, &jobkey.WorkOpts{Concurrency: 2, Logger: quiet, TrimInterval: -1,
			OnRecorded: func(j *jobkey.Job, err error) {
				if err == nil {
					ch <- j
				}
			}})
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("Work did not return")
			}
		})
	}
	t.Cleanup(stop)
	return ch, stop
}

// waitRecorded waits for n outcome writes and returns the jobs by ID.
func waitRecorded(t *testing.T, ch <-chan *jobkey.Job, n int) map[string]*jobkey.Job {
	t.Helper()
	got := map[string]*jobkey.Job{}
	timeout := time.After(20 * time.Second)
	for len(got) < n {
		select {
		case j := <-ch:
			got[j.ID] = j
		case <-timeout:
			t.Fatalf("only %d of %d jobs recorded", len(got), n)
		}
	}
	return got
}

func attrs(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

func collect(t *testing.T, r sdkmetric.Reader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

func set(kvs ...attribute.KeyValue) attribute.Set { return attribute.NewSet(kvs...) }

// exampleQueue is a queue on the test suite's Redis, under a prefix of its
// own; in your code, your client and your queue.
func exampleQueue(name string) (*jobkey.Queue, func()) {
	t, err := redistest.SharedTarget()
	if err != nil {
		panic(err)
	}
	opt, err := redis.ParseURL(t.URL)
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(opt)
	q, err := jobkey.NewQueue(rdb, name, &jobkey.Config{Prefix: "example-otel-" + jobkey.NewID(), Logger: quiet})
	if err != nil {
		panic(err)
	}
	return q, func() { rdb.Close() }
}
