package jobkey_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jobkey/jobkey"
)

// Uniqueness by state: what an enqueue of a taken ID does depends on the
// stored job's state and the enqueue's IfExists.
func ExampleIfExists() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "sync", exampleConfig("ifexists"))
	if err != nil {
		panic(err)
	}
	opts := func(p jobkey.IfExists) *jobkey.EnqueueOpts {
		return &jobkey.EnqueueOpts{ID: "sync-account-7", IfExists: p, Delay: time.Minute}
	}
	if _, err := q.Enqueue(ctx, "sync", []byte("v1"), opts(jobkey.IfExistsRefuse)); err != nil {
		panic(err)
	}
	_, err = q.Enqueue(ctx, "sync", []byte("v2"), opts(jobkey.IfExistsRefuse))
	fmt.Println("refuse:", errors.Is(err, jobkey.ErrJobExists))

	j, err := q.Enqueue(ctx, "sync", []byte("v2"), opts(jobkey.IfExistsKeep))
	fmt.Println("keep:", string(j.Payload), err)

	// Debounce: the pending job takes the latest payload, and its run is
	// pushed back by the new Delay.
	j, err = q.Enqueue(ctx, "sync", []byte("v3"), opts(jobkey.IfExistsReplace))
	fmt.Println("replace:", string(j.Payload), j.State, err)
	// Output:
	// refuse: true
	// keep: v1 <nil>
	// replace: v3 pending <nil>
}

type reportArgs struct {
	Account   string `msgpack:"account"`
	RequestID string `msgpack:"request_id"`
}

func (reportArgs) Kind() string { return "report" }

// UniqueBy derives the ID from the arguments that count and a period: one
// report per account per hour, however many requests ask for it.
func ExampleUniqueBy() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, "reports", exampleConfig("uniqueby"))
	if err != nil {
		panic(err)
	}
	opts := &jobkey.EnqueueOpts{
		UniqueBy: &jobkey.UniqueBy{Fields: []string{"account"}, Period: time.Hour},
		IfExists: jobkey.IfExistsKeep,
	}
	a, err := jobkey.EnqueueArgs(ctx, q, reportArgs{Account: "acme", RequestID: "r1"}, opts)
	if err != nil {
		panic(err)
	}
	b, err := jobkey.EnqueueArgs(ctx, q, reportArgs{Account: "acme", RequestID: "r2"}, opts)
	if err != nil {
		panic(err)
	}
	c, err := jobkey.EnqueueArgs(ctx, q, reportArgs{Account: "globex", RequestID: "r3"}, opts)
	if err != nil {
		panic(err)
	}
	fmt.Println(a.ID == b.ID, a.ID == c.ID)
	first, err := jobkey.DecodeArgs[reportArgs](b)
	if err != nil {
		panic(err)
	}
	fmt.Println(first.RequestID)
	// Output:
	// true false
	// r1
}

// UniqueID is the derivation as a pure function: the same in every process
// and version, for a caller who names the time itself.
func ExampleUniqueID() {
	at := time.Date(2026, 12, 2, 10, 30, 0, 0, time.UTC)
	id, err := jobkey.UniqueID("email", []byte("hello"), jobkey.UniqueBy{Period: time.Hour}, at)
	if err != nil {
		panic(err)
	}
	fmt.Println(id)
	// Output:
	// u-190c08479bbdbcf6875e389a521bc7c3
}
