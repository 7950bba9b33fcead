package jobkey_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobkey/jobkey"
)

// Stats counts a queue's jobs from its indexes, exactly, in one round trip
// per node.
func ExampleQueue_Stats() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "videos", exampleConfig("stats"))
	if err != nil {
		panic(err)
	}
	q.Enqueue(ctx, "transcode", nil, nil)
	q.Enqueue(ctx, "transcode", nil, &jobkey.EnqueueOpts{Priority: 3})
	q.Enqueue(ctx, "transcode", nil, &jobkey.EnqueueOpts{Delay: time.Hour})
	q.Claim(ctx, "worker-1")

	st, err := q.Stats(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("pending %d (due %d, scheduled %d), active %d\n", st.Pending, st.Due, st.Scheduled, st.Active)
	fmt.Println("due at priority 0:", st.DueByPriority[0])
	// Output:
	// pending 2 (due 1, scheduled 1), active 1
	// due at priority 0: 1
}

// Verify checks a queue's indexes against its job values and, with Fix,
// re-derives the entries that disagree. Here someone removed a job's index
// entry by hand, so no claim could find the job; Keys makes Verify scan for
// values that no index lists.
func ExampleQueue_Verify() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "orders", exampleConfig("verify"))
	if err != nil {
		panic(err)
	}
	j, _ := q.Enqueue(ctx, "ship", nil, nil)
	rdb.ZRem(ctx, q.Keys(j.ID).Ready, j.ID) // a hand edit gone wrong

	report, err := q.Verify(ctx, &jobkey.VerifyOpts{Fix: true, Keys: true})
	if err != nil {
		panic(err)
	}
	for _, f := range report.Findings {
		fmt.Println(f.ID == j.ID, f.Kind, f.Fixed)
	}
	c, err := q.Claim(ctx, "worker-1")
	if err != nil {
		panic(err)
	}
	fmt.Println(c.ID == j.ID)
	// Output:
	// true missing-entry true
	// true
}

// Finished jobs expire by their key's own TTL; Trim removes the index
// entries they leave behind. Work does it every WorkOpts.TrimInterval; a
// queue without workers can call it from a timer.
func ExampleQueue_Trim() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "audit", exampleConfig("trim"))
	if err != nil {
		panic(err)
	}
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			n, err := q.Trim(ctx)
			if err != nil {
				fmt.Println("trim:", err)
				continue
			}
			fmt.Println("trimmed", n, "entries")
		}
	}
}

// Metrics reads this process's counters for a queue: transactions,
// conflicts, round trips and commands. An Enqueue costs two round trips:
// WATCH and read, then MULTI/EXEC.
func ExampleQueue_Metrics() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "metrics", exampleConfig("metrics"))
	if err != nil {
		panic(err)
	}
	q.Enqueue(ctx, "ping", nil, nil) // the first call also checks the server

	before := q.Metrics()
	q.Enqueue(ctx, "ping", nil, nil)
	after := q.Metrics()
	fmt.Println("transactions:", after.Txns-before.Txns)
	fmt.Println("round trips:", after.RoundTrips-before.RoundTrips)
	fmt.Println("conflicts:", after.Conflicts)
	// Output:
	// transactions: 1
	// round trips: 2
	// conflicts: 0
}

// ContentID derives a job's ID from its type and payload, so the same work
// enqueued twice is one job.
func ExampleContentID() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "search", exampleConfig("contentid"))
	if err != nil {
		panic(err)
	}
	payload := []byte(`{"doc":17}`)
	id := jobkey.ContentID("reindex", payload)

	first, err := q.Enqueue(ctx, "reindex", payload, &jobkey.EnqueueOpts{ID: id})
	if err != nil {
		panic(err)
	}
	second, err := q.Enqueue(ctx, "reindex", payload, &jobkey.EnqueueOpts{ID: id})
	fmt.Println(err != nil, second.ID == first.ID)
	// Output: true true
}

// Queues lists every queue under a prefix, for tools and dashboards.
func ExampleQueues() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	cfg := exampleConfig("queues")
	for _, name := range []string{"emails", "images"} {
		q, err := jobkey.NewQueue(rdb, name, cfg)
		if err != nil {
			panic(err)
		}
		q.Enqueue(ctx, "noop", nil, nil)
	}

	names, err := jobkey.Queues(ctx, rdb, cfg.Prefix)
	if err != nil {
		panic(err)
	}
	fmt.Println(names)
	// Output: [emails images]
}

// With MinReplicas, a write is answered once that many replicas have it,
// so it survives a failover. Here the server has no replica: the enqueue
// is applied on the master, but not confirmed, and says so. Calling again
// with the same ID is safe, and answers once the replicas catch up.
func ExampleConfig_minReplicas() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	cfg := exampleConfig("replicas")
	cfg.MinReplicas = 1
	cfg.ReplicaTimeout = 50 * time.Millisecond
	q, err := jobkey.NewQueue(rdb, "billing", cfg)
	if err != nil {
		panic(err)
	}

	_, err = q.Enqueue(ctx, "invoice", []byte("april"), &jobkey.EnqueueOpts{ID: "inv-4"})
	var re *jobkey.ReplicationError
	if errors.As(err, &re) {
		fmt.Println("not replicated:", errors.Is(err, jobkey.ErrNotReplicated))
		fmt.Printf("confirmed by %d of %d replicas\n", re.Acked, re.Want)
	}
	j, _ := q.Get(ctx, "inv-4")
	fmt.Println("on the master:", j.State)

	// The retry finds its job, and waits for the replicas again.
	_, err = q.Enqueue(ctx, "invoice", []byte("april"), &jobkey.EnqueueOpts{ID: "inv-4"})
	fmt.Println("retry:", errors.Is(err, jobkey.ErrJobExists), errors.Is(err, jobkey.ErrNotReplicated))
	// Output:
	// not replicated: true
	// confirmed by 0 of 1 replicas
	// on the master: pending
	// retry: false true
}

// Config returns what a queue runs with, every default filled in: a tool
// that writes for the queue reads how its writes must wait from it.
func ExampleQueue_Config() {
	rdb := exampleRedis()
	defer rdb.Close()
	cfg := exampleConfig("config")
	cfg.Lease = time.Minute
	q, err := jobkey.NewQueue(rdb, "mail", cfg)
	if err != nil {
		panic(err)
	}
	c := q.Config()
	fmt.Println(c.Lease, c.MaxAttempts, c.MinReplicas, c.ReplicaTimeout)
	// Output: 1m0s 25 0 1s
}
