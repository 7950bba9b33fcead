package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redact"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// connect opens url: a single Redis, or, when that server says it is a
// cluster node, the cluster it belongs to, or the master that Sentinels
// name (redis+sentinel://). It fails at once, in one line, when Redis
// cannot be reached.
func connect(ctx context.Context, url string) (redis.UniversalClient, error) {
	url, _, err := splitReplicaParams(url) // the writes' setting, not go-redis's
	if err != nil {
		return nil, err
	}
	if isSentinelURL(url) {
		return connectSentinel(ctx, url)
	}
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("-redis %s: not a Redis URL: %w", redact.URL(url), redact.Error(err, url))
	}
	o.DialTimeout, o.MaxRetries = 2*time.Second, 1
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	c := redis.NewClient(o)
	info, err := c.Info(ctx, "cluster").Result()
	var answered redis.Error // Redis answered, with an error (a wrong password, an ACL)
	switch {
	case err != nil && errors.As(err, &answered):
		c.Close()
		return nil, fmt.Errorf("connect to Redis at %s: %w", o.Addr, err)
	case err != nil && ctx.Err() == nil:
		c.Close()
		return nil, &jobkey.UnreachableError{Addr: o.Addr, Err: err}
	case err != nil:
		c.Close()
		return nil, err
	}
	if !strings.Contains(info, "cluster_enabled:1") {
		return c, nil
	}
	c.Close()
	if o.TLSConfig != nil {
		// ParseURL names the first node's host; every node has its own.
		o.TLSConfig = o.TLSConfig.Clone()
		o.TLSConfig.ServerName = ""
	}
	return redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: []string{o.Addr}, Username: o.Username, Password: o.Password, TLSConfig: o.TLSConfig,
		DialTimeout: o.DialTimeout, MaxRetries: o.MaxRetries, MaintNotificationsConfig: o.MaintNotificationsConfig,
	}), nil
}

// reachable says, at once and in one line, when the Redis at url cannot
// be reached, instead of a run that counts every call as an error.
func reachable(ctx context.Context, url string, embedded bool) error {
	if embedded {
		return nil
	}
	rdb, err := connect(ctx, url)
	if err != nil {
		return err
	}
	return rdb.Close()
}

// liveQueue parses the flags that name a live queue and opens it with the
// shard count the queue stored in Redis when it was created. It refuses
// operands. A command that writes passes rf: its writes wait for the
// replicas it says (replicas.go); nil for one that only reads.
func liveQueue(ctx context.Context, name string, args []string, stderr io.Writer, rf *replicaFlags, extra func(*flag.FlagSet)) (*jobkey.Queue, func(), error) {
	q, _, closeQ, err := liveQueueOperands(ctx, name, args, stderr, rf, extra, func(operands []string) error {
		if len(operands) > 0 {
			return fmt.Errorf("%s: unexpected arguments %q", name, operands)
		}
		return nil
	})
	return q, closeQ, err
}

// liveQueueOperands is liveQueue for commands that take operands (job
// IDs): flags and operands may come in any order ("--" ends the flags), and
// check judges the operands and the command's own flags before anything
// connects.
func liveQueueOperands(ctx context.Context, name string, args []string, stderr io.Writer, rf *replicaFlags, extra func(*flag.FlagSet),
	check func(operands []string) error) (*jobkey.Queue, []string, func(), error) {
	q, _, operands, closeQ, err := openLive(ctx, name, args, stderr, rf, extra, check)
	return q, operands, closeQ, err
}

