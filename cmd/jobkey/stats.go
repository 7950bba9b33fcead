package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/jobkey/jobkey"
	"github.com/redis/go-redis/v9"
)

func statsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	fs.SetOutput(stderr)
	redisURL := fs.String("redis", "", "Redis URL (default: $REDIS_URL)")
	queue := fs.String("queue", "", "queue name (required)")
	prefix := fs.String("prefix", "jobkey", "key prefix of the queue")
	shards := fs.Int("shards", 1, "the queue's Config.Shards")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *queue == "" {
		fs.Usage()
		return fmt.Errorf("stats: -queue is required")
	}
	url, _, stop, err := server(*redisURL, stderr)
	if err != nil {
		return err
	}
	defer stop()
	o, err := redis.ParseURL(url)
	if err != nil {
		return err
	}
	rdb := redis.NewClient(o)
	defer rdb.Close()
	q, err := jobkey.NewQueue(rdb, *queue, &jobkey.Config{Prefix: *prefix, Shards: *shards})
	if err != nil {
		return err
	}
	st, err := q.Stats(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "| queue | pending | due | scheduled | active | expired leases | succeeded | failed | canceled |\n")
	fmt.Fprintf(stdout, "|---|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(stdout, "| %s | %d | %d | %d | %d | %d | %d | %d | %d |\n", *queue,
		st.Pending, st.Due, st.Scheduled, st.Active, st.ExpiredLeases, st.Succeeded, st.Failed, st.Canceled)
	return nil
}
