package jobkey_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jobkey/jobkey"
)

// Throughput counts a queue's history from its indexes, with no counter to
// drift: how many jobs finished in each minute, by outcome, and how many
// are scheduled in each minute ahead.
func ExampleQueue_Throughput() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "reports", exampleConfig("throughput"))
	if err != nil {
		panic(err)
	}
	for range 3 {
		if _, err := q.Enqueue(ctx, "monthly", nil, nil); err != nil {
			panic(err)
		}
		j, err := q.Claim(ctx, "worker-1")
		if err != nil {
			panic(err)
		}
		if _, err := q.Complete(ctx, j, nil); err != nil {
			panic(err)
		}
	}
	if _, err := q.Enqueue(ctx, "monthly", nil, &jobkey.EnqueueOpts{Delay: 90 * time.Minute}); err != nil {
		panic(err)
	}

	now := time.Now().Truncate(time.Minute)
	th, err := q.Throughput(ctx, now.Add(-time.Hour), now.Add(2*time.Hour), time.Minute)
	if err != nil {
		panic(err)
	}
	var done, ahead int64
	for _, b := range th.Buckets {
		done += b.Succeeded
		ahead += b.Scheduled
	}
	fmt.Printf("%d buckets of %v; succeeded %d, scheduled ahead %d\n", len(th.Buckets), th.Step, done, ahead)
	// Output: 180 buckets of 1m0s; succeeded 3, scheduled ahead 1
}