// openLive is liveQueueOperands that also returns the client it opened.
func openLive(ctx context.Context, name string, args []string, stderr io.Writer, rf *replicaFlags, extra func(*flag.FlagSet),
	check func(operands []string) error) (*jobkey.Queue, redis.UniversalClient, []string, func(), error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	redisURL := fs.String("redis", "", "Redis URL, required (default: $REDIS_URL; rediss:// for TLS; a cluster node opens the cluster; "+
		"redis+sentinel://[:password@]host:port[,host:port]/mastername[/db] asks Sentinels)")
	queue := fs.String("queue", "", "queue name (required)")
	prefix := fs.String("prefix", "jobkey", "key prefix of the queue")
	if rf != nil {
		rf.register(fs)
	}
	if extra != nil {
		extra(fs)
	}
	operands, err := parseInterleaved(fs, args)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if *queue == "" {
		return nil, nil, nil, nil, fmt.Errorf("%s: -queue is required", name)
	}
	url, err := requireURL(name, *redisURL)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	var waits replicaSetting
	if rf != nil {
		if waits, err = rf.resolve(url); err != nil {
			return nil, nil, nil, nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	if err := check(operands); err != nil {
		return nil, nil, nil, nil, err
	}
	rdb, err := connect(ctx, url)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	q, err := openQueue(ctx, rdb, *prefix, *queue, waits)
	if err != nil {
		rdb.Close()
		return nil, nil, nil, nil, err
	}
	return q, rdb, operands, func() { rdb.Close() }, nil
}

// requireURL returns the -redis flag's URL, else REDIS_URL. Commands that
// inspect a live queue never fall back to an embedded server: it would
// hold no queue, and its empty counts would read as all clear.
func requireURL(name, flagURL string) (string, error) {
	if flagURL == "" {
		flagURL = os.Getenv("REDIS_URL")
	}
	if flagURL == "" {
		return "", fmt.Errorf("%s: -redis (or REDIS_URL) is required: it inspects a live queue", name)
	}
	return flagURL, nil
}

// openQueue opens the queue name under prefix with the shard count it
// stored in Redis, its writes waiting for replicas as waits says; a queue
// never created is ErrNotFound.
func openQueue(ctx context.Context, rdb redis.UniversalClient, prefix, name string, waits replicaSetting) (*jobkey.Queue, error) {
	shards, err := jobkey.LookupShards(ctx, rdb, prefix, name)
	if err != nil {
		return nil, err
	}
	return jobkey.NewQueue(rdb, name, waits.config(prefix, shards))
}

// parseInterleaved parses args with fs, taking flags that follow operands
// too (`show ID -json`). Everything after "--" is an operand.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	refuseRepeats(fs)
	var operands []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return operands, nil
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(operands, rest...), nil
		}
		operands = append(operands, rest[0])
		args = rest[1:]
	}
}

// errPartial makes a command exit non-zero when some shards were not read.
var errPartial = errors.New("some shards could not be read: the figures above leave them out")

func statsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var history bool
	var since, ahead, step, retention, failedRetention time.Duration
	q, rdb, _, closeQ, err := openLive(ctx, "stats", args, stderr, nil, func(fs *flag.FlagSet) {
		fs.BoolVar(&history, "history", false, "print the jobs finished per -step over the last -since, and those scheduled over the next -ahead, counted from the indexes")
		fs.DurationVar(&since, "since", time.Hour, "with -history: how far back")
		fs.DurationVar(&ahead, "ahead", 0, "with -history: how far ahead to count scheduled jobs")
		fs.DurationVar(&step, "step", time.Minute, "with -history: the width of a row")
		fs.DurationVar(&retention, "retention", 24*time.Hour, "with -history: the Config.Retention the queue's workers keep finished jobs for (Redis does not store it): the counts are exact that far back")
		fs.DurationVar(&failedRetention, "failed-retention", 7*24*time.Hour, "with -history: the workers' Config.FailedRetention, likewise for failed jobs")
	}, func(operands []string) error {
		if len(operands) > 0 {
			return fmt.Errorf("stats: unexpected arguments %q", operands)
		}
		if history && (since < 0 || ahead < 0 || since+ahead <= 0) {
			return fmt.Errorf("stats: -since %v and -ahead %v: want a span after -history", since, ahead)
		}
		if retention <= 0 || failedRetention <= 0 {
			return fmt.Errorf("stats: -retention %v and -failed-retention %v: want durations above 0", retention, failedRetention)
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer closeQ()
	if history {
		return printThroughput(ctx, q, since, ahead, step, retention, failedRetention, stdout)
	}
	st, err := q.Stats(ctx)
	var missing *jobkey.ShardsError
	if err != nil && !errors.As(err, &missing) {
		return err
	}
	fmt.Fprintf(stdout, "| queue | pending | due | scheduled | active | stuck handlers | expired leases | succeeded | failed | canceled | corrupt | newer format | vanished | paused |\n")
	fmt.Fprintf(stdout, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(stdout, "| %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %s |\n", q.Name(),
		st.Pending, st.Due, st.Scheduled, st.Active, st.StuckHandlers, st.ExpiredLeases, st.Succeeded, st.Failed, st.Canceled, st.Corrupt,
		st.Newer, st.Vanished, yesNo(st.Paused))
	// What a failover would lose: the replicas each master has, and how far
	// behind they are. An ACL without +info leaves the table out.
	if repl, err := replication(ctx, rdb); err == nil {
		printReplication(stdout, repl)
	} else {
		fmt.Fprintf(stdout, "\nreplication: cannot read INFO replication: %v\n", err)
	}
	if missing != nil {
		fmt.Fprintf(stdout, "\n%v\n", missing)
		return errPartial
	}
	return nil
}

// errFindings makes verify exit non-zero after printing its table.
var errFindings = errors.New("verify: the indexes disagree with the values")

func verifyCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o jobkey.VerifyOpts
	q, closeQ, err := liveQueue(ctx, "verify", args, stderr, &replicaFlags{}, func(fs *flag.FlagSet) {
		fs.BoolVar(&o.Fix, "fix", false, "re-derive the index entries of every finding from its value (values are never written)")
		fs.BoolVar(&o.Keys, "keys", false, "also scan the keyspace for job values no index lists (costs a walk of the whole database)")
	})
	if err != nil {
		return err
	}
	defer closeQ()
	rep, err := q.Verify(ctx, &o)
	var missing *jobkey.ShardsError
	if err != nil && !errors.As(err, &missing) {
		return err
	}
	fmt.Fprintf(stdout, "%d job values and %d index entries read in queue %q\n", rep.Jobs, rep.Entries, q.Name())
	if rep.Newer > 0 {
		fmt.Fprintf(stdout, "%d values in a newer format, left for a newer jobkey to judge\n", rep.Newer)
	}
	fmt.Fprintln(stdout)
	unfixed := 0
	if len(rep.Findings) == 0 {
		fmt.Fprintln(stdout, "no findings: every index entry read agrees with its value")
	} else {
		fmt.Fprintln(stdout, "| job | finding | detail | fixed |")
		fmt.Fprintln(stdout, "|---|---|---|---|")
		for _, f := range rep.Findings {
			fmt.Fprintf(stdout, "| %s | %s | %s | %v |\n", f.ID, f.Kind, f.Detail, f.Fixed)
			if !f.Fixed {
				unfixed++
			}
		}
	}
	switch {
	case missing != nil && errors.Is(missing, jobkey.ErrNotReplicated):
		fmt.Fprintf(stdout, "\n%v\n", missing)
		for _, e := range missing.Errs {
			if errors.Is(e, jobkey.ErrNotReplicated) {
				return masterOnly("verify: a fix (of a finding above, not marked fixed) written", e)
			}
		}
		return errPartial
	case missing != nil:
		fmt.Fprintf(stdout, "\n%v\n", missing)
		return errPartial
	case unfixed > 0:
		return fmt.Errorf("%w: %d findings", errFindings, unfixed)
	}
	return nil
}

// printThroughput prints the queue's history (Queue.Throughput) as a table,
// a row per step, and from when each finished count is exact: by the
// retentions the workers keep, which the operator gives (the queue this
// command opens has the defaults, and Redis does not store the workers').
func printThroughput(ctx context.Context, q *jobkey.Queue, since, ahead, step, retention, failedRetention time.Duration, stdout io.Writer) error {
	now := time.Now()
	th, err := q.Throughput(ctx, now.Add(-since), now.Add(ahead), step)
	var missing *jobkey.ShardsError
	if err != nil && !errors.As(err, &missing) {
		return fmt.Errorf("stats: %w", err)
	}
	fmt.Fprintf(stdout, "| from (UTC) | succeeded | failed | canceled | scheduled |\n|---|---|---|---|---|\n")
	for _, b := range th.Buckets {
		fmt.Fprintf(stdout, "| %s | %d | %d | %d | %d |\n", b.Start.UTC().Format(time.DateTime), b.Succeeded, b.Failed, b.Canceled, b.Scheduled)
	}
	fmt.Fprintf(stdout, "\nexact since: succeeded and canceled %s, failed %s, for workers that keep finished jobs -retention %v and failed ones -failed-retention %v "+
		"(their Config.Retention and FailedRetention); deleted jobs, and jobs with a Retention of their own, are not counted where they finished\n",
		th.Now.Add(-retention).UTC().Format(time.DateTime), th.Now.Add(-failedRetention).UTC().Format(time.DateTime), retention, failedRetention)
	if missing != nil {
		fmt.Fprintf(stdout, "\n%v\n", missing)
		return errPartial
	}
	return nil
}
