package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/jobkey/jobkey"
	"github.com/redis/go-redis/v9"
)

// liveQueue parses the flags that name a live queue and opens it.
func liveQueue(name string, args []string, stderr io.Writer, extra func(*flag.FlagSet)) (*jobkey.Queue, func(), error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	redisURL := fs.String("redis", "", "Redis URL (default: $REDIS_URL; rediss:// for TLS)")
	queue := fs.String("queue", "", "queue name (required)")
	prefix := fs.String("prefix", "jobkey", "key prefix of the queue")
	shards := fs.Int("shards", 1, "the queue's Config.Shards")
	if extra != nil {
		extra(fs)
	}
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	if *queue == "" {
		fs.Usage()
		return nil, nil, fmt.Errorf("%s: -queue is required", name)
	}
	url, _, stop, err := server(*redisURL, stderr)
	if err != nil {
		return nil, nil, err
	}
	o, err := redis.ParseURL(url)
	if err != nil {
		stop()
		return nil, nil, err
	}
	rdb := redis.NewClient(o)
	q, err := jobkey.NewQueue(rdb, *queue, &jobkey.Config{Prefix: *prefix, Shards: *shards})
	if err != nil {
		rdb.Close()
		stop()
		return nil, nil, err
	}
	return q, func() { rdb.Close(); stop() }, nil
}

func statsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	q, closeQ, err := liveQueue("stats", args, stderr, nil)
	if err != nil {
		return err
	}
	defer closeQ()
	st, err := q.Stats(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "| queue | pending | due | scheduled | active | expired leases | succeeded | failed | canceled | corrupt |\n")
	fmt.Fprintf(stdout, "|---|---|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(stdout, "| %s | %d | %d | %d | %d | %d | %d | %d | %d | %d |\n", q.Name(),
		st.Pending, st.Due, st.Scheduled, st.Active, st.ExpiredLeases, st.Succeeded, st.Failed, st.Canceled, st.Corrupt)
	return nil
}

// errFindings makes verify exit non-zero after printing its table.
var errFindings = errors.New("verify: the indexes disagree with the values")

func verifyCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var fix bool
	q, closeQ, err := liveQueue("verify", args, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&fix, "fix", false, "re-derive the index entries of every finding from its value (values are never written)")
	})
	if err != nil {
		return err
	}
	defer closeQ()
	rep, err := q.Verify(ctx, fix)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d job values and %d index entries read in queue %q\n\n", rep.Jobs, rep.Entries, q.Name())
	if len(rep.Findings) == 0 {
		fmt.Fprintln(stdout, "no findings: every index entry agrees with its value")
		return nil
	}
	fmt.Fprintln(stdout, "| job | finding | detail | fixed |")
	fmt.Fprintln(stdout, "|---|---|---|---|")
	for _, f := range rep.Findings {
		fmt.Fprintf(stdout, "| %s | %s | %s | %v |\n", f.ID, f.Kind, f.Detail, f.Fixed)
	}
	return fmt.Errorf("%w: %d findings", errFindings, len(rep.Findings))
}
