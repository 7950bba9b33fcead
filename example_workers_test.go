package jobkey_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jobkey/jobkey"
)

// Workers lists the Works running on a queue, in every process: each
// reports itself in one value with a TTL, so a process that dies drops off
// the list by itself within a Lease.
func ExampleQueue_Workers() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "emails", exampleConfig("workers"))
	if err != nil {
		panic(err)
	}
	running, release := make(chan struct{}), make(chan struct{})
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		done <- q.Work(wctx, jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
			close(running)
			<-release
			return nil, nil
		}), &jobkey.WorkOpts{Name: "mailer-1", Concurrency: 4,
			Periodic: []jobkey.PeriodicJob{{Name: "digest", Schedule: jobkey.Every(24 * time.Hour), Type: "digest"}}})
	}()
	if _, err := q.Enqueue(ctx, "welcome", nil, &jobkey.EnqueueOpts{ID: "welcome-ada"}); err != nil {
		panic(err)
	}
	<-running
	for {
		ws, err := q.Workers(ctx)
		if err != nil {
			panic(err)
		}
		if len(ws) == 1 && ws[0].Busy == 1 { // the report follows a run within a second
			w := ws[0]
			fmt.Printf("%s: %d of %d slots busy, running %s\n", w.Name, w.Busy, w.Slots, w.Running[0].ID)
			fmt.Printf("schedule %s (%s), next tick in under a day: %v\n", w.Schedules[0].Name, w.Schedules[0].Spec,
				w.Schedules[0].NextTick.Sub(w.SeenAt) <= 24*time.Hour)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(release)
	stop()
	if err := <-done; err != nil {
		panic(err)
	}
	ws, _ := q.Workers(ctx)
	fmt.Println("after Work returned:", len(ws), "workers")
	// Output:
	// mailer-1: 1 of 4 slots busy, running welcome-ada
	// schedule digest (every 24h0m0s), next tick in under a day: true
	// after Work returned: 0 workers
}
