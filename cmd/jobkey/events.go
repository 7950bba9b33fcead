package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jobkey/jobkey"
)

// eventsCmd prints a queue's event stream (jobkey.Queue.Events), or
// follows it (-follow) until interrupted, or turns it on or off (-enable,
// -disable). Every page ends with the cursor after it, for -from.
func eventsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var follow, asJSON, enable, disable bool
	var from string
	var limit int
	q, closeQ, err := liveQueue(ctx, "events", args, stderr, &replicaFlags{}, func(fs *flag.FlagSet) {
		fs.BoolVar(&follow, "follow", false, "wait for more events and print them as they come, until interrupted")
		fs.StringVar(&from, "from", "", `where to start: a cursor printed before, "start" (the oldest event kept) or "now" `+
			`(default: start, or now with -follow)`)
		fs.IntVar(&limit, "limit", 0, "print at most this many events (default: all there are); not with -follow")
		fs.BoolVar(&asJSON, "json", false, "one JSON object per line: each event, then {\"cursor\": ...} after each page")
		fs.BoolVar(&enable, "enable", false, "turn the queue's events on (every transition appends its event), then exit")
		fs.BoolVar(&disable, "disable", false, "turn the queue's events off, then exit")
	})
	if err != nil {
		return err
	}
	defer closeQ()
	switch {
	case enable && disable:
		return errors.New("events: -enable and -disable together")
	case (enable || disable) && (follow || from != "" || limit != 0):
		return errors.New("events: -enable and -disable take no other flag of events")
	case follow && limit != 0:
		return errors.New("events: -limit with -follow")
	case limit < 0:
		return fmt.Errorf("events: -limit %d", limit)
	case enable:
		if err := q.EnableEvents(ctx); err != nil {
			return &named{name: "events", err: err}
		}
		fmt.Fprintf(stdout, "queue %q: events on\n", q.Name())
		return nil
	case disable:
		if err := q.DisableEvents(ctx); err != nil {
			return &named{name: "events", err: err}
		}
		fmt.Fprintf(stdout, "queue %q: events off\n", q.Name())
		return nil
	}
	cursor, err := startCursor(ctx, q, from, follow)
	if err != nil {
		return err
	}
	p := eventPrinter{w: stdout, json: asJSON}
	if follow {
		_, err := q.FollowEvents(ctx, cursor, p.page)
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			return nil // interrupted: the last cursor is printed
		}
		return err
	}
	printed := 0
	for {
		n := 1000
		if limit > 0 {
			n = min(n, limit-printed)
		}
		page, err := q.Events(ctx, cursor, n)
		var missing *jobkey.ShardsError
		if err != nil && !errors.As(err, &missing) {
			return &named{name: "events", err: err}
		}
		if len(page.Events) > 0 || cursor == "" || page.Cursor != cursor {
			_ = p.page(*page)
		}
		if missing != nil {
			return &named{name: "events", err: fmt.Errorf("%w: the events above leave them out", missing)}
		}
		printed += len(page.Events)
		if len(page.Events) == 0 || limit > 0 && printed >= limit {
			return nil
		}
		cursor = page.Cursor
	}
}

// startCursor turns -from into a cursor.
func startCursor(ctx context.Context, q *jobkey.Queue, from string, follow bool) (string, error) {
	if from == "" {
		from = "start"
		if follow {
			from = "now"
		}
	}
	switch from {
	case "start":
		return "", nil
	case "now":
		c, err := q.EventsCursorNow(ctx)
		if err != nil {
			return "", &named{name: "events", err: err}
		}
		return c, nil
	}
	if _, err := q.Events(ctx, from, 1); errors.Is(err, jobkey.ErrInvalid) {
		return "", &named{name: "events", err: fmt.Errorf("-from: %w", err)}
	}
	return from, nil
}

// eventPrinter prints pages of events, as text or JSON lines.
type eventPrinter struct {
	w    io.Writer
	json bool
}

// eventJSON is an event as -json prints it.
type eventJSON struct {
	Shard   int               `json:"shard"`
	ID      string            `json:"id,omitempty"`
	Kind    string            `json:"kind"`
	Job     string            `json:"job,omitempty"`
	Type    string            `json:"type,omitempty"`
	From    string            `json:"from,omitempty"`
	To      string            `json:"to,omitempty"`
	Attempt int               `json:"attempt,omitempty"`
	At      *time.Time        `json:"at,omitempty"`
	Worker  string            `json:"worker,omitempty"`
	Problem string            `json:"problem,omitempty"`
	Fields  map[string]string `json:"fields,omitempty"`
}

func (p eventPrinter) page(page jobkey.EventPage) error {
	for _, e := range page.Events {
		if p.json {
			j := eventJSON{Shard: e.Shard, ID: e.ID, Kind: e.Kind.String(), Job: e.Job, Type: e.Type,
				From: stateWord(e.From), To: stateWord(e.To), Attempt: e.Attempt, Worker: e.Worker, Problem: e.Problem, Fields: e.Fields}
			if !e.At.IsZero() {
				at := e.At.UTC()
				j.At = &at
			}
			b, _ := json.Marshal(j)
			fmt.Fprintf(p.w, "%s\n", b)
			continue
		}
		fmt.Fprintln(p.w, eventLine(e))
	}
	if p.json {
		b, _ := json.Marshal(struct {
			Cursor string `json:"cursor"`
		}{page.Cursor})
		fmt.Fprintf(p.w, "%s\n", b)
	} else {
		fmt.Fprintf(p.w, "# cursor %s\n", page.Cursor)
	}
	return nil
}

// eventLine is one event as text.
func eventLine(e jobkey.Event) string {
	at := ""
	if !e.At.IsZero() {
		at = e.At.UTC().Format("2006-01-02T15:04:05.000Z") + " "
	}
	head := fmt.Sprintf("%sshard %d %s", at, e.Shard, e.ID)
	switch e.Kind {
	case jobkey.EventTransition:
		var b strings.Builder
		// A type and a worker are the caller's bytes: line escapes what
		// could break the line or reach the terminal as a sequence.
		fmt.Fprintf(&b, "%s %s %s: %s -> %s, attempt %d", head, line(e.Type), line(e.Job), stateWord(e.From), stateWord(e.To), e.Attempt)
		if e.Worker != "" {
			fmt.Fprintf(&b, ", worker %s", line(e.Worker))
		}
		return b.String()
	case jobkey.EventEnabled:
		return head + " events on"
	case jobkey.EventDisabled:
		return head + " events off"
	case jobkey.EventGap:
		return fmt.Sprintf("shard %d: GAP: events after the cursor were trimmed (EventsMaxLen) or deleted before they were read", e.Shard)
	case jobkey.EventRewound:
		return fmt.Sprintf("shard %d: REWOUND: the stream lost events read before (a failover?); reading it again from its start", e.Shard)
	case jobkey.EventMalformed:
		return fmt.Sprintf("%s MALFORMED entry (%s): %q", head, line(e.Problem), e.Fields)
	}
	return fmt.Sprintf("%s %s", head, e.Kind)
}

// stateWord names a state in an event: "none" before an enqueue, and
// after a deletion.
func stateWord(s jobkey.State) string {
	if s == 0 {
		return "none"
	}
	return s.String()
}
