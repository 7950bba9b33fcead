package jobkey_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jobkey/jobkey"
)

// Work runs a handler on every job until its context ends. Here OnRecorded
// ends it once the one job's outcome is written.
func ExampleQueue_Work() {
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "images", exampleConfig("work"))
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	if _, err := q.Enqueue(ctx, "resize", []byte("dog.png"), nil); err != nil {
		panic(err)
	}

	h := jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
		return []byte("resized " + string(j.Payload)), nil
	})
	err = q.Work(ctx, h, &jobkey.WorkOpts{
		Concurrency: 2,
		OnRecorded: func(j *jobkey.Job, err error) {
			fmt.Println(j.State, string(j.Result), err)
			stop()
		},
	})
	fmt.Println("work returned", err)
	// Output:
	// succeeded resized dog.png <nil>
	// work returned <nil>
}

// EnqueueMany stores a batch in one transaction. A job whose ID is taken
// is not written again; the *BatchError says which, job by job.
func ExampleQueue_EnqueueMany() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "invoices", exampleConfig("many"))
	if err != nil {
		panic(err)
	}
	q.Enqueue(ctx, "invoice", nil, &jobkey.EnqueueOpts{ID: "inv-2"})

	jobs, err := q.EnqueueMany(ctx, []jobkey.JobSpec{
		{Type: "invoice", Opts: &jobkey.EnqueueOpts{ID: "inv-1"}},
		{Type: "invoice", Opts: &jobkey.EnqueueOpts{ID: "inv-2"}},
		{Type: "invoice", Opts: &jobkey.EnqueueOpts{ID: "inv-3"}},
	})
	var be *jobkey.BatchError
	if errors.As(err, &be) {
		for i, e := range be.Errs {
			fmt.Println(jobs[i].ID, errors.Is(e, jobkey.ErrJobExists))
		}
	}
	// Output:
	// inv-1 false
	// inv-2 true
	// inv-3 false
}

// ClaimMany and CompleteMany take and finish a batch of jobs in one
// transaction each, for handlers that work better in bulk.
func ExampleQueue_ClaimMany() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "events", exampleConfig("claimmany"))
	if err != nil {
		panic(err)
	}
	for i := range 3 {
		q.Enqueue(ctx, "index", []byte(fmt.Sprint(i)), nil)
	}

	jobs, err := q.ClaimMany(ctx, "worker-1", 10)
	if err != nil {
		panic(err)
	}
	results := make([][]byte, len(jobs))
	for i := range jobs {
		results[i] = []byte("indexed")
	}
	done, err := q.CompleteMany(ctx, jobs, results)
	if err != nil {
		panic(err)
	}
	st, _ := q.Stats(ctx)
	fmt.Println(len(jobs), len(done), st.Succeeded)
	// Output: 3 3 3
}

// A claim takes due jobs of a higher priority (0 to 9) before any of a
// lower one, whatever their age.
func Example_priority() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "notifications", exampleConfig("priority"))
	if err != nil {
		panic(err)
	}
	q.Enqueue(ctx, "newsletter", nil, nil)
	q.Enqueue(ctx, "password-reset", nil, &jobkey.EnqueueOpts{Priority: 9})

	for range 2 {
		j, err := q.Claim(ctx, "worker-1")
		if err != nil {
			panic(err)
		}
		fmt.Println(j.Priority, j.Type)
	}
	// Output:
	// 9 password-reset
	// 0 newsletter
}

// A job's Timeout ends its handler's context with ErrTimeout as the cause;
// the attempt fails and the job is retried under the normal backoff (here
// it has no attempts left, so it fails for good).
func Example_timeout() {
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "crawls", exampleConfig("timeout"))
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	q.Enqueue(ctx, "crawl", nil, &jobkey.EnqueueOpts{Timeout: 50 * time.Millisecond, MaxAttempts: 1})

	h := jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
		<-ctx.Done() // a handler that would run too long
		fmt.Println(errors.Is(context.Cause(ctx), jobkey.ErrTimeout))
		return nil, context.Cause(ctx)
	})
	q.Work(ctx, h, &jobkey.WorkOpts{OnRecorded: func(j *jobkey.Job, err error) {
		fmt.Println(j.State, strings.Contains(j.LastError, "timeout"))
		stop()
	}})
	// Output:
	// true
	// failed true
}

