package jobkey_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobkey/jobkey"
)

// A job keeps its runs in History, oldest first: how each ended, the
// worker, and its error.
func ExampleAttemptRecord() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	cfg := exampleConfig("history")
	cfg.Backoff = func(int) time.Duration { return 0 }
	q, err := jobkey.NewQueue(rdb, "webhooks", cfg)
	if err != nil {
		panic(err)
	}
	q.Enqueue(ctx, "deliver", nil, &jobkey.EnqueueOpts{ID: "hook-1"})

	j, _ := q.Claim(ctx, "worker-1")
	q.Fail(ctx, j, errors.New("503 from endpoint"))
	j, _ = q.Claim(ctx, "worker-2")
	q.Fail(ctx, j, jobkey.Snooze(0))
	j, _ = q.Claim(ctx, "worker-3")
	j, err = q.Complete(ctx, j, nil)
	if err != nil {
		panic(err)
	}
	for _, r := range j.History {
		fmt.Println(r.Attempt, r.Worker, r.Outcome, r.Error)
	}
	// Output:
	// 1 worker-1 failed 503 from endpoint
	// 2 worker-2 snoozed jobkey: snoozed for 0s
	// 2 worker-3 succeeded
}

// A handler reports its progress with SetProgress; it rides the run's next
// lease renewal and its outcome, and Get shows it.
func ExampleSetProgress() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "imports", exampleConfig("progress"))
	if err != nil {
		panic(err)
	}
	q.Enqueue(ctx, "import", nil, &jobkey.EnqueueOpts{ID: "import-1"})

	h := jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
		for done := 1; done <= 3; done++ {
			// ... import a third of the rows ...
			if err := jobkey.SetProgress(ctx, fmt.Appendf(nil, `{"done":%d,"of":3}`, done)); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- q.Work(wctx, h, nil) }()
	for {
		j, err := q.Get(ctx, "import-1")
		if err != nil {
			panic(err)
		}
		if j.State == jobkey.StateSucceeded {
			fmt.Println(j.State, string(j.Progress))
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	<-done
	// Output: succeeded {"done":3,"of":3}
}
