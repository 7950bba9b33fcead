package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jobkey/jobkey"
)

// workersCmd lists the Works running on a queue (Queue.Workers).
func workersCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var asJSON bool
	q, closeQ, err := liveQueue(ctx, "workers", args, stderr, nil, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print one JSON document instead of a table")
	})
	if err != nil {
		return err
	}
	defer closeQ()
	ws, err := q.Workers(ctx)
	if err != nil {
		return fmt.Errorf("workers: %w", err)
	}
	if asJSON {
		type view struct {
			jobkey.WorkerInfo
			Error string `json:"error,omitempty"`
		}
		vs := make([]view, len(ws))
		for i, w := range ws {
			vs[i] = view{WorkerInfo: w}
			if w.Err != nil {
				vs[i].Error = w.Err.Error()
			}
		}
		return writeJSON(stdout, struct {
			Queue   string `json:"queue"`
			Workers []view `json:"workers"`
		}{q.Name(), vs})
	}
	if len(ws) == 0 {
		fmt.Fprintf(stdout, "no worker of queue %q has reported itself within a Lease\n", q.Name())
		return nil
	}
	now := time.Now()
	fmt.Fprintln(stdout, "| worker | host | pid | queues | busy | version | started | running |")
	fmt.Fprintln(stdout, "|---|---|---|---|---|---|---|---|")
	for _, w := range ws {
		if w.Err != nil {
			fmt.Fprintf(stdout, "| %s | ? | ? | ? | ? | ? | ? | unreadable: %s |\n", cell(w.Name, 0), cell(w.Err.Error(), 0))
			continue
		}
		var runs []string
		for _, r := range w.Running {
			runs = append(runs, fmt.Sprintf("%s (%s, attempt %d, %s)", r.ID, r.Type, r.Attempt, since(now, r.StartedAt)))
		}
		if more := w.Busy - len(w.Running); more > 0 {
			runs = append(runs, fmt.Sprintf("and %d more", more))
		}
		fmt.Fprintf(stdout, "| %s | %s | %d | %s | %d/%d | %s | %s | %s |\n", cell(w.Name, 0), cell(w.Host, 0), w.PID,
			cell(strings.Join(w.Queues, ", "), 0), w.Busy, w.Slots, cell(w.Version, 0), since(now, w.StartedAt)+" ago", cell(strings.Join(runs, "; "), 0))
	}
	return nil
}

// since is how long ago t was, to the second.
func since(now, t time.Time) string {
	if t.IsZero() {
		return "?"
	}
	return now.Sub(t).Round(time.Second).String()
}

// scheduleView is one periodic schedule as the workers that keep it
// report it, with its last tick's job as Redis holds it.
type scheduleView struct {
	jobkey.ScheduleInfo
	KeptBy       []string `json:"kept_by"`
	LastJobState string   `json:"last_job_state,omitempty"` // "" when the tick has no job (yet, or any more)
}

// schedulesCmd lists the periodic schedules the running Works keep, from
// their reports: a schedule no running Work keeps has no ticks, and is
// not listed.
func schedulesCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var asJSON bool
	q, closeQ, err := liveQueue(ctx, "schedules", args, stderr, nil, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print one JSON document instead of a table")
	})
	if err != nil {
		return err
	}
	defer closeQ()
	vs, err := schedules(ctx, q)
	if err != nil {
		return fmt.Errorf("schedules: %w", err)
	}
	if asJSON {
		return writeJSON(stdout, struct {
			Queue     string         `json:"queue"`
			Schedules []scheduleView `json:"schedules"`
		}{q.Name(), vs})
	}
	if len(vs) == 0 {
		fmt.Fprintf(stdout, "no running worker of queue %q keeps a periodic schedule\n", q.Name())
		return nil
	}
	fmt.Fprintln(stdout, "| schedule | spec | type | next tick (UTC) | last tick (UTC) | its job | state | kept by |")
	fmt.Fprintln(stdout, "|---|---|---|---|---|---|---|---|")
	for _, v := range vs {
		fmt.Fprintf(stdout, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", cell(v.Name, 0), cell(v.Spec, 0), cell(v.Type, 0),
			tick(v.NextTick), tick(v.LastTick), cell(v.LastJobID, 0), cell(cmpOr(v.LastJobState, "-"), 0), cell(strings.Join(v.KeptBy, ", "), 0))
	}
	return nil
}

func tick(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.DateTime)
}

func cmpOr(s, or string) string {
	if s == "" {
		return or
	}
	return s
}

// schedules gathers the schedules of every running Work of q: one view per
// name, spec and type (workers of two deploys may disagree), with the
// state of the last tick's job.
func schedules(ctx context.Context, q *jobkey.Queue) ([]scheduleView, error) {
	ws, err := q.Workers(ctx)
	if err != nil {
		return nil, err
	}
	var vs []scheduleView
	for _, w := range ws {
		for _, s := range w.Schedules {
			i := slices.IndexFunc(vs, func(v scheduleView) bool {
				return v.Name == s.Name && v.Spec == s.Spec && v.Type == s.Type
			})
			if i < 0 {
				vs = append(vs, scheduleView{ScheduleInfo: s})
				i = len(vs) - 1
			} else if s.LastTick.After(vs[i].LastTick) || s.NextTick.Before(vs[i].NextTick) && !s.NextTick.IsZero() {
				// The freshest report's ticks.
				vs[i].ScheduleInfo = s
			}
			vs[i].KeptBy = append(vs[i].KeptBy, w.Name)
		}
	}
	slices.SortFunc(vs, func(a, b scheduleView) int { return strings.Compare(a.Name+"\x00"+a.Spec, b.Name+"\x00"+b.Spec) })
	for i := range vs {
		if vs[i].LastJobID == "" {
			continue
		}
		j, err := q.Get(ctx, vs[i].LastJobID)
		switch {
		case errors.Is(err, jobkey.ErrNotFound):
		case err != nil:
			vs[i].LastJobState = "unreadable: " + err.Error()
		default:
			vs[i].LastJobState = j.State.String()
			if j.State == jobkey.StateFailed {
				vs[i].LastJobState += " (attempt " + strconv.Itoa(j.Attempt) + ")"
			}
		}
	}
	return vs, nil
}
