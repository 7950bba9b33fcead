package jobkey_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobkey/jobkey"
)

// Every failure is a typed error: test it with errors.Is, and read its
// detail with errors.As.
func Example_errors() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "billing", exampleConfig("errors"))
	if err != nil {
		panic(err)
	}
	q.Enqueue(ctx, "invoice", []byte("march"), &jobkey.EnqueueOpts{ID: "inv-3"})

	_, err = q.Enqueue(ctx, "invoice", []byte("march"), &jobkey.EnqueueOpts{ID: "inv-3"})
	var exists *jobkey.JobExistsError
	if errors.As(err, &exists) {
		fmt.Println("exists:", exists.Job.ID, exists.Job.State)
	}

	_, err = q.Get(ctx, "inv-4")
	fmt.Println("not found:", errors.Is(err, jobkey.ErrNotFound))

	c, _ := q.Claim(ctx, "worker-1")
	q.Complete(ctx, c, nil)
	_, err = q.Cancel(ctx, "inv-3")
	fmt.Println("wrong state:", errors.Is(err, jobkey.ErrState))
	// Output:
	// exists: inv-3 pending
	// not found: true
	// wrong state: true
}

// Claim, Extend and Complete by hand, for a worker loop of your own: claim
// a job, renew its lease while the work goes on, record the result.
func ExampleQueue_Claim() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "reports", exampleConfig("claim"))
	if err != nil {
		panic(err)
	}
	q.Enqueue(ctx, "render", []byte("q1"), nil)

	j, err := q.Claim(ctx, "worker-1")
	if errors.Is(err, jobkey.ErrNoJob) {
		return // nothing due: wait and claim again
	}
	if err != nil {
		panic(err)
	}
	fmt.Println(j.State, j.Attempt, j.LeaseOwner)

	j, err = q.Extend(ctx, j) // a long job renews its lease
	if err != nil {
		panic(err)
	}
	j, err = q.Complete(ctx, j, []byte("rendered "+string(j.Payload)))
	if err != nil {
		panic(err)
	}
	fmt.Println(j.State, string(j.Result))
	// Output:
	// active 1 worker-1
	// succeeded rendered q1
}

// Fail records a failed attempt: with attempts left the job is pending
// again after Config.Backoff; ErrSkipRetry fails it for good at once.
func ExampleQueue_Fail() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	cfg := exampleConfig("fail")
	cfg.Backoff = func(attempt int) time.Duration { return time.Minute }
	q, err := jobkey.NewQueue(rdb, "webhooks", cfg)
	if err != nil {
		panic(err)
	}
	q.Enqueue(ctx, "deliver", nil, &jobkey.EnqueueOpts{ID: "hook-1"})
	q.Enqueue(ctx, "deliver", nil, &jobkey.EnqueueOpts{ID: "hook-2"})

	for range 2 {
		j, err := q.Claim(ctx, "worker-1")
		if err != nil {
			panic(err)
		}
		cause := errors.New("503 from endpoint")
		if j.ID == "hook-2" {
			cause = fmt.Errorf("410 gone: %w", jobkey.ErrSkipRetry)
		}
		j, err = q.Fail(ctx, j, cause)
		if err != nil {
			panic(err)
		}
		fmt.Println(j.ID, j.State, j.LastError)
	}
	// Unordered output:
	// hook-1 pending 503 from endpoint
	// hook-2 failed 410 gone: jobkey: do not retry
}

// Release gives a claimed job back without spending its attempt, for a
// worker that must stop before it starts the work.
func ExampleQueue_Release() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "imports", exampleConfig("release"))
	if err != nil {
		panic(err)
	}
	q.Enqueue(ctx, "import", nil, nil)

	j, _ := q.Claim(ctx, "worker-1")
	j, err = q.Release(ctx, j)
	if err != nil {
		panic(err)
	}
	fmt.Println(j.State, j.Attempt)
	// Output: pending 0
}

// Fencing: a worker whose lease ran out cannot record an outcome once
// another worker has claimed the job. Its Complete returns ErrLeaseLost
// and writes nothing.
func ExampleQueue_Complete() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	cfg := exampleConfig("fencing")
	cfg.Lease = 100 * time.Millisecond
	q, err := jobkey.NewQueue(rdb, "payments", cfg)
	if err != nil {
		panic(err)
	}
	q.Enqueue(ctx, "charge", nil, nil)

	slow, _ := q.Claim(ctx, "worker-1")
	time.Sleep(150 * time.Millisecond) // worker-1 pauses past its lease
	fast, err := q.Claim(ctx, "worker-2")
	if err != nil {
		panic(err)
	}
	q.Complete(ctx, fast, []byte("charged once"))

	_, err = q.Complete(ctx, slow, []byte("charged twice"))
	fmt.Println(errors.Is(err, jobkey.ErrLeaseLost))
	j, _ := q.Get(ctx, slow.ID)
	fmt.Println(j.LeaseOwner, string(j.Result))
	// Output:
	// true
	// worker-2 charged once
}
