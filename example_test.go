package jobkey_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// exampleRedis stands for your own client, such as
// redis.NewClient(&redis.Options{Addr: "localhost:6379"}). The examples use
// the test run's server: the one JOBKEY_TEST_REDIS_URL names, or else the
// one internal/redistest starts. exampleConfig gives each example its own
// key prefix, so examples never see each other's jobs.
func exampleRedis() *redis.Client {
	url := os.Getenv("JOBKEY_TEST_REDIS_URL")
	if url == "" {
		t, err := redistest.SharedTarget()
		if err != nil {
			panic(err)
		}
		url = t.URL
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		panic(err)
	}
	// As a user builds it: go-redis's maintenance notifications in their
	// default "auto" mode.
	return redis.NewClient(opt)
}

func exampleConfig(name string) *jobkey.Config {
	return &jobkey.Config{Prefix: "example-" + name + "-" + jobkey.NewID()}
}

// A producer enqueues jobs. A caller's ID makes the enqueue idempotent.
func Example_producer() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()

	q, err := jobkey.NewQueue(rdb, "emails", exampleConfig("producer"))
	if err != nil {
		panic(err)
	}
	j, err := q.Enqueue(ctx, "welcome", []byte(`{"to":"ada@example.com"}`), &jobkey.EnqueueOpts{ID: "welcome-ada"})
	if err != nil {
		panic(err)
	}
	fmt.Println(j.ID, j.State)

	// Retrying with the same ID is safe: nothing is written twice.
	_, err = q.Enqueue(ctx, "welcome", []byte(`{"to":"ada@example.com"}`), &jobkey.EnqueueOpts{ID: "welcome-ada"})
	fmt.Println(errors.Is(err, jobkey.ErrJobExists))

	// A delayed job.
	_, err = q.Enqueue(ctx, "reminder", nil, &jobkey.EnqueueOpts{Delay: time.Hour})
	if err != nil {
		panic(err)
	}
	st, _ := q.Stats(ctx)
	fmt.Printf("pending %d, due %d, scheduled %d\n", st.Pending, st.Due, st.Scheduled)
	// Output:
	// welcome-ada pending
	// true
	// pending 2, due 1, scheduled 1
}

// A worker runs jobs until its context ends, then shuts down gracefully.
func Example_worker() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "images", exampleConfig("worker"))
	if err != nil {
		panic(err)
	}
	j, _ := q.Enqueue(ctx, "resize", []byte("cat.png"), nil)

	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = q.Work(wctx, jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
			return []byte("resized " + string(j.Payload)), nil
		}), &jobkey.WorkOpts{Concurrency: 4})
	}()

	for {
		got, _ := q.Get(ctx, j.ID)
		if got.State == jobkey.StateSucceeded {
			fmt.Println(got.State, string(got.Result))
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	<-done
	// Output: succeeded resized cat.png
}

// SendEmail is a typed job: its Kind names the job type.
type SendEmail struct {
	To      string
	Subject string
}

func (SendEmail) Kind() string { return "send-email" }

// Typed jobs: one job type moves to jobkey while the others stay where
// they run today.
func Example_typedJob() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "mail", exampleConfig("typed"))
	if err != nil {
		panic(err)
	}
	j, err := jobkey.EnqueueArgs(ctx, q, SendEmail{To: "ada@example.com", Subject: "Hello"}, nil)
	if err != nil {
		panic(err)
	}

	mux := jobkey.Mux{
		SendEmail{}.Kind(): jobkey.HandleArgs(func(ctx context.Context, j *jobkey.Job, a SendEmail) ([]byte, error) {
			return []byte("sent to " + a.To), nil
		}),
	}
	c, _ := q.Claim(ctx, "example-worker")
	result, err := mux.Work(ctx, c)
	if err != nil {
		panic(err)
	}
	done, _ := q.Complete(ctx, c, result)
	fmt.Println(j.Type, done.State, strings.ToUpper(string(done.Result)))
	// Output: send-email succeeded SENT TO ADA@EXAMPLE.COM
}

// A batch of typed jobs goes in as one EnqueueMany: two round trips.
func ExampleEnqueueArgsMany() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "mail", exampleConfig("typed-many"))
	if err != nil {
		panic(err)
	}
	jobs, err := jobkey.EnqueueArgsMany(ctx, q, []jobkey.ArgsSpec[SendEmail]{
		{Args: SendEmail{To: "ada@example.com", Subject: "Hello"}},
		{Args: SendEmail{To: "grace@example.com", Subject: "Hello"}, Opts: &jobkey.EnqueueOpts{ID: "welcome-grace"}},
	})
	if err != nil {
		panic(err)
	}
	j, _ := q.Get(ctx, "welcome-grace")
	a, _ := jobkey.DecodeArgs[SendEmail](j)
	fmt.Println(len(jobs), jobs[1].ID, jobs[0].Type, a.To)
	// Output: 2 welcome-grace send-email grace@example.com
}

// Jobs with a concurrency key run at most the key's limit at a time,
// across every worker and process: here, one customer's exports two at a
// time, whatever else the queue holds.
func ExampleQueue_SetConcurrencyLimit() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "exports", exampleConfig("limit"))
	if err != nil {
		panic(err)
	}
	if err := q.SetConcurrencyLimit(ctx, "customer-42", 2); err != nil {
		panic(err)
	}
	for range 5 {
		if _, err := q.Enqueue(ctx, "export", nil, &jobkey.EnqueueOpts{ConcurrencyKey: "customer-42"}); err != nil {
			panic(err)
		}
	}
	claimed := 0
	for {
		_, err := q.Claim(ctx, "worker-1")
		if errors.Is(err, jobkey.ErrNoJob) {
			break
		}
		if err != nil {
			panic(err)
		}
		claimed++
	}
	info, err := q.Concurrency(ctx, "customer-42")
	if err != nil {
		panic(err)
	}
	fmt.Printf("claimed %d; key %s: limit %d, active %d, waiting %d\n", claimed, info.Key, info.Limit, info.Active, info.Waiting)
	// Output:
	// claimed 2; key customer-42: limit 2, active 2, waiting 3
}

// A rate limit caps how many of a key's jobs start within any period,
// across every worker and process: here, at most 3 calls to one partner's
// API per second, however many run at once. The jobs over the rate stay
// pending, holding no worker, until the rate lets them start.
func ExampleQueue_SetRateLimit() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "webhooks", exampleConfig("rate"))
	if err != nil {
		panic(err)
	}
	// The concurrency limit still holds (1 by default): allow 10 at once.
	if err := q.SetConcurrencyLimit(ctx, "partner-7", 10); err != nil {
		panic(err)
	}
	if err := q.SetRateLimit(ctx, "partner-7", 3, time.Second); err != nil {
		panic(err)
	}
	for range 5 {
		if _, err := q.Enqueue(ctx, "deliver", nil, &jobkey.EnqueueOpts{ConcurrencyKey: "partner-7"}); err != nil {
			panic(err)
		}
	}
	started := 0
	for {
		_, err := q.Claim(ctx, "worker-1")
		if errors.Is(err, jobkey.ErrNoJob) {
			break
		}
		if err != nil {
			panic(err)
		}
		started++
	}
	info, err := q.Concurrency(ctx, "partner-7")
	if err != nil {
		panic(err)
	}
	fmt.Printf("started %d; key %s: %d per %v, %d started in the last one\n", started, info.Key, info.Rate, info.RatePeriod, info.Started)
	// Output:
	// started 3; key partner-7: 3 per 1s, 3 started in the last one
}
