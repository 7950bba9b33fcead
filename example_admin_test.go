package jobkey_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jobkey/jobkey"
)

// Get reads a job by ID in one round trip; a missing one is ErrNotFound.
func ExampleQueue_Get() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "reports", exampleConfig("get"))
	if err != nil {
		panic(err)
	}
	if _, err := q.Enqueue(ctx, "monthly", []byte("2024-05"), &jobkey.EnqueueOpts{ID: "report-2024-05"}); err != nil {
		panic(err)
	}

	j, err := q.Get(ctx, "report-2024-05")
	if err != nil {
		panic(err)
	}
	fmt.Println(j.Type, string(j.Payload), j.State, j.Attempt)

	_, err = q.Get(ctx, "report-1999-01")
	fmt.Println(errors.Is(err, jobkey.ErrNotFound))
	// Output:
	// monthly 2024-05 pending 0
	// true
}

// Cancel stops a job that has not run yet. Canceling an active job makes
// its worker's next write fail with ErrLeaseLost, and Work cancels the
// handler's context.
func ExampleQueue_Cancel() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "emails", exampleConfig("cancel"))
	if err != nil {
		panic(err)
	}
	j, err := q.Enqueue(ctx, "newsletter", nil, &jobkey.EnqueueOpts{Delay: time.Hour})
	if err != nil {
		panic(err)
	}

	j, err = q.Cancel(ctx, j.ID)
	if err != nil {
		panic(err)
	}
	fmt.Println(j.State)
	// Output: canceled
}

// Retry puts a failed or canceled job back to pending, due now, with its
// attempts counted from zero again.
func ExampleQueue_Retry() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "payments", exampleConfig("retry"))
	if err != nil {
		panic(err)
	}
	j, _ := q.Enqueue(ctx, "charge", nil, &jobkey.EnqueueOpts{MaxAttempts: 1})
	c, _ := q.Claim(ctx, "worker-1")
	failed, _ := q.Fail(ctx, c, errors.New("card declined"))
	fmt.Println(failed.State, failed.LastError)

	j, err = q.Retry(ctx, j.ID)
	if err != nil {
		panic(err)
	}
	fmt.Println(j.State, j.Attempt)
	// Output:
	// failed card declined
	// pending 0
}

// Update edits a job by compare-and-set: the function gets the job as
// stored now, and runs again if someone changed it in between.
func ExampleQueue_Update() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "emails", exampleConfig("update"))
	if err != nil {
		panic(err)
	}
	j, _ := q.Enqueue(ctx, "digest", []byte("daily"), &jobkey.EnqueueOpts{Delay: time.Hour})

	j, err = q.Update(ctx, j.ID, func(j *jobkey.Job) error {
		j.Payload = []byte("weekly")
		j.Priority = 5
		return nil
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(string(j.Payload), j.Priority, j.State)
	// Output: weekly 5 pending
}

// Delete removes a pending or finished job. An active job is refused with
// ErrState: cancel it first, or let it finish.
func ExampleQueue_Delete() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "uploads", exampleConfig("delete"))
	if err != nil {
		panic(err)
	}
	pending, _ := q.Enqueue(ctx, "scan", nil, nil)
	if err := q.Delete(ctx, pending.ID); err != nil {
		panic(err)
	}
	_, err = q.Get(ctx, pending.ID)
	fmt.Println(errors.Is(err, jobkey.ErrNotFound))

	q.Enqueue(ctx, "scan", nil, nil)
	active, _ := q.Claim(ctx, "worker-1")
	err = q.Delete(ctx, active.ID)
	fmt.Println(errors.Is(err, jobkey.ErrState))
	// Output:
	// true
	// true
}

// List pages through the jobs of one state, merged across shards; pending
// jobs come oldest RunAt first. Pass each page's Next back as the Cursor.
func ExampleQueue_List() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "thumbnails", exampleConfig("list"))
	if err != nil {
		panic(err)
	}
	for i := range 5 {
		id := fmt.Sprintf("thumb-%d", i)
		delay := time.Duration(i+1) * time.Minute
		if _, err := q.Enqueue(ctx, "thumbnail", nil, &jobkey.EnqueueOpts{ID: id, Delay: delay}); err != nil {
			panic(err)
		}
	}

	opts := jobkey.ListOpts{State: jobkey.StatePending, Limit: 2}
	for {
		page, err := q.List(ctx, opts)
		if err != nil {
			panic(err)
		}
		var ids []string
		for _, j := range page.Jobs {
			ids = append(ids, j.ID)
		}
		fmt.Println(strings.Join(ids, " "))
		if page.Next == "" {
			break
		}
		opts.Cursor = page.Next
	}
	// Output:
	// thumb-0 thumb-1
	// thumb-2 thumb-3
	// thumb-4
}

