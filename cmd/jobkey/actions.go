package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/jobkey/jobkey"
)

// jobCommands are the commands that inspect and act on the jobs of live
// queues, by name.
var jobCommands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{
	"ls":     lsCmd,
	"show":   showCmd,
	"retry":  retryAction.run,
	"cancel": cancelAction.run,
	"delete": deleteAction.run,
	"pause": func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		return pauseCmd(ctx, "pause", args, stdout, stderr)
	},
	"resume": func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		return pauseCmd(ctx, "resume", args, stdout, stderr)
	},
	"queues":    queuesCmd,
	"limit":     limitCmd,
	"workers":   workersCmd,
	"schedules": schedulesCmd,
	"batches":   batchesCmd,
	"batch":     batchCmd,
	"events":    eventsCmd,
}

// action is one of the commands that change jobs: by ID, or in bulk with
// -all.
type action struct {
	name string // the command: retry, cancel or delete
	past string // what a done job is: retried, canceled, deleted
	// states are the states -all acts on. With more than one, -state
	// chooses (and is required); with one, it is implied.
	states []jobkey.State
	// one acts on one job and returns the state it is left in ("" when it
	// is gone).
	one func(ctx context.Context, q *jobkey.Queue, id string) (string, error)
	// bulk acts on every job of state s and type typ ("" for every type).
	bulk func(ctx context.Context, q *jobkey.Queue, s jobkey.State, typ string) (jobkey.BulkResult, error)
}

var (
	retryAction = action{
		name: "retry", past: "retried", states: []jobkey.State{jobkey.StateFailed},
		one: func(ctx context.Context, q *jobkey.Queue, id string) (string, error) {
			j, err := q.Retry(ctx, id)
			return stateOf(j), err
		},
		bulk: func(ctx context.Context, q *jobkey.Queue, _ jobkey.State, typ string) (jobkey.BulkResult, error) {
			return q.RetryFailed(ctx, typ)
		},
	}
	cancelAction = action{
		name: "cancel", past: "canceled", states: []jobkey.State{jobkey.StatePending},
		one: func(ctx context.Context, q *jobkey.Queue, id string) (string, error) {
			j, err := q.Cancel(ctx, id)
			return stateOf(j), err
		},
		bulk: func(ctx context.Context, q *jobkey.Queue, _ jobkey.State, typ string) (jobkey.BulkResult, error) {
			return q.CancelPending(ctx, typ)
		},
	}
	deleteAction = action{
		name: "delete", past: "deleted", states: []jobkey.State{jobkey.StateSucceeded, jobkey.StateFailed, jobkey.StateCanceled},
		one: func(ctx context.Context, q *jobkey.Queue, id string) (string, error) {
			return "", q.Delete(ctx, id)
		},
		bulk: func(ctx context.Context, q *jobkey.Queue, s jobkey.State, typ string) (jobkey.BulkResult, error) {
			return q.DeleteFinished(ctx, s, typ)
		},
	}
)

func stateOf(j *jobkey.Job) string {
	if j == nil {
		return ""
	}
	return j.State.String()
}

// errNotConfirmed makes a bulk action without -yes exit non-zero after
// saying what it would do.
var errNotConfirmed = errors.New("nothing changed: add -yes to do it")

// jobOutcome is what an action did to one job, as -json prints it.
type jobOutcome struct {
	ID string `json:"id"`
	OK bool   `json:"ok"` // done, and with -min-replicas confirmed by the replicas
	// MasterOnly is set when the job was done on the master only: the
	// replicas did not confirm it, and Error says how many did.
	MasterOnly bool   `json:"master_only,omitempty"`
	State      string `json:"state,omitempty"` // the state the job was left in
	Error      string `json:"error,omitempty"`
}

// bulkOutcome is what a bulk action did, as -json prints it.
type bulkOutcome struct {
	Action     string `json:"action"`
	State      string `json:"state"`
	Type       string `json:"type"`
	Done       int    `json:"done"`
	Skipped    int    `json:"skipped"`
	Unreadable int    `json:"unreadable"`
	// MasterOnly counts the jobs of Done whose write the replicas did not
	// confirm (-min-replicas): done on the master only, where the action
	// stopped.
	MasterOnly int `json:"master_only"`
	// MissingShards are the shards that could not be read, whose jobs
	// were left as they are; Error says why the action did not do
	// everything.
	MissingShards []int  `json:"missing_shards,omitempty"`
	Error         string `json:"error,omitempty"`
}

