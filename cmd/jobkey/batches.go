package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/jobkey/jobkey"
)

// batchView is one batch as batches and batch -json print it.
type batchView struct {
	ID        string     `json:"id"`
	Total     int        `json:"total"`
	Pending   int        `json:"pending"`
	Succeeded int        `json:"succeeded"`
	Failed    int        `json:"failed"`
	Canceled  int        `json:"canceled"`
	Condition string     `json:"condition"`
	Callback  string     `json:"callback_type"`
	Fired     string     `json:"fired"`
	FiredAt   *time.Time `json:"fired_at,omitempty"`
	CreatedAt *time.Time `json:"created_at,omitempty"`
	After     string     `json:"after,omitempty"`
}

func batchViewOf(b *jobkey.Batch) batchView {
	cond := "finished"
	if b.Condition == jobkey.BatchAllSucceeded {
		cond = "succeeded"
	}
	return batchView{ID: b.ID, Total: b.Total, Pending: b.Pending, Succeeded: b.Succeeded, Failed: b.Failed, Canceled: b.Canceled,
		Condition: cond, Callback: b.Callback.Type, Fired: b.Fired.String(), FiredAt: timePtr(b.FiredAt), CreatedAt: timePtr(b.CreatedAt), After: b.After}
}

// batchesCmd lists a queue's newest batches with their progress.
func batchesCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var asJSON bool
	var limit int
	q, _, closeQ, err := liveQueueOperands(ctx, "batches", args, stderr, nil, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print one JSON document instead of a table")
		fs.IntVar(&limit, "limit", 20, "how many batches, newest first (1..1000)")
	}, func(operands []string) error {
		if len(operands) != 0 {
			return errors.New("batches: takes no operand: batches -queue Q [-limit N]")
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer closeQ()
	bs, err := q.Batches(ctx, limit)
	if asJSON {
		views := make([]batchView, len(bs))
		for i, b := range bs {
			views[i] = batchViewOf(b)
		}
		doc := struct {
			Batches []batchView `json:"batches"`
			Error   string      `json:"error,omitempty"`
		}{Batches: views, Error: errText(err)}
		if jerr := writeJSON(stdout, doc); jerr != nil {
			return jerr
		}
		return err
	}
	if len(bs) == 0 && err == nil {
		fmt.Fprintln(stdout, "no batches")
		return nil
	}
	fmt.Fprintf(stdout, "%-28s %-20s %9s %7s %9s %6s %8s %-9s %s\n", "ID", "CALLBACK", "PROGRESS", "PENDING", "SUCCEEDED", "FAILED", "CANCELED", "WAITS FOR", "FIRED")
	for _, b := range bs {
		v := batchViewOf(b)
		fmt.Fprintf(stdout, "%-28s %-20s %9s %7d %9d %6d %8d %-9s %s\n", cell(b.ID, 28), cell(v.Callback, 20), progress(b),
			b.Pending, b.Succeeded, b.Failed, b.Canceled, v.Condition, v.Fired)
	}
	if err != nil {
		return fmt.Errorf("batches: some batches could not be read (the others are listed): %w", err)
	}
	return nil
}

// progress is how many of b's jobs have finished, of all of them.
func progress(b *jobkey.Batch) string {
	return strconv.Itoa(b.Total-b.Pending) + "/" + strconv.Itoa(b.Total)
}

// batchCmd prints one batch: its counts, its condition and its callback.
func batchCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var asJSON bool
	q, ids, closeQ, err := liveQueueOperands(ctx, "batch", args, stderr, nil, func(fs *flag.FlagSet) {
		fs.BoolVar(&asJSON, "json", false, "print the batch as JSON instead of text")
	}, func(operands []string) error {
		if len(operands) != 1 {
			return fmt.Errorf("batch: want one batch ID, got %d", len(operands))
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer closeQ()
	b, err := q.Batch(ctx, ids[0])
	if err != nil {
		return err
	}
	v := batchViewOf(b)
	if asJSON {
		return writeJSON(stdout, v)
	}
	field := func(name, v string) { fmt.Fprintf(stdout, "%-13s %s\n", name+":", v) }
	field("id", line(b.ID))
	field("progress", progress(b)+" finished")
	field("pending", strconv.Itoa(b.Pending))
	field("succeeded", strconv.Itoa(b.Succeeded))
	field("failed", strconv.Itoa(b.Failed))
	field("canceled", strconv.Itoa(b.Canceled))
	field("waits for", "all "+v.Condition)
	field("callback", line(b.Callback.Type)+" (job "+line(b.ID)+")")
	field("fired", v.Fired)
	if !b.FiredAt.IsZero() {
		field("fired at", when(b.FiredAt))
	}
	field("created", when(b.CreatedAt))
	if b.After != "" {
		field("after", "batch "+line(b.After)+" writes its job")
	}
	return nil
}
