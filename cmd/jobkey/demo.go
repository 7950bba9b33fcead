package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/bench"
	"github.com/jobkey/jobkey/internal/multikey"
	"github.com/redis/go-redis/v9"
)

func demoCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	redisURL := fs.String("redis", "", "Redis URL (default: $REDIS_URL, else an embedded miniredis)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	url, embedded, stop, err := server(*redisURL, stderr)
	if err != nil {
		return err
	}
	defer stop()
	if err := reachable(ctx, url, embedded); err != nil {
		return err
	}
	rdb, err := bench.Client(url, &bench.Probe{}, 4)
	if err != nil {
		return err
	}
	defer rdb.Close()
	prefix := "demo" + strings.ToLower(jobkey.NewID()[20:])
	defer bench.Cleanup(context.WithoutCancel(ctx), rdb, prefix)

	if err := demoMultikey(ctx, stdout, rdb, prefix+":mk"); err != nil {
		return err
	}
	return demoJobkey(ctx, stdout, rdb, prefix+":jk", embedded)
}

type row struct{ step, op, result, after string }

func table(w io.Writer, rows []row) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "step\toperation\tresult\tkeyspace afterwards")
	fmt.Fprintln(tw, "----\t---------\t------\t-------------------")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.step, r.op, r.result, r.after)
	}
	_ = tw.Flush()
}

// demoMultikey runs the failing group of docs/design.md: the pending key
// holds a string, so step 2 errors while applying and steps 1 and 3 stay.
func demoMultikey(ctx context.Context, w io.Writer, rdb *redis.Client, prefix string) error {
	q := multikey.New(rdb, prefix, "jobs")
	q.Compensate = false // show what the group itself leaves behind
	if err := rdb.Set(ctx, q.PendingKey(), "a string, not a list", 0).Err(); err != nil {
		return err
	}
	res, err := q.Enqueue(ctx, "8123", []byte(`{"to":"ada@example.com"}`))
	var ge *multikey.GroupError
	if !errors.As(err, &ge) {
		return fmt.Errorf("multikey demo: want a failed step, got %v", err)
	}
	recordThere := rdb.Exists(ctx, q.JobKey("8123")).Val() == 1
	count := rdb.Get(ctx, q.CountKey()).Val()
	pendingType := rdb.Type(ctx, q.PendingKey()).Val()

	fmt.Fprintln(w, "== multi-key design: one MULTI/EXEC group, three steps, one error while applying")
	fmt.Fprintln(w)
	result := func(i int) string {
		if res.Steps[i].Err != nil {
			return "errored"
		}
		return "applied"
	}
	after := map[bool]string{true: "record present", false: "no record"}
	table(w, []row{
		{"1", "HSET " + q.JobKey("8123") + " (the job record)", result(0), after[recordThere]},
		{"2", "LPUSH " + q.PendingKey() + " 8123", result(1), "pending unchanged (still a " + pendingType + ")"},
		{"3", "INCR " + q.CountKey() + " (queued-count)", result(2), "count = " + count + ", includes the invisible job"},
	})
	fmt.Fprintln(w)
	fmt.Fprintf(w, "returned to caller: one result per step -> %s\n", strings.TrimPrefix(ge.Error(), "multikey: group step failed: "))
	fmt.Fprintf(w, "step 2 error: %v\n", res.Steps[1].Err)
	fmt.Fprintln(w, "stored state: a record no consumer can see, and a count that disagrees with the set;")
	fmt.Fprintln(w, "nothing in Redis remembers the steps belonged together. Repair needs the caller's")
	fmt.Fprintln(w, "compensation (lost if it dies) or a sweeper that runs forever.")
	fmt.Fprintln(w)
	return nil
}

// demoJobkey injects the same fault: the index the enqueue writes holds a
// string. The type check in the first round trip refuses it before MULTI.
// The embedded server cannot answer INFO memory, and never evicts: it
// skips the eviction check.
func demoJobkey(ctx context.Context, w io.Writer, rdb *redis.Client, prefix string, embedded bool) error {
	q, err := jobkey.NewQueue(rdb, "jobs", &jobkey.Config{Prefix: prefix, Shards: 4, SkipEvictionCheck: embedded})
	if err != nil {
		return err
	}
	keys := q.Keys("8123")
	ready, jobKey := keys.Ready, keys.Job
	if err := rdb.Set(ctx, ready, "a string, not a zset", 0).Err(); err != nil {
		return err
	}
	_, err = q.Enqueue(ctx, "email", []byte(`{"to":"ada@example.com"}`), &jobkey.EnqueueOpts{ID: "8123"})
	if !errors.Is(err, jobkey.ErrWrongType) {
		return fmt.Errorf("jobkey demo: want ErrWrongType, got %v", err)
	}
	recordThere := rdb.Exists(ctx, jobKey).Val() == 1

	fmt.Fprintln(w, "== jobkey: the same fault (the index the enqueue writes holds a string)")
	fmt.Fprintln(w)
	after := "no record written"
	if recordThere {
		after = "RECORD PRESENT (this would be a bug)"
	}
	table(w, []row{
		{"1", "WATCH+GET " + jobKey + "; TYPE " + ready, "read", "nothing written yet"},
		{"", "  -> " + ready + " is a string, not a zset", "refused", "transaction not sent"},
		{"2", "MULTI; SET job value; ZADD ready; PUBLISH wake; EXEC", "not sent", after + "; ready unchanged"},
	})
	fmt.Fprintln(w)
	fmt.Fprintf(w, "returned to caller: %v\n", err)
	if !recordThere {
		fmt.Fprintln(w, "  -> the call refused as a whole: nothing was written")
	}

	// Every other job keeps flowing on the healthy shards.
	flowed := 0
	for i := 0; flowed < 5 && i < 100; i++ {
		id := fmt.Sprintf("other-%d", i)
		if _, err := q.Enqueue(ctx, "email", nil, &jobkey.EnqueueOpts{ID: id}); errors.Is(err, jobkey.ErrWrongType) {
			continue // this ID hashes to the broken shard too
		} else if err != nil {
			return err
		}
		j, err := q.Claim(ctx, "demo-worker")
		if err != nil {
			return err
		}
		if _, err := q.Complete(ctx, j, nil); err != nil {
			return err
		}
		flowed++
	}
	fmt.Fprintf(w, "other jobs: %d enqueued, claimed and completed on the healthy shards meanwhile\n", flowed)
	fmt.Fprintln(w, "stored state: exactly what it was before the call; there is nothing to repair.")
	return nil
}
