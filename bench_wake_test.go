package jobkey_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkWakeLatency measures enqueue-to-start latency with idle workers:
// the time from Enqueue's call to the handler starting. Idle workers wait
// for the wake-up hint the enqueue publishes, not for a poll (the poll here
// is an hour long).
func BenchmarkWakeLatency(b *testing.B) {
	url := redistest.RequireReal(b).URL
	opt, err := redis.ParseURL(url)
	if err != nil {
		b.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "wake", &jobkey.Config{Prefix: "bench-wake-" + jobkey.NewID()})
	if err != nil {
		b.Fatal(err)
	}
	started := make(chan time.Time, 1)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = q.Work(ctx, jobkey.HandlerFunc(func(context.Context, *jobkey.Job) ([]byte, error) {
			started <- time.Now()
			return nil, nil
		}), &jobkey.WorkOpts{Concurrency: 4, PollInterval: time.Hour})
	}()
	defer func() { stop(); <-done }()
	time.Sleep(200 * time.Millisecond) // workers idle and subscribed

	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		if _, err := q.Enqueue(context.Background(), "t", nil, nil); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, (<-started).Sub(t0))
		time.Sleep(2 * time.Millisecond) // let the worker go idle again
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2])/1e6, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100])/1e6, "p99-ms")
}