// run is the command: act on the job IDs given, or with -all on every
// job of a state (and type), only once -yes confirms it.
func (a action) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		all, yes, asJSON bool
		typ, stateName   string
		state            = a.states[0]
	)
	q, ids, closeQ, err := liveQueueOperands(ctx, a.name, args, stderr, &replicaFlags{}, func(fs *flag.FlagSet) {
		fs.BoolVar(&all, "all", false, fmt.Sprintf("%s every %s job (of -type), instead of the IDs given", a.name, a.allStates()))
		fs.StringVar(&typ, "type", "", "with -all: only jobs of this type (default: every type)")
		fs.BoolVar(&yes, "yes", false, "with -all: do it (without -yes it only says what it would do)")
		fs.BoolVar(&asJSON, "json", false, "print one JSON document instead of a table")
		if len(a.states) > 1 {
			fs.StringVar(&stateName, "state", "", "with -all: the state of the jobs, "+a.allStates()+" (required)")
		}
	}, func(ids []string) error {
		switch {
		case all && len(ids) > 0:
			return fmt.Errorf("%s: give job IDs or -all, not both", a.name)
		case !all && len(ids) == 0:
			return fmt.Errorf("%s: give job IDs, or -all", a.name)
		case !all && (typ != "" || stateName != ""):
			return fmt.Errorf("%s: -type and -state go with -all only", a.name)
		case all && len(a.states) > 1:
			var err error
			if state, err = parseState(stateName, a.states...); err != nil {
				return fmt.Errorf("%s: %w", a.name, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer closeQ()
	if all {
		return a.runAll(ctx, q, state, typ, yes, asJSON, stdout)
	}
	return a.runIDs(ctx, q, ids, asJSON, stdout)
}

// allStates names the states -all can act on: "failed", or "succeeded,
// failed or canceled".
func (a action) allStates() string {
	s := ""
	for i, st := range a.states {
		switch {
		case i == 0:
		case i == len(a.states)-1:
			s += " or "
		default:
			s += ", "
		}
		s += st.String()
	}
	return s
}

// runIDs acts on each job of ids in turn, prints what became of each, and
// fails with the first error when any job could not be acted on, or was
// acted on on the master only (its replicas did not confirm the write). A
// single ID that fails prints nothing but the error.
func (a action) runIDs(ctx context.Context, q *jobkey.Queue, ids []string, asJSON bool, stdout io.Writer) error {
	outcomes := make([]jobOutcome, 0, len(ids))
	var first error
	failed, unsafe := 0, 0
	for _, id := range ids {
		st, err := a.one(ctx, q, id)
		err = masterOnly(fmt.Sprintf("%s: job %q %s", a.name, id, a.past), err)
		o := jobOutcome{ID: id, OK: err == nil, State: st}
		switch {
		case errors.Is(err, jobkey.ErrNotReplicated):
			o.MasterOnly, o.Error = true, notConfirmed(err)
			unsafe++
		case err != nil:
			o.Error = err.Error()
			failed++
		}
		if first == nil {
			first = err
		}
		outcomes = append(outcomes, o)
	}
	if len(ids) == 1 && first != nil {
		return first // its one line says it all
	}
	done := len(ids) - failed // as a bulk action counts: unsafe are done, on the master only
	if asJSON {
		if err := writeJSON(stdout, struct {
			Action     string       `json:"action"`
			Done       int          `json:"done"`
			MasterOnly int          `json:"master_only"`
			Failed     int          `json:"failed"`
			Jobs       []jobOutcome `json:"jobs"`
		}{a.name, done, unsafe, failed, outcomes}); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(stdout, "| id | outcome |")
		fmt.Fprintln(stdout, "|---|---|")
		for _, o := range outcomes {
			switch {
			case o.MasterOnly:
				fmt.Fprintf(stdout, "| %s | %s on the master only: %s |\n", cell(o.ID, 0), a.past, cell(o.Error, 0))
			case !o.OK:
				fmt.Fprintf(stdout, "| %s | not %s: %s |\n", cell(o.ID, 0), a.past, cell(o.Error, 0))
			case o.State != "":
				fmt.Fprintf(stdout, "| %s | %s, now %s |\n", cell(o.ID, 0), a.past, o.State)
			default:
				fmt.Fprintf(stdout, "| %s | %s |\n", cell(o.ID, 0), a.past)
			}
		}
		of := ""
		if unsafe > 0 {
			of = fmt.Sprintf(" (%d of them on the master only)", unsafe)
		}
		fmt.Fprintf(stdout, "\n%s: %d done%s, %d failed\n", a.name, done, of, failed)
	}
	switch {
	case failed == 0 && unsafe == 0:
		return nil
	case unsafe == 0:
		return fmt.Errorf("%s: %d of %d jobs not %s; the first: %w", a.name, failed, len(ids), a.past, first)
	}
	notDone := ""
	if failed > 0 {
		notDone = fmt.Sprintf(", and %d not %s", failed, a.past)
	}
	return fmt.Errorf("%s: %d of %d jobs %s on the master only, not confirmed by the replicas%s; the first: %w",
		a.name, unsafe, len(ids), a.past, notDone, first)
}

// runAll acts on every job of state s (and type typ) when yes confirms it;
// without yes it counts them, says so and fails.
func (a action) runAll(ctx context.Context, q *jobkey.Queue, s jobkey.State, typ string, yes, asJSON bool, stdout io.Writer) error {
	what := fmt.Sprintf("%s jobs", s)
	if typ != "" {
		what = fmt.Sprintf("%s jobs of type %q", s, typ)
	}
	if !yes {
		n, err := count(ctx, q, s, typ)
		var missing *jobkey.ShardsError
		switch {
		case errors.As(err, &missing):
			return fmt.Errorf("%s: would %s %d %s in queue %q in the shards that could be read (%v); %w",
				a.name, a.name, n, what, q.Name(), missing, errNotConfirmed)
		case err != nil:
			return err
		}
		return fmt.Errorf("%s: would %s %d %s in queue %q; %w", a.name, a.name, n, what, q.Name(), errNotConfirmed)
	}
	// What was done is printed whatever happened, then the error: a
	// bulk action that left out a shard, or stopped, did the rest.
	res, err := a.bulk(ctx, q, s, typ)
	if asJSON {
		out := bulkOutcome{Action: a.name, State: s.String(), Type: typ,
			Done: res.Done, Skipped: res.Skipped, Unreadable: res.Unreadable, MasterOnly: res.Unconfirmed, Error: errText(err)}
		var missing *jobkey.ShardsError
		if errors.As(err, &missing) {
			out.MissingShards = missing.Shards
		}
		if jerr := writeJSON(stdout, out); jerr != nil {
			return jerr
		}
	} else {
		fmt.Fprintln(stdout, "| action | state | type | done | skipped | unreadable | done on the master only |")
		fmt.Fprintln(stdout, "|---|---|---|---|---|---|---|")
		fmt.Fprintf(stdout, "| %s | %s | %s | %d | %d | %d | %d |\n", a.name, s, orDash(cell(typ, 0)), res.Done, res.Skipped, res.Unreadable, res.Unconfirmed)
	}
	return err
}

// count returns how many jobs of state s (and type typ) a bulk action
// would take: from Stats for every type (one round trip per node), else
// by paging through List. Shards that cannot be read are left out of the
// count and named by a *ShardsError beside it.
func count(ctx context.Context, q *jobkey.Queue, s jobkey.State, typ string) (int64, error) {
	var missing *jobkey.ShardsError
	if typ == "" {
		st, err := q.Stats(ctx)
		if err != nil && !errors.As(err, &missing) {
			return 0, err
		}
		switch s {
		case jobkey.StatePending:
			return st.Pending, err
		case jobkey.StateSucceeded:
			return st.Succeeded, err
		case jobkey.StateFailed:
			return st.Failed, err
		case jobkey.StateCanceled:
			return st.Canceled, err
		}
		return st.Active, err
	}
	var n int64
	var partial error
	o := jobkey.ListOpts{State: s, Type: typ, Limit: jobkey.MaxListLimit}
	for {
		page, err := q.List(ctx, o)
		switch {
		case errors.As(err, &missing):
			partial = err
		case err != nil:
			return 0, err
		}
		n += int64(len(page.Jobs))
		if page.Next == "" {
			return n, partial
		}
		o.Cursor = page.Next
	}
}

// limitCmd prints a concurrency key's limit and what holds it, and with
// a second operand sets the limit (0: back to the default); -rate N/PERIOD
// sets its rate limit (0: none).
func limitCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var asJSON bool
	var rateArg string
	set := -1
	q, ops, closeQ, err := liveQueueOperands(ctx, "limit", args, stderr, &replicaFlags{}, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print one JSON document instead of a line")
		fs.StringVar(&rateArg, "rate", "", fmt.Sprintf("set the key's rate limit: N/PERIOD, at most N starts within any PERIOD (3/1s, 100/1m; N up to %d), or 0 for none", jobkey.MaxRateLimit))
	}, func(ops []string) error {
		switch len(ops) {
		case 0:
			if rateArg != "" {
				return errors.New("limit: -rate needs a key: limit -queue Q KEY -rate N/PERIOD")
			}
			return nil
		case 1:
			return nil
		case 2:
			n, err := strconv.Atoi(ops[1])
			if err != nil || n < 0 || n > jobkey.MaxConcurrencyLimit {
				return fmt.Errorf("limit: the limit must be 0..%d (0: none of its own, so each worker's Config.ConcurrencyLimit holds the key), got %q",
					jobkey.MaxConcurrencyLimit, ops[1])
			}
			set = n
			return nil
		}
		return errors.New("limit: want no key (every key), or a concurrency key and optionally its new limit: limit -queue Q [KEY [N]]")
	})
	if err != nil {
		return err
	}
	defer closeQ()
	if len(ops) == 0 {
		return listLimits(ctx, q, asJSON, stdout)
	}
	rate, period, err := parseRate(rateArg)
	if err != nil {
		return err
	}
	if set >= 0 {
		if err := q.SetConcurrencyLimit(ctx, ops[0], set); err != nil {
			return masterOnly(fmt.Sprintf("limit: the limit of key %q set", ops[0]), err)
		}
	}
	if rateArg != "" {
		if err := q.SetRateLimit(ctx, ops[0], rate, period); err != nil {
			if errors.Is(err, jobkey.ErrNotReplicated) {
				return masterOnly(fmt.Sprintf("limit: the rate of key %q set", ops[0]), err)
			}
			if set >= 0 {
				// Say what was done: the limit was written, the rate not.
				return fmt.Errorf("limit: the limit of key %q was set to %d, but its rate was not: %w", ops[0], set, err)
			}
			return err
		}
	}
	info, err := q.Concurrency(ctx, ops[0])
	if err != nil {
		return err
	}
	// A key without a limit of its own is held by each worker's
	// Config.ConcurrencyLimit, which Redis does not store: the command's
	// own default would say nothing of the workers', so it says none.
	var limit *int
	if info.Own {
		limit = &info.Limit
	}
	if asJSON {
		return writeJSON(stdout, struct {
			Queue   string    `json:"queue"`
			Key     string    `json:"key"`
			Limit   *int      `json:"limit"` // null: none of its own
			Default bool      `json:"default"`
			Active  int       `json:"active"`
			Waiting int       `json:"waiting"`
			Rate    *rateJSON `json:"rate,omitempty"` // absent: no rate limit
		}{q.Name(), info.Key, limit, !info.Own, info.Active, info.Waiting, rateOf(info)})
	}
	held := fmt.Sprintf("limit %d (its own)", info.Limit)
	if !info.Own {
		// info.Limit is then the command's own Config.ConcurrencyLimit,
		// left at jobkey's default.
		held = fmt.Sprintf("no limit of its own, so each worker's Config.ConcurrencyLimit holds it (not stored in Redis: this command cannot tell it; jobkey's default is %d)",
			info.Limit)
	}
	rated := ""
	if info.Rate > 0 {
		rated = fmt.Sprintf("; rate %d per %v, %d started in the last %v", info.Rate, info.RatePeriod, info.Started, info.RatePeriod)
	}
	fmt.Fprintf(stdout, "key %s of queue %q: %s, %d active, %d waiting%s\n", line(info.Key), q.Name(), held, info.Active, info.Waiting, rated)
	return nil
}

// rateJSON is a key's rate limit in limit's JSON.
type rateJSON struct {
	N       int    `json:"n"`
	Period  string `json:"period"`
	Started int    `json:"started"` // starts within the last period
}

func rateOf(info jobkey.ConcurrencyInfo) *rateJSON {
	if info.Rate == 0 {
		return nil
	}
	return &rateJSON{N: info.Rate, Period: info.RatePeriod.String(), Started: info.Started}
}

// parseRate reads limit's -rate: "N/PERIOD", or "0" for none. An empty
// argument sets nothing (rate -1).
func parseRate(s string) (int, time.Duration, error) {
	if s == "" {
		return -1, 0, nil
	}
	if s == "0" {
		return 0, 0, nil
	}
	ns, ps, ok := strings.Cut(s, "/")
	n, err := strconv.Atoi(ns)
	if !ok || err != nil || n < 1 || n > jobkey.MaxRateLimit {
		return 0, 0, fmt.Errorf("limit: -rate wants N/PERIOD with N from 1 to %d (3/1s, 100/1m), or 0 for none; got %q", jobkey.MaxRateLimit, s)
	}
	d, err := time.ParseDuration(ps)
	if err != nil || d < time.Millisecond || d > jobkey.MaxRatePeriod || d%time.Millisecond != 0 {
		return 0, 0, fmt.Errorf("limit: -rate's PERIOD must be whole milliseconds from 1ms to %v (3/1s, 100/1m); got %q", jobkey.MaxRatePeriod, s)
	}
	return n, d, nil
}

// pauseCmd pauses (or with resume, resumes) a queue's claims.
func pauseCmd(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	var asJSON bool
	rf := &replicaFlags{}
	q, closeQ, err := liveQueue(ctx, name, args, stderr, rf, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print one JSON document instead of a line")
	})
	if err != nil {
		return err
	}
	defer closeQ()
	paused := name == "pause"
	if paused {
		err = q.Pause(ctx)
	} else {
		err = q.Resume(ctx)
	}
	if err != nil {
		// With -min-replicas a shard the replicas did not confirm was
		// written on the master only: the error says which, and the
		// command exits non-zero.
		return &named{name: name, err: err}
	}
	if asJSON {
		return writeJSON(stdout, struct {
			Queue  string `json:"queue"`
			Paused bool   `json:"paused"`
		}{q.Name(), paused})
	}
	if paused {
		fmt.Fprintf(stdout, "queue %q paused: workers take no new jobs until resume; jobs in flight finish, enqueues are accepted\n", q.Name())
	} else {
		fmt.Fprintf(stdout, "queue %q resumed\n", q.Name())
	}
	return nil
}

// named is err, said as the command name's: "pause: 1 of 8 shards ...".
type named struct {
	name string
	err  error
}

func (e *named) Error() string { return e.name + ": " + strings.TrimPrefix(e.err.Error(), "jobkey: ") }

func (e *named) Unwrap() error { return e.err }

// listLimits prints every concurrency key of q that Redis holds a value
// for (Queue.ConcurrencyKeys).
func listLimits(ctx context.Context, q *jobkey.Queue, asJSON bool, stdout io.Writer) error {
	keys, more, err := q.ConcurrencyKeys(ctx)
	var missing *jobkey.ShardsError
	if err != nil && !errors.As(err, &missing) {
		return fmt.Errorf("limit: %w", err)
	}
	if asJSON {
		type keyJSON struct {
			Key     string    `json:"key"`
			Limit   *int      `json:"limit"` // null: none of its own
			Active  int       `json:"active"`
			Waiting int       `json:"waiting"`
			Rate    *rateJSON `json:"rate,omitempty"`
			Error   string    `json:"error,omitempty"`
		}
		out := make([]keyJSON, 0, len(keys))
		for _, k := range keys {
			v := keyJSON{Key: k.Key, Active: k.Active, Waiting: k.Waiting, Rate: rateOf(k)}
			if k.Own {
				v.Limit = &k.Limit
			}
			if k.Err != nil {
				v.Error = k.Err.Error()
			}
			out = append(out, v)
		}
		doc := struct {
			Queue   string    `json:"queue"`
			Keys    []keyJSON `json:"keys"`
			More    bool      `json:"more"`
			Missing string    `json:"missing,omitempty"` // the shards left out, and why
		}{q.Name(), out, more, ""}
		if missing != nil {
			doc.Missing = missing.Error()
		}
		if err := writeJSON(stdout, doc); err != nil {
			return err
		}
		if missing != nil {
			return errPartial
		}
		return nil
	}
	if missing != nil {
		defer fmt.Fprintf(stdout, "\n%v\n", missing)
	}
	if len(keys) == 0 {
		fmt.Fprintf(stdout, "no concurrency key of queue %q has a value in Redis\n", q.Name())
		return partial(missing)
	}
	fmt.Fprintln(stdout, "| key | limit | active | waiting | rate | started in period |")
	fmt.Fprintln(stdout, "|---|---|---|---|---|---|")
	for _, k := range keys {
		if k.Err != nil {
			fmt.Fprintf(stdout, "| %s | unreadable: %s | | | | |\n", cell(k.Key, 0), cell(k.Err.Error(), 0))
			continue
		}
		limit, rate, started := "workers' default", "-", "-"
		if k.Own {
			limit = strconv.Itoa(k.Limit)
		}
		if k.Rate > 0 {
			rate, started = fmt.Sprintf("%d per %v", k.Rate, k.RatePeriod), strconv.Itoa(k.Started)
		}
		fmt.Fprintf(stdout, "| %s | %s | %d | %d | %s | %s |\n", cell(k.Key, 0), limit, k.Active, k.Waiting, rate, started)
	}
	if more {
		fmt.Fprintf(stdout, "\nthe first %d keys, by name: the queue has more\n", jobkey.MaxConcurrencyKeysListed)
	}
	return partial(missing)
}

// partial is errPartial when shards were left out.
func partial(missing *jobkey.ShardsError) error {
	if missing != nil {
		return errPartial
	}
	return nil
}
