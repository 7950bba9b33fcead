// Command jobkey benchmarks jobkey against the multi-key queue design,
// shows the failing group (docs/design.md, section 1) beside jobkey, and inspects a
// live queue.
//
//	jobkey bench [flags]        run the benchmark scenarios, write a report
//	jobkey demo [flags]         the failing group, side by side
//	jobkey stats -queue NAME    a live queue's counts
//	jobkey verify -queue NAME   index entries that disagree with values (-fix)
//	jobkey ui [flags]           the web UI over the queues, on 127.0.0.1:8080
//
// Without -redis (or REDIS_URL) it runs on an embedded in-process server
// (miniredis), whose timings are not Redis timings.
//
// ls, show, retry, cancel, delete, pause, resume and queues inspect and act
// on the jobs of live queues, and need -redis (or REDIS_URL).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/alicebob/miniredis/v2"
	"github.com/jobkey/jobkey/internal/redact"
	"github.com/redis/go-redis/v9"
)

func main() {
	// SIGTERM stops the command as SIGINT does: whatever it set up is
	// cleaned away before it exits.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal ends the command at once, cleanup or not
	}()
	// go-redis logs every refused dial; the command reports errors itself,
	// in one line.
	redis.SetLogger(quiet{})
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, oneLine(err))
		}
		os.Exit(exitCode(err))
	}
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// oneLine is how the command prints an error: one line, prefixed once.
func oneLine(err error) string {
	s := strings.Join(strings.Fields(err.Error()), " ")
	if !strings.HasPrefix(s, "jobkey:") {
		s = "jobkey: " + s
	}
	return s
}

const usage = `usage: jobkey <command> [flags]

commands:
  bench   run the benchmark scenarios of both designs and write a report
  demo    reproduce the failing group of docs/design.md against both designs
  stats   print a live queue's counts (-history: finishes per step)
  verify  report (and with -fix repair) index entries that disagree with job values
  ui      serve the web UI over a Redis's queues (127.0.0.1:8080 by default)

jobs of a live queue (-redis or REDIS_URL required; -json for JSON):
  ls      list a page of jobs in one state: ls -queue Q -state S [-type T] [-limit N] [-cursor C]
  show    print one job, payload and result decoded: show -queue Q ID
  retry   put failed or canceled jobs back to pending: retry -queue Q ID... | -all [-type T] -yes
  cancel  cancel pending or active jobs: cancel -queue Q ID... | -all [-type T] -yes (pending ones)
  delete  delete pending or finished jobs: delete -queue Q ID... | -all -state S [-type T] -yes
  pause   stop workers taking new jobs of a queue: pause -queue Q
  resume  let them take jobs again: resume -queue Q
  queues  list every queue under a prefix with its counts: queues [-prefix P]
  limit   print a concurrency key's limit and use, or set it: limit -queue Q KEY [N]; every key: limit -queue Q
  workers    list the Works running on a queue, with their runs: workers -queue Q
  schedules  list the periodic schedules running Works keep, next and last ticks: schedules -queue Q
  batches list the newest batches with their progress: batches -queue Q [-limit N]
  batch   print one batch's counts and callback: batch -queue Q ID
  events  print a queue's transitions: events -queue Q [-follow] [-from CURSOR|start|now] [-enable|-disable]

adopting jobkey beside asynq (docs/adopting.md):
  migrate-asynq     move a type's waiting asynq tasks into a jobkey queue
  migrate-to-asynq  move a type's pending jobkey jobs back into asynq

Commands that write (retry, cancel, delete, limit, verify -fix, pause,
resume, events -enable/-disable, ui, migrate-*) wait for replicas with -min-replicas N and
-replica-timeout D, else the URL's min_replicas=N&replica_timeout=D, else
$JOBKEY_MIN_REPLICAS and $JOBKEY_REPLICA_TIMEOUT: a write they did not
confirm is reported as applied on the master only, and exits 1.

Each flag may be given once: a flag given twice is refused (the flag
package would let the last one win). Passwords in Redis URLs are never
printed: messages, logs and reports show them as xxxxx.

Run "jobkey <command> -h" for a command's flags.
`

// run runs the command of args. No password of a Redis URL it was given
// reaches stdout, stderr or the error it returns.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	urls := secretURLs(args)
	stdout, stderr = redactingWriter{stdout, urls}, redactingWriter{stderr, urls}
	return redact.Error(dispatch(ctx, args, stdout, stderr), urls...)
}

// dispatch runs the command named by args[0].
func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return flag.ErrHelp
	}
	switch args[0] {
	case "bench":
		return benchCmd(ctx, args[1:], stdout, stderr)
	case "demo":
		return demoCmd(ctx, args[1:], stdout, stderr)
	case "stats":
		return statsCmd(ctx, args[1:], stdout, stderr)
	case "verify":
		return verifyCmd(ctx, args[1:], stdout, stderr)
	case "ui":
		return uiCmd(ctx, args[1:], stdout, stderr)
	case "migrate-asynq":
		return migrateAsynqCmd(ctx, args[1:], stdout, stderr)
	case "migrate-to-asynq":
		return migrateToAsynqCmd(ctx, args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	if cmd, ok := jobCommands[args[0]]; ok {
		return cmd(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

// server returns the Redis URL to use: the flag, else REDIS_URL, else an
// embedded miniredis, stopped by the returned func.
func server(flagURL string, stderr io.Writer) (url string, embedded bool, stop func(), err error) {
	if flagURL == "" {
		flagURL = os.Getenv("REDIS_URL")
	}
	if flagURL != "" {
		return flagURL, false, func() {}, nil
	}
	m, err := miniredis.Run()
	if err != nil {
		return "", false, nil, fmt.Errorf("start embedded server: %w", err)
	}
	fmt.Fprintf(stderr, "No -redis URL or REDIS_URL given: running on an embedded in-process server (miniredis) at %s.\n"+
		"Its timings are NOT Redis timings; use them to try the command, not to compare designs.\n\n", m.Addr())
	return "redis://" + m.Addr(), true, m.Close, nil
}
