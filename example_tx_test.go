package jobkey_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jobkey/jobkey"
)

// An order and its confirmation job change together: the job is enqueued
// only if the order is still placed, in the same MULTI/EXEC that marks it
// confirming, and completed in the same MULTI/EXEC that marks it
// confirmed. The order's key holds the job's hash tag, so the two share a
// hash slot on a cluster too.
func ExampleQueue_EnqueueTx() {
	ctx := context.Background()
	rdb := exampleRedis()
	defer rdb.Close()
	cfg := exampleConfig("tx")
	q, err := jobkey.NewQueue(rdb, "orders", cfg)
	if err != nil {
		panic(err)
	}
	id := "confirm-order-42"
	tag, err := q.HashTag(id)
	if err != nil {
		panic(err)
	}
	orderKey := "shop-" + cfg.Prefix + ":order:" + tag + ":42"
	if err := rdb.HSet(ctx, orderKey, "status", "placed").Err(); err != nil {
		panic(err)
	}
	keys := []jobkey.TxKey{{Key: orderKey, Type: jobkey.KeyHash}}
	errNotPlaced := errors.New("order is not placed")

	// The function may run more than once (another client changed the
	// order meanwhile): it only reads and adds writes.
	confirm := func(tx *jobkey.Tx) error {
		if tx.HGetAll(orderKey)["status"] != "placed" {
			return errNotPlaced
		}
		tx.HSet(orderKey, "status", "confirming")
		tx.HSet(orderKey, "job", tx.Job().ID)
		return nil
	}
	j, err := q.EnqueueTx(ctx, "confirm", []byte("42"), &jobkey.EnqueueOpts{ID: id}, keys, confirm)
	fmt.Println("enqueued:", j.ID, err, rdb.HGet(ctx, orderKey, "status").Val())

	// Enqueued again (say, after a reply was lost): the job exists, and
	// nothing of the order's is written twice.
	_, err = q.EnqueueTx(ctx, "confirm", []byte("42"), &jobkey.EnqueueOpts{ID: id}, keys, confirm)
	fmt.Println("again:", errors.Is(err, jobkey.ErrJobExists))

	claimed, err := q.Claim(ctx, "worker-1")
	if err != nil {
		panic(err)
	}
	done, err := q.CompleteTx(ctx, claimed, []byte("ok"), keys, func(tx *jobkey.Tx) error {
		tx.HSet(orderKey, "status", "confirmed")
		return nil
	})
	fmt.Println("completed:", done.State, err, rdb.HGet(ctx, orderKey, "status").Val())
	// Output:
	// enqueued: confirm-order-42 <nil> confirming
	// again: true
	// completed: succeeded <nil> confirmed
}