// A job's Deadline is an absolute time after which no run of it goes on:
// the handler's context ends then with ErrDeadline as the cause, and the
// attempt fails. A job claimed after its Deadline is not run at all.
func Example_deadline() {
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "reports", exampleConfig("deadline"))
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	q.Enqueue(ctx, "report", nil, &jobkey.EnqueueOpts{Deadline: time.Now().Add(100 * time.Millisecond), MaxAttempts: 1})

	h := jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
		<-ctx.Done() // a report not done in time is of no use
		fmt.Println(errors.Is(ctx.Err(), context.DeadlineExceeded), errors.Is(context.Cause(ctx), jobkey.ErrDeadline))
		return nil, ctx.Err()
	})
	q.Work(ctx, h, &jobkey.WorkOpts{OnRecorded: func(j *jobkey.Job, err error) {
		fmt.Println(j.State, strings.Contains(j.LastError, "deadline"))
		stop()
	}})
	// Output:
	// true true
	// failed true
}

// A job's Retention keeps it, once it has succeeded, for its own time
// instead of the queue's Config.Retention: here a receipt kept 30 days on a
// queue that keeps jobs a day.
func Example_retention() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "payments", exampleConfig("retention"))
	if err != nil {
		panic(err)
	}
	j, _ := q.Enqueue(ctx, "charge", nil, &jobkey.EnqueueOpts{Retention: 30 * 24 * time.Hour})
	c, _ := q.Claim(ctx, "worker-1")
	q.Complete(ctx, c, []byte("receipt-42"))
	got, _ := q.Get(ctx, j.ID)
	fmt.Println(got.State, got.Retention)
	// Output:
	// succeeded 720h0m0s
}

// Periodic jobs need no leader: every Work that lists the schedule enqueues
// the tick's job under one ID, so each tick runs once however many processes
// run. A schedule Redis has not seen starts at its next tick; this one asks
// to start with its latest, so the Work that deploys it between two hourly
// ticks enqueues the one before at once.
func ExampleEvery() {
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "maintenance", exampleConfig("every"))
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	h := jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
		fmt.Println(j.Type, strings.HasPrefix(j.ID, "periodic:cleanup:"))
		stop()
		return nil, nil
	})
	err = q.Work(ctx, h, &jobkey.WorkOpts{Periodic: []jobkey.PeriodicJob{
		{Name: "cleanup", Schedule: jobkey.Every(time.Hour), Type: "cleanup", StartWithLatestTick: true},
	}})
	fmt.Println(err)
	// Output:
	// cleanup true
	// <nil>
}

// A schedule Redis has not seen before starts at its next tick: deployed
// between two hourly ticks, it does not run for the tick before it
// existed. A process that was down later catches up on the latest tick it
// missed, since Redis has seen the schedule by then.
func ExamplePeriodicJob() {
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "maintenance", exampleConfig("periodic"))
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer stop()

	h := jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
		fmt.Println("ran", j.ID)
		return nil, nil
	})
	err = q.Work(ctx, h, &jobkey.WorkOpts{Periodic: []jobkey.PeriodicJob{
		{Name: "hourly-report", Schedule: jobkey.Every(time.Hour), Type: "report"},
	}})
	st, _ := q.Stats(context.Background())
	fmt.Println(err, st.Pending+st.Active+st.Succeeded)
	// Output:
	// <nil> 0
}

// Jobs of one concurrency key run one at a time by default
// (Config.ConcurrencyLimit): the second waits until the first finishes,
// while the queue's other jobs go on.
func ExampleQueue_Concurrency() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "exports", exampleConfig("concurrency"))
	if err != nil {
		panic(err)
	}
	for range 2 {
		q.Enqueue(ctx, "export", nil, &jobkey.EnqueueOpts{ConcurrencyKey: "customer-7"})
	}

	first, _ := q.Claim(ctx, "worker-1")
	_, err = q.Claim(ctx, "worker-2")
	info, _ := q.Concurrency(ctx, "customer-7")
	fmt.Println(errors.Is(err, jobkey.ErrNoJob), info.Limit, info.Active, info.Waiting)

	q.Complete(ctx, first, nil)
	second, err := q.Claim(ctx, "worker-2")
	if err != nil {
		panic(err)
	}
	fmt.Println(second.ConcurrencyKey, second.State)
	// Output:
	// true 1 1 1
	// customer-7 active
}

