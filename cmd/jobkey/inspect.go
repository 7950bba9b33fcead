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

// lastErrorWidth is how many runes of a job's last error ls shows.
const lastErrorWidth = 60

// lsPage is ls's -json document.
type lsPage struct {
	Jobs       []jobView        `json:"jobs"`
	Unreadable []unreadableView `json:"unreadable"`
	Next       string           `json:"next"`
	// ScanStopped says the page read as many index entries as one page may
	// (Scanned) and holds fewer jobs than -limit: it is not the last page.
	ScanStopped bool `json:"scan_stopped"`
	Scanned     int  `json:"scanned"`
	// MissingShards are the shards that could not be read, whose jobs the
	// page leaves out; Error says why.
	MissingShards []int  `json:"missing_shards,omitempty"`
	Error         string `json:"error,omitempty"`
}

// unreadableView is an index entry whose value cannot be read.
type unreadableView struct {
	ID    string `json:"id"`
	Error string `json:"error"`
}

// lsCmd lists one page of a queue's jobs in one state.
func lsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		stateName, typ, cursor string
		limit                  int
		asJSON                 bool
		state                  jobkey.State
	)
	q, _, closeQ, err := liveQueueOperands(ctx, "ls", args, stderr, nil, func(fs *flag.FlagSet) {
		fs.StringVar(&stateName, "state", "", "state of the jobs to list (required): pending, active, succeeded, failed or canceled; or corrupt, the values claimers set aside")
		fs.StringVar(&typ, "type", "", "list only jobs of this type (default: every type)")
		fs.IntVar(&limit, "limit", jobkey.DefaultListLimit, fmt.Sprintf("jobs per page, 1 to %d", jobkey.MaxListLimit))
		fs.StringVar(&cursor, "cursor", "", "the next cursor a previous page printed")
		fs.BoolVar(&asJSON, "json", false, "print one JSON document instead of a table")
	}, func(operands []string) error {
		var err error
		corrupt := stateName == "corrupt"
		if !corrupt {
			state, err = parseState(stateName)
		}
		switch {
		case err != nil:
			return fmt.Errorf("ls: %w", err)
		case limit < 1 || limit > jobkey.MaxListLimit:
			return fmt.Errorf("ls: -limit %d: want 1 to %d", limit, jobkey.MaxListLimit)
		case len(operands) > 0:
			return fmt.Errorf("ls: unexpected arguments %q", operands)
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer closeQ()
	page, err := q.List(ctx, jobkey.ListOpts{State: state, Corrupt: stateName == "corrupt", Type: typ, Limit: limit, Cursor: cursor})
	var missing *jobkey.ShardsError
	if err != nil && !errors.As(err, &missing) {
		return err
	}
	if asJSON {
		doc := lsPage{Jobs: []jobView{}, Unreadable: []unreadableView{}, Next: page.Next, ScanStopped: page.ScanStopped, Scanned: page.Scanned}
		for _, j := range page.Jobs {
			doc.Jobs = append(doc.Jobs, viewOf(j))
		}
		for _, u := range page.Unreadable {
			doc.Unreadable = append(doc.Unreadable, unreadableView{ID: u.ID, Error: errText(u.Err)})
		}
		if missing != nil {
			doc.MissingShards, doc.Error = missing.Shards, missing.Error()
		}
		if err := writeJSON(stdout, doc); err != nil {
			return err
		}
	} else {
		printPage(stdout, q.Name(), page, state, stateName, typ, limit)
	}
	if missing != nil {
		if !asJSON {
			fmt.Fprintf(stdout, "\n%v\n", missing)
		}
		return errPartialPage
	}
	return nil
}

// errPartialPage makes ls exit non-zero when some shards were not read.
var errPartialPage = errors.New("some shards could not be read: the page above leaves their jobs out")

// printPage prints ls's table of page, and says when the page stopped
// at its bound of entries with fewer than limit jobs.
func printPage(stdout io.Writer, queue string, page *jobkey.JobPage, state jobkey.State, stateName, typ string, limit int) {
	label := state.String()
	if stateName == "corrupt" {
		label = "corrupt"
	}
	of := ""
	if typ != "" {
		of = fmt.Sprintf(" of type %q", typ)
	}
	stopped := ""
	if page.ScanStopped {
		stopped = fmt.Sprintf("this page stopped after reading %d entries, with %d of %d %s jobs%s: it is not the last page, more may follow\n",
			page.Scanned, len(page.Jobs)+len(page.Unreadable), limit, label, of)
	}
	if len(page.Jobs)+len(page.Unreadable) == 0 {
		// A page filtered by type may be empty and still have a next one.
		if page.Next == "" {
			fmt.Fprintf(stdout, "no %s jobs%s in queue %q\n", label, of, queue)
			return
		}
		fmt.Fprintf(stdout, "no %s jobs%s on this page of queue %q\n%s\nnext: %s\n", label, of, queue, stopped, page.Next)
		return
	}
	// Running jobs show what their handlers last reported (SetProgress).
	active := state == jobkey.StateActive && stateName != "corrupt"
	head, rule, tail := "", "", ""
	if active {
		head, rule, tail = " progress |", "---|", " - |"
	}
	fmt.Fprintf(stdout, "| id | type | state | attempt | %s | %s |%s\n", stateTimeHeader(state), errorHeader(state), head)
	fmt.Fprintln(stdout, "|---|---|---|---|---|---|"+rule)
	for _, j := range page.Jobs {
		progress := ""
		if active {
			progress = " " + progressCell(j.Progress) + " |"
		}
		fmt.Fprintf(stdout, "| %s | %s | %s | %d/%d | %s | %s |%s\n", cell(j.ID, 0), cell(j.Type, 0), j.State,
			j.Attempt, j.MaxAttempts, when(stateTime(j)), cell(j.LastError, lastErrorWidth), progress)
	}
	for _, u := range page.Unreadable {
		fmt.Fprintf(stdout, "| %s | (unreadable) | %s | - | - | %s |%s\n", cell(u.ID, 0), label, cell(errText(u.Err), 0), tail)
	}
	if stopped != "" {
		fmt.Fprintf(stdout, "\n%s", stopped)
	}
	if page.Next != "" {
		fmt.Fprintf(stdout, "\nnext: %s\n", page.Next)
	}
}

// errorHeader names ls's error column for jobs in state s: a succeeded
// job's error is an earlier attempt's, not its outcome.
func errorHeader(s jobkey.State) string {
	if s == jobkey.StateSucceeded {
		return "earlier error"
	}
	return "last error"
}

// errText is err's text, "" for nil.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// showCmd prints one job: every field, the payload and the result.
func showCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var asJSON bool
	q, ids, closeQ, err := liveQueueOperands(ctx, "show", args, stderr, nil, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print the job as JSON instead of text")
	}, func(operands []string) error {
		if len(operands) != 1 {
			return fmt.Errorf("show: want one job ID, got %d", len(operands))
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer closeQ()
	j, err := q.Get(ctx, ids[0])
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(stdout, viewOf(j))
	}
	printJob(stdout, j)
	return nil
}

// queueView is one queue as queues -json prints it.
type queueView struct {
	Name          string `json:"name"`
	Paused        bool   `json:"paused"`
	Pending       int64  `json:"pending"`
	Due           int64  `json:"due"`
	Scheduled     int64  `json:"scheduled"`
	Active        int64  `json:"active"`
	ExpiredLeases int64  `json:"expired_leases"`
	Succeeded     int64  `json:"succeeded"`
	Failed        int64  `json:"failed"`
	Canceled      int64  `json:"canceled"`
	Corrupt       int64  `json:"corrupt"`
	Error         string `json:"error,omitempty"` // the queue, or some of its shards, could not be read
	read          bool   // counts were read, of every shard or (with Error) of some
}

// errQueues makes queues exit non-zero after printing what it could read.
var errQueues = errors.New("queues: some queues could not be read")

// queuesCmd lists every queue under a prefix, found in Redis, with its
// counts.
func queuesCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("queues", flag.ContinueOnError)
	fs.SetOutput(stderr)
	redisURL := fs.String("redis", "", "Redis URL, required (default: $REDIS_URL; rediss:// for TLS; a cluster node opens the cluster)")
	prefix := fs.String("prefix", "jobkey", "key prefix of the queues")
	asJSON := fs.Bool("json", false, "print one JSON document instead of a table")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("queues: unexpected arguments %q", fs.Args())
	}
	url, err := requireURL("queues", *redisURL)
	if err != nil {
		return err
	}
	rdb, err := connect(ctx, url)
	if err != nil {
		return err
	}
	defer rdb.Close()
	names, err := jobkey.Queues(ctx, rdb, *prefix)
	if err != nil {
		return err
	}
	views := make([]queueView, 0, len(names))
	failed := 0
	for _, name := range names {
		v := queueView{Name: name}
		st, err := queueStats(ctx, rdb, *prefix, name)
		v.Paused, v.Pending, v.Due, v.Scheduled, v.Active = st.Paused, st.Pending, st.Due, st.Scheduled, st.Active
		v.ExpiredLeases, v.Succeeded, v.Failed, v.Canceled, v.Corrupt = st.ExpiredLeases, st.Succeeded, st.Failed, st.Canceled, st.Corrupt
		var missing *jobkey.ShardsError
		v.read = err == nil || errors.As(err, &missing)
		if err != nil {
			v.Error = err.Error()
			failed++
		}
		views = append(views, v)
	}
	if *asJSON {
		err = writeJSON(stdout, struct {
			Prefix string      `json:"prefix"`
			Queues []queueView `json:"queues"`
		}{*prefix, views})
	} else {
		printQueues(stdout, *prefix, views)
	}
	if err == nil && failed > 0 {
		err = fmt.Errorf("%w: %d of %d", errQueues, failed, len(names))
	}
	return err
}

