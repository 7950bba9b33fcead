package jobkey_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jobkey/jobkey"
)

// ConcurrencyKeys lists every concurrency key Redis holds a value for,
// with its limit, use and rate: an operator's view of who is throttled.
func ExampleQueue_ConcurrencyKeys() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "api-calls", exampleConfig("keys"))
	if err != nil {
		panic(err)
	}
	if err := q.SetConcurrencyLimit(ctx, "customer-7", 2); err != nil {
		panic(err)
	}
	if err := q.SetRateLimit(ctx, "customer-9", 10, time.Second); err != nil {
		panic(err)
	}
	keys, more, err := q.ConcurrencyKeys(ctx)
	if err != nil {
		panic(err)
	}
	for _, k := range keys {
		fmt.Printf("%s: own limit %v (%d), %d active, rate %d per %v\n", k.Key, k.Own, k.Limit, k.Active, k.Rate, k.RatePeriod)
	}
	fmt.Println("more:", more)
	// Output:
	// customer-7: own limit true (2), 0 active, rate 0 per 0s
	// customer-9: own limit false (1), 0 active, rate 10 per 1s
	// more: false
}
