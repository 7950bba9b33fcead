package jobkey_test

import (
	"context"
	"fmt"

	"github.com/jobkey/jobkey"
)

// With events on, every transition of a job appends an event to its
// shard's stream in the transition's own EXEC; Events reads them from a
// cursor that any process can resume from.
func ExampleQueue_Events() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "mail", exampleConfig("events"))
	if err != nil {
		panic(err)
	}
	if err := q.EnableEvents(ctx); err != nil {
		panic(err)
	}
	q.Enqueue(ctx, "send", nil, &jobkey.EnqueueOpts{ID: "mail-1"})
	j, _ := q.Claim(ctx, "worker-1")
	q.Complete(ctx, j, nil)

	page, err := q.Events(ctx, "", 10)
	if err != nil {
		panic(err)
	}
	for _, e := range page.Events {
		if e.Kind != jobkey.EventTransition {
			fmt.Println(e.Kind)
			continue
		}
		from := "new" // From is 0 for an enqueue, To for a deletion
		if e.From != 0 {
			from = e.From.String()
		}
		fmt.Printf("%s: %s -> %v, attempt %d, worker %q\n", e.Job, from, e.To, e.Attempt, e.Worker)
	}
	// A reader keeps page.Cursor, and resumes from it, here or elsewhere.
	q.Enqueue(ctx, "send", nil, &jobkey.EnqueueOpts{ID: "mail-2"})
	next, _ := q.Events(ctx, page.Cursor, 10)
	fmt.Println(len(next.Events), next.Events[0].Job)
	// Output:
	// enabled
	// mail-1: new -> pending, attempt 0, worker ""
	// mail-1: pending -> active, attempt 1, worker "worker-1"
	// mail-1: active -> succeeded, attempt 1, worker "worker-1"
	// 1 mail-2
}