// queueStats opens the queue name and reads its counts. A *ShardsError
// comes with the counts of the shards it read.
func queueStats(ctx context.Context, rdb redis.UniversalClient, prefix, name string) (jobkey.Stats, error) {
	q, err := openQueue(ctx, rdb, prefix, name, replicaSetting{})
	if err != nil {
		return jobkey.Stats{}, err
	}
	return q.Stats(ctx)
}

// printQueues prints queues' table, then the error of each queue that
// could not be read in full.
func printQueues(w io.Writer, prefix string, views []queueView) {
	if len(views) == 0 {
		fmt.Fprintf(w, "no queues under prefix %q\n", prefix)
		return
	}
	fmt.Fprintln(w, "| queue | paused | pending | due | scheduled | active | expired leases | succeeded | failed | canceled | corrupt |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, v := range views {
		if !v.read {
			fmt.Fprintf(w, "| %s | ? | ? | ? | ? | ? | ? | ? | ? | ? | ? |\n", cell(v.Name, 0))
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %d | %d | %d | %d | %d |\n", cell(v.Name, 0), yesNo(v.Paused),
			v.Pending, v.Due, v.Scheduled, v.Active, v.ExpiredLeases, v.Succeeded, v.Failed, v.Canceled, v.Corrupt)
	}
	for _, v := range views {
		if v.Error != "" {
			fmt.Fprintf(w, "\nqueue %s: %s\n", cell(v.Name, 0), cell(v.Error, 0))
		}
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// progressCell is a running job's progress in ls's table: its text when
// printable, cut to a cell, else its size.
func progressCell(p []byte) string {
	switch {
	case len(p) == 0:
		return "-"
	case printable(string(p), false):
		return cell(string(p), progressWidth)
	}
	return fmt.Sprintf("(%d bytes)", len(p))
}

// progressWidth bounds ls's progress column, in runes.
const progressWidth = 40
