package jobkey_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jobkey/jobkey"
)

// A batch of three image resizes whose callback builds the album once all
// of them have finished: the EXEC that writes the last outcome enqueues
// it, so it runs once, never before the last resize ends.
func ExampleQueue_EnqueueBatch() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "images", exampleConfig("batch"))
	if err != nil {
		panic(err)
	}
	jobs := []jobkey.JobSpec{{Type: "resize", Payload: []byte("a.png")}, {Type: "resize", Payload: []byte("b.png")}, {Type: "resize", Payload: []byte("c.png")}}
	b, _, err := q.EnqueueBatch(ctx, jobs, jobkey.JobSpec{Type: "album"}, &jobkey.BatchOpts{ID: "album-7"})
	if err != nil {
		panic(err)
	}
	fmt.Println("batch", b.ID, "pending", b.Pending)
	for range 3 {
		j, err := q.Claim(ctx, "worker-1")
		if err != nil {
			panic(err)
		}
		if string(j.Payload) == "b.png" {
			_, err = q.Fail(ctx, j, fmt.Errorf("%w: not an image", jobkey.ErrSkipRetry))
		} else {
			_, err = q.Complete(ctx, j, nil)
		}
		if err != nil {
			panic(err)
		}
	}
	b, err = q.Batch(ctx, "album-7")
	if err != nil {
		panic(err)
	}
	fmt.Println("succeeded", b.Succeeded, "failed", b.Failed, "callback", b.Fired)
	cb, err := q.Claim(ctx, "worker-1")
	if err != nil {
		panic(err)
	}
	fmt.Println("next:", cb.Type, cb.ID)
	// Output:
	// batch album-7 pending 3
	// succeeded 2 failed 1 callback enqueued
	// next: album album-7
}

// A chain runs each step once the one before it succeeded. When a step
// fails, the EXEC that fails it cancels every step after it, so the chain
// ends instead of waiting for ever.
func ExampleQueue_EnqueueChain() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "deploys", exampleConfig("chain"))
	if err != nil {
		panic(err)
	}
	steps := []jobkey.JobSpec{{Type: "build"}, {Type: "test"}, {Type: "deploy"}}
	ids, err := q.EnqueueChain(ctx, steps, nil)
	if err != nil {
		panic(err)
	}
	j, err := q.Claim(ctx, "worker-1")
	if err != nil {
		panic(err)
	}
	fmt.Println("runs:", j.Type)
	if _, err := q.Complete(ctx, j, nil); err != nil {
		panic(err)
	}
	j, err = q.Claim(ctx, "worker-1")
	if err != nil {
		panic(err)
	}
	fmt.Println("runs:", j.Type)
	if _, err := q.Fail(ctx, j, fmt.Errorf("%w: 3 tests failed", jobkey.ErrSkipRetry)); err != nil {
		panic(err)
	}
	deploy, err := q.Get(ctx, ids[2])
	if err != nil {
		panic(err)
	}
	fmt.Println(deploy.Type, deploy.State)
	_, err = q.Claim(ctx, "worker-1")
	fmt.Println(errors.Is(err, jobkey.ErrNoJob))
	// Output:
	// runs: build
	// runs: test
	// deploy canceled
	// true
}
