package jobkey_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jobkey/jobkey"
)

// CountByType reads the values behind the indexes and counts each type in
// each state: no per-type counter is kept that could drift.
func ExampleQueue_CountByType() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "notify", exampleConfig("bytype"))
	if err != nil {
		panic(err)
	}
	for _, typ := range []string{"email", "email"} {
		if _, err := q.Enqueue(ctx, typ, nil, nil); err != nil {
			panic(err)
		}
	}
	if _, err := q.Enqueue(ctx, "sms", nil, &jobkey.EnqueueOpts{Delay: time.Hour}); err != nil {
		panic(err)
	}
	j, err := q.Claim(ctx, "worker-1")
	if err != nil {
		panic(err)
	}
	if _, err := q.Complete(ctx, j, nil); err != nil {
		panic(err)
	}
	tc, err := q.CountByType(ctx, 0)
	if err != nil {
		panic(err)
	}
	for _, t := range tc.Types {
		fmt.Printf("%s: %d pending, %d succeeded\n", t.Type, t.Pending, t.Succeeded)
	}
	fmt.Println("complete:", tc.Complete)
	// Output:
	// email: 1 pending, 1 succeeded
	// sms: 1 pending, 0 succeeded
	// complete: true
}