// With a Type, List reads on until a page holds Limit jobs of that type,
// up to a bound of index entries (10 times Limit, at least 1,000). A page
// that stopped at the bound says so with ScanStopped: it is not the last,
// and the listing goes on from Next.
func ExampleQueue_List_type() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "thumbnails", exampleConfig("listtype"))
	if err != nil {
		panic(err)
	}
	// 1,200 thumbnails, then one resize.
	var specs []jobkey.JobSpec
	for i := range 1201 {
		typ := "thumbnail"
		if i == 1200 {
			typ = "resize"
		}
		delay := time.Minute + time.Duration(i)*time.Millisecond
		specs = append(specs, jobkey.JobSpec{Type: typ, Opts: &jobkey.EnqueueOpts{Delay: delay}})
	}
	for c := range slices.Chunk(specs, 200) {
		if _, err := q.EnqueueMany(ctx, c); err != nil {
			panic(err)
		}
	}

	opts := jobkey.ListOpts{State: jobkey.StatePending, Type: "resize", Limit: 10}
	for {
		page, err := q.List(ctx, opts)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%d jobs of %d entries read, scan stopped: %v\n", len(page.Jobs), page.Scanned, page.ScanStopped)
		if page.Next == "" {
			break
		}
		opts.Cursor = page.Next
	}
	// Output:
	// 0 jobs of 1000 entries read, scan stopped: true
	// 1 jobs of 201 entries read, scan stopped: false
}

// RetryFailed puts every failed job of a type back to pending. When a bulk
// action stops part way, its *BulkError says how far it got.
func ExampleQueue_RetryFailed() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "webhooks", exampleConfig("retryfailed"))
	if err != nil {
		panic(err)
	}
	for range 3 {
		q.Enqueue(ctx, "deliver", nil, &jobkey.EnqueueOpts{MaxAttempts: 1})
		c, _ := q.Claim(ctx, "worker-1")
		q.Fail(ctx, c, errors.New("endpoint down"))
	}

	res, err := q.RetryFailed(ctx, "deliver")
	var be *jobkey.BulkError
	if errors.As(err, &be) {
		fmt.Printf("%s stopped after %d jobs: %v\n", be.Op, be.Result.Done, be.Err)
		return
	}
	if err != nil {
		panic(err)
	}
	fmt.Println("retried", res.Done)
	// Output: retried 3
}

// CancelPending cancels every pending job of a type ("" for all), for
// example after a bad deploy enqueued jobs that must not run.
func ExampleQueue_CancelPending() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "sms", exampleConfig("cancelpending"))
	if err != nil {
		panic(err)
	}
	for range 4 {
		q.Enqueue(ctx, "promo", nil, nil)
	}
	q.Enqueue(ctx, "otp", nil, nil)

	res, err := q.CancelPending(ctx, "promo")
	if err != nil {
		panic(err)
	}
	st, _ := q.Stats(ctx)
	fmt.Printf("canceled %d, still pending %d\n", res.Done, st.Pending)
	// Output: canceled 4, still pending 1
}

// With MinReplicas, a bulk action stops at the first transaction the
// replicas did not confirm, and Unconfirmed counts the jobs it changed on
// the master only. Here the server has no replica, so nothing is
// confirmed; canceling a job again waits for the replicas again, and says
// so, rather than report a cancel a failover could still undo.
func ExampleBulkResult_unconfirmed() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	cfg := exampleConfig("bulkunconfirmed")
	cfg.MinReplicas = 1
	cfg.ReplicaTimeout = 50 * time.Millisecond
	q, err := jobkey.NewQueue(rdb, "sms", cfg)
	if err != nil {
		panic(err)
	}
	for _, id := range []string{"a", "b", "c"} {
		q.Enqueue(ctx, "promo", nil, &jobkey.EnqueueOpts{ID: id}) // applied on the master, unconfirmed
	}

	res, err := q.CancelPending(ctx, "promo")
	fmt.Println("not replicated:", errors.Is(err, jobkey.ErrNotReplicated))
	fmt.Printf("done %d, on the master only %d\n", res.Done, res.Unconfirmed)
	_, err = q.Cancel(ctx, "a")
	fmt.Println("cancel again:", errors.Is(err, jobkey.ErrNotReplicated))
	// Output:
	// not replicated: true
	// done 3, on the master only 3
	// cancel again: true
}

// DeleteFinished deletes the jobs of one finished state at once, rather
// than waiting for their retention to expire.
func ExampleQueue_DeleteFinished() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "imports", exampleConfig("deletefinished"))
	if err != nil {
		panic(err)
	}
	for range 2 {
		q.Enqueue(ctx, "csv", nil, nil)
		c, _ := q.Claim(ctx, "worker-1")
		q.Complete(ctx, c, nil)
	}

	res, err := q.DeleteFinished(ctx, jobkey.StateSucceeded, "")
	if err != nil {
		panic(err)
	}
	st, _ := q.Stats(ctx)
	fmt.Printf("deleted %d, succeeded now %d\n", res.Done, st.Succeeded)
	// Output: deleted 2, succeeded now 0
}

// Pause stops every worker from taking new jobs of the queue (enqueues
// still work); Resume lets them go on.
func ExampleQueue_Pause() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "exports", exampleConfig("pause"))
	if err != nil {
		panic(err)
	}
	q.Enqueue(ctx, "export", nil, nil)

	if err := q.Pause(ctx); err != nil {
		panic(err)
	}
	_, err = q.Claim(ctx, "worker-1")
	st, _ := q.Stats(ctx)
	fmt.Println(st.Paused, errors.Is(err, jobkey.ErrNoJob))

	if err := q.Resume(ctx); err != nil {
		panic(err)
	}
	j, err := q.Claim(ctx, "worker-1")
	if err != nil {
		panic(err)
	}
	fmt.Println(j.State)
	// Output:
	// true true
	// active
}
