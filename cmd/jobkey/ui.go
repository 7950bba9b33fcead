package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/jobkey/jobkey"
	jobkeyui "github.com/jobkey/jobkey/jobkeyui"
	"github.com/redis/go-redis/v9"
)

// uiCmd serves the web UI (package jobkeyui) until ctx ends, then shuts
// the server down gracefully.
func uiCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ui", flag.ContinueOnError)
	fs.SetOutput(stderr)
	redisURL := fs.String("redis", "", "Redis URL, required (default: $REDIS_URL; rediss:// for TLS; a cluster node opens the cluster)")
	prefix := fs.String("prefix", "jobkey", "key prefix of the queues to show")
	addr := fs.String("addr", "127.0.0.1:8080", "address to listen on (loopback by default: the UI has no login of its own)")
	readOnly := fs.Bool("readonly", false, "hide and refuse every action (retry, cancel, delete, pause, resume)")
	retention := fs.Duration("retention", 0, "the Config.Retention the queues' workers keep finished jobs for (default jobkey's, 24h): Redis does not store it")
	failedRetention := fs.Duration("failed-retention", 0, "the workers' Config.FailedRetention (default jobkey's, 168h)")
	var rf replicaFlags
	rf.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	url := *redisURL
	if url == "" {
		url = os.Getenv("REDIS_URL")
	}
	switch {
	case url == "":
		return errors.New("ui: -redis (or REDIS_URL) is required: it shows live queues")
	case fs.NArg() > 0:
		return fmt.Errorf("ui: unexpected arguments %q", fs.Args())
	}
	waits, err := rf.resolve(url)
	if err != nil {
		return fmt.Errorf("ui: %w", err)
	}
	rdb, err := connect(ctx, url)
	if err != nil {
		return err
	}
	defer rdb.Close()
	// A bad prefix, or a Redis that refuses the scan, is said now rather
	// than on the first page.
	names, err := jobkey.Queues(ctx, rdb, *prefix)
	if err != nil {
		return fmt.Errorf("ui: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	h, err := jobkeyui.New(rdb, jobkeyui.Options{Prefix: *prefix, ReadOnly: *readOnly, Logger: log,
		MinReplicas: waits.minReplicas, ReplicaTimeout: waits.timeout, Retention: *retention, FailedRetention: *failedRetention})
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.Handle("/metrics", metricsOf(ctx, rdb, *prefix, names, log))

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("ui: %w", err)
	}
	if ip, ok := ln.Addr().(*net.TCPAddr); ok && !ip.IP.IsLoopback() {
		fmt.Fprintf(stderr, "warning: %s is reachable from other machines, and the UI has no login: anyone who reaches it can act on the queues (use -readonly, or put it behind your own auth)\n", ln.Addr())
	}
	mode := ""
	if *readOnly {
		mode = ", read-only"
	}
	fmt.Fprintf(stdout, "jobkey ui: %d queues under prefix %q at http://%s/%s, Prometheus metrics at /metrics (Ctrl-C stops)\n", len(names), *prefix, ln.Addr(), mode)

	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("ui: %w", err)
	case <-ctx.Done():
	}
	// Requests in flight get a few seconds to finish.
	stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(stopCtx); err != nil {
		return fmt.Errorf("ui: shutdown: %w", err)
	}
	<-served // http.ErrServerClosed
	return nil
}

// metricsOf opens the queues found at start and serves their depth gauges
// and compare-and-set counters for Prometheus (queueMetrics). Each scrape
// reads every queue's Stats. A queue created after the start is not in
// them until the command runs again; one whose shard count cannot be read
// is left out with a warning.
func metricsOf(ctx context.Context, rdb redis.UniversalClient, prefix string, names []string, log *slog.Logger) *queueMetrics {
	var queues []*jobkey.Queue
	for _, name := range names {
		shards, err := jobkey.LookupShards(ctx, rdb, prefix, name)
		if err != nil {
			log.Warn("jobkey ui: queue left out of /metrics", "queue", name, "err", err)
			continue
		}
		q, err := jobkey.NewQueue(rdb, name, &jobkey.Config{Prefix: prefix, Shards: shards, Logger: log})
		if err != nil {
			log.Warn("jobkey ui: queue left out of /metrics", "queue", name, "err", err)
			continue
		}
		queues = append(queues, q)
	}
	return newQueueMetrics(log, queues...)
}
