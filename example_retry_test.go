package jobkey_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobkey/jobkey"
)

// A handler that meets a 429 snoozes its job for the Retry-After the
// receiver gave: the job runs again then, and the attempt is not spent.
// A 503 is retried after its own delay, and spends the attempt.
func ExampleSnooze() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "webhooks", exampleConfig("snooze"))
	if err != nil {
		panic(err)
	}
	q.Enqueue(ctx, "deliver", []byte("429"), &jobkey.EnqueueOpts{ID: "hook-1", MaxAttempts: 3})
	q.Enqueue(ctx, "deliver", []byte("503"), &jobkey.EnqueueOpts{ID: "hook-2", MaxAttempts: 3})

	for range 2 {
		j, err := q.Claim(ctx, "worker-1")
		if err != nil {
			panic(err)
		}
		var cause error
		if string(j.Payload) == "429" {
			cause = jobkey.Snooze(30 * time.Second) // the receiver's Retry-After
		} else {
			cause = jobkey.RetryAfter(10*time.Second, errors.New("503 from endpoint"))
		}
		j, err = q.Fail(ctx, j, cause)
		if err != nil {
			panic(err)
		}
		fmt.Println(j.ID, j.State, "attempt", j.Attempt, "snoozes", j.Snoozes, "due in", j.RunAt.Sub(j.UpdatedAt))
	}
	// Unordered output:
	// hook-1 pending attempt 0 snoozes 1 due in 30s
	// hook-2 pending attempt 1 snoozes 0 due in 10s
}

// A retry policy sees the job and the handler's error: here a Work retries
// a timeout soon, gives up on a bad request at once, and a type of its own
// waits longer (WithRetryPolicy in a Mux).
func ExampleRetryPolicy() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "webhooks", exampleConfig("retrypolicy"))
	if err != nil {
		panic(err)
	}
	errBadRequest := errors.New("400 bad request")
	policy := func(j *jobkey.Job, err error) jobkey.RetryDecision {
		if errors.Is(err, errBadRequest) {
			return jobkey.RetryDecision{GiveUp: true}
		}
		return jobkey.RetryDecision{Delay: time.Duration(j.Attempt) * time.Minute}
	}
	slow := func(*jobkey.Job, error) jobkey.RetryDecision { return jobkey.RetryDecision{Delay: time.Hour} }
	fail := func(err error) jobkey.Handler {
		return jobkey.HandlerFunc(func(context.Context, *jobkey.Job) ([]byte, error) { return nil, err })
	}
	mux := jobkey.Mux{
		"deliver": fail(errors.New("timeout")),
		"invalid": fail(errBadRequest),
		"report":  jobkey.WithRetryPolicy(fail(errors.New("timeout")), slow),
	}
	for _, typ := range []string{"deliver", "invalid", "report"} {
		q.Enqueue(ctx, typ, nil, &jobkey.EnqueueOpts{ID: typ})
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- q.Work(wctx, mux, &jobkey.WorkOpts{RetryPolicy: policy}) }()
	for _, id := range []string{"deliver", "invalid", "report"} {
		for {
			j, err := q.Get(ctx, id)
			if err != nil {
				panic(err)
			}
			if len(j.History) > 0 && j.State != jobkey.StateActive {
				if j.State == jobkey.StateFailed {
					fmt.Println(id, j.State, j.LastError)
				} else {
					fmt.Println(id, j.State, "due in", j.RunAt.Sub(j.LeaseUntil))
				}
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	stop()
	<-done
	// Output:
	// deliver pending due in 1m0s
	// invalid failed 400 bad request
	// report pending due in 1h0m0s
}

// ReleaseAfter gives a job back without spending its attempt, due after a
// delay: a worker that finds a dependency down does not spin on it.
func ExampleQueue_ReleaseAfter() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "imports", exampleConfig("releaseafter"))
	if err != nil {
		panic(err)
	}
	q.Enqueue(ctx, "import", nil, nil)

	j, _ := q.Claim(ctx, "worker-1")
	j, err = q.ReleaseAfter(ctx, j, time.Minute)
	if err != nil {
		panic(err)
	}
	fmt.Println(j.State, j.Attempt, j.RunAt.Sub(j.UpdatedAt))
	// Output: pending 0 1m0s
}