// On a queue of several shards a keyed job lives in its key's shard, so an
// ID of yours must be drawn there: IDFor makes one from your base, the
// same one every time.
func ExampleQueue_IDFor() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	cfg := exampleConfig("idfor")
	cfg.Shards = 8
	q, err := jobkey.NewQueue(rdb, "exports", cfg)
	if err != nil {
		panic(err)
	}
	id, err := q.IDFor("customer-42", "export-2024-05")
	if err != nil {
		panic(err)
	}
	j, err := q.Enqueue(ctx, "export", nil, &jobkey.EnqueueOpts{ID: id, ConcurrencyKey: "customer-42"})
	if err != nil {
		panic(err)
	}
	again, _ := q.IDFor("customer-42", "export-2024-05")
	fmt.Println(strings.HasPrefix(j.ID, "export-2024-05"), again == j.ID)
	// Output: true true
}

// DecodeArgs reads a typed job's arguments back, for code that is not a
// handler: an admin page, a migration.
func ExampleDecodeArgs() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "mail", exampleConfig("decode"))
	if err != nil {
		panic(err)
	}
	j, err := jobkey.EnqueueArgs(ctx, q, SendEmail{To: "grace@example.com", Subject: "Hi"}, nil)
	if err != nil {
		panic(err)
	}

	stored, _ := q.Get(ctx, j.ID)
	args, err := jobkey.DecodeArgs[SendEmail](stored)
	if err != nil {
		panic(err)
	}
	fmt.Println(stored.Type, args.To, args.Subject)
	// Output: send-email grace@example.com Hi
}

// One pool of runners serves several queues by weight, as asynq's Queues
// map does: a queue with nothing due lends its runners to the others.
func ExampleWorkQueues() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rdb := exampleRedis()
	defer rdb.Close()
	var queues []jobkey.WeightedQueue
	for name, weight := range map[string]int{"critical": 6, "default": 3, "low": 1} {
		q, err := jobkey.NewQueue(rdb, name, exampleConfig("weighted"))
		if err != nil {
			panic(err)
		}
		queues = append(queues, jobkey.WeightedQueue{Queue: q, Weight: weight})
	}
	for _, wq := range queues {
		if _, err := wq.Queue.Enqueue(ctx, "hello", []byte(wq.Queue.Name()), nil); err != nil {
			panic(err)
		}
	}
	var mu sync.Mutex
	ran := map[string]bool{}
	h := jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		ran[string(j.Payload)] = true
		if len(ran) == 3 {
			cancel()
		}
		return nil, nil
	})
	err := jobkey.WorkQueues(ctx, h, queues, &jobkey.WorkQueuesOpts{WorkOpts: jobkey.WorkOpts{Concurrency: 4}})
	fmt.Println(err, ran["critical"], ran["default"], ran["low"])
	// Output: <nil> true true true
}

// By default a Work writes its successes in bulk and claims ahead of its
// slots: a transaction completes many runs and claims the jobs the slots
// take next. WorkOpts.Prefetch bounds the jobs held ahead (-1 turns it
// off); Metrics counts those claimed and those given back unrun.
func ExampleWorkOpts_prefetch() {
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "thumbnails", exampleConfig("prefetch"))
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	const n = 200
	specs := make([]jobkey.JobSpec, n)
	for i := range specs {
		specs[i] = jobkey.JobSpec{Type: "thumb"}
	}
	if _, err := q.EnqueueMany(ctx, specs); err != nil {
		panic(err)
	}

	var mu sync.Mutex
	recorded := 0
	err = q.Work(ctx, jobkey.HandlerFunc(func(context.Context, *jobkey.Job) ([]byte, error) {
		return nil, nil
	}), &jobkey.WorkOpts{
		Concurrency: 4,
		Prefetch:    8, // at most 8 jobs held ahead of the 4 slots
		OnRecorded: func(j *jobkey.Job, err error) {
			mu.Lock()
			defer mu.Unlock()
			if recorded++; recorded == n {
				stop()
			}
		},
	})
	m := q.Metrics()
	fmt.Println("work returned", err)
	fmt.Println("succeeded:", m.Succeeded)
	fmt.Println("some claimed ahead:", m.Prefetched > 0)
	fmt.Println("more than one run finished per transaction:", m.FinishBatches.Calls > m.FinishBatches.Flushes)
	// Output:
	// work returned <nil>
	// succeeded: 200
	// some claimed ahead: true
	// more than one run finished per transaction: true
}
