package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

func TestParseState(t *testing.T) {
	for _, st := range stateNames {
		got, err := parseState(st.String())
		require.NoError(t, err)
		require.Equal(t, st, got)
	}
	_, err := parseState("done")
	require.ErrorContains(t, err, `-state "done": want one of pending, active, succeeded, failed, canceled`)
	_, err = parseState("")
	require.ErrorContains(t, err, "-state is required")
	_, err = parseState("pending", jobkey.StateSucceeded, jobkey.StateFailed, jobkey.StateCanceled)
	require.ErrorContains(t, err, "want one of succeeded, failed, canceled")
	got, err := parseState("failed", jobkey.StateSucceeded, jobkey.StateFailed, jobkey.StateCanceled)
	require.NoError(t, err)
	require.Equal(t, jobkey.StateFailed, got)
}

func TestPrintBytes(t *testing.T) {
	print := func(b []byte) string {
		var out bytes.Buffer
		printBytes(&out, "payload", b)
		return out.String()
	}
	require.Equal(t, "payload (json, 22 bytes):\n  {\n    \"to\": \"ada\",\n    \"n\": [\n      1\n    ]\n  }\n", print([]byte(` {"to":"ada","n":[1]} `)))
	require.Equal(t, "payload (text, 17 bytes):\n  line one\n  line two\n", print([]byte("line one\nline two")))
	bin := []byte{0, 1, 2, 0xff, 'a'}
	require.Contains(t, print(bin), "payload (binary, 5 bytes):\n  00000000  00 01 02 ff 61")
	require.Equal(t, "payload: (empty)\n", print(nil))
}

// A payload EnqueueArgs wrote (msgpack) prints as indented JSON, and a
// hostile string in it stays inert: no escape sequence reaches the
// terminal.
func TestPrintBytesShowsMsgpackAsJSON(t *testing.T) {
	b, err := msgpack.Marshal(struct {
		To      string
		Subject string
	}{"ada@example.com", "hi \x1b[2J\u009b31m"})
	require.NoError(t, err)
	var out bytes.Buffer
	printBytes(&out, "payload", b)
	require.Equal(t, fmt.Sprintf("payload (msgpack, %d bytes, shown as JSON):\n  {\n    \"To\": \"ada@example.com\",\n    \"Subject\": \"hi \\u001b[2J\\u009b31m\"\n  }\n", len(b)), out.String())
	require.NotContains(t, out.String(), "\x1b")
	require.NotContains(t, out.String(), "\u009b")
}

func TestBytesJSON(t *testing.T) {
	f, v, _ := bytesJSON([]byte("{ \"to\" : \"ada\" }"))
	require.Equal(t, "json", f)
	require.JSONEq(t, `{"to":"ada"}`, string(v))
	f, v, _ = bytesJSON([]byte("plain <b>"))
	require.Equal(t, "text", f)
	var s string
	require.NoError(t, json.Unmarshal(v, &s))
	require.Equal(t, "plain <b>", s)
	bin := []byte{0, 0xfe, 7}
	f, v, _ = bytesJSON(bin)
	require.Equal(t, "binary", f)
	require.NoError(t, json.Unmarshal(v, &s))
	dec, err := base64.StdEncoding.DecodeString(s)
	require.NoError(t, err)
	require.Equal(t, bin, dec)
	mp, err := msgpack.Marshal(map[string]any{"to": "ada"})
	require.NoError(t, err)
	f, v, cut := bytesJSON(mp)
	require.Equal(t, "msgpack", f)
	require.JSONEq(t, `{"to":"ada"}`, string(v))
	require.False(t, cut)
	f, v, _ = bytesJSON(nil)
	require.Empty(t, f)
	require.Nil(t, v)
}

func TestCell(t *testing.T) {
	require.Equal(t, `a \| b c`, cell("a | b\nc", 0))
	require.Equal(t, `x\x1b[31m`, cell("x\x1b[31m", 0))
	require.Equal(t, "abc…", cell("abcdef", 3))
	require.Equal(t, "abc", cell("abc", 3))
	require.Equal(t, "äöü…", cell("äöüß", 3), "cut by runes, not bytes")
	require.NotContains(t, cell("a\r\nb\tc", 0), "\n")
	require.Equal(t, `id\x00`, line("id\x00"))
	require.Equal(t, "plain", line("plain"))
}

func TestPrintJob(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	j := &jobkey.Job{
		ID: "j1", Queue: "mail", Type: "welcome", Payload: []byte(`{"to":"ada"}`), State: jobkey.StateFailed,
		Attempt: 3, MaxAttempts: 3, RunAt: t0, LastError: "boom\x1b[2J", Result: []byte{0, 1},
		CreatedAt: t0, UpdatedAt: t0.Add(time.Minute), Rev: 7,
	}
	var out bytes.Buffer
	printJob(&out, j)
	s := out.String()
	require.Contains(t, s, "id:           j1\n")
	require.Contains(t, s, "state:        failed\n")
	require.Contains(t, s, "attempt:      3 of 3\n")
	require.Contains(t, s, "run at:       2025-03-01T12:00:00Z\n")
	require.Contains(t, s, "lease until:  -\n")
	require.Contains(t, s, "updated at:   2025-03-01T12:01:00Z\n")
	require.Contains(t, s, "payload (json, 12 bytes):\n  {\n    \"to\": \"ada\"\n  }\n")
	require.Contains(t, s, "result (binary, 2 bytes):\n  00000000  00 01")
	require.Contains(t, s, `boom\x1b[2J`)
	require.NotContains(t, s, "\x1b", "no escape sequence reaches the terminal")

	v := viewOf(j)
	b, err := json.Marshal(v)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	require.Equal(t, "failed", m["state"])
	require.Equal(t, map[string]any{"to": "ada"}, m["payload"])
	require.Equal(t, "binary", m["result_format"])
	require.Equal(t, "2025-03-01T12:00:00Z", m["run_at"])
	require.NotContains(t, m, "lease_until")
}

// show prints a job's runs, oldest first, with how many were dropped, its
// snoozes and its progress; -json carries them too.
func TestPrintJobShowsHistoryAndProgress(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	j := &jobkey.Job{
		ID: "j1", Queue: "mail", Type: "welcome", State: jobkey.StatePending, Attempt: 1, MaxAttempts: 3, RunAt: t0,
		Snoozes: 2, StartedAt: t0.Add(-time.Minute), Progress: []byte(`{"sent":40}`), HistoryDropped: 5,
		History: []jobkey.AttemptRecord{
			{Attempt: 1, Started: t0.Add(-time.Hour), Duration: 1500 * time.Millisecond, Worker: "host/1", Outcome: jobkey.OutcomeFailed, Error: "smtp\x1b[2J: 421"},
			{Attempt: 1, Started: t0.Add(-time.Minute), Duration: 80 * time.Millisecond, Worker: "host/2", Outcome: jobkey.OutcomeSnoozed, Error: "jobkey: snoozed for 30s"},
		},
	}
	var out bytes.Buffer
	printJob(&out, j)
	s := out.String()
	require.Contains(t, s, "snoozes:      2\n")
	require.Contains(t, s, "started at:   2025-03-01T11:59:00Z\n")
	require.Contains(t, s, "history (2 runs; 5 older dropped):\n")
	require.Contains(t, s, "  #1  2025-03-01T11:00:00Z  1.5s  failed     host/1  smtp\\x1b[2J: 421\n")
	require.Contains(t, s, "  #1  2025-03-01T11:59:00Z  80ms  snoozed    host/2  jobkey: snoozed for 30s\n")
	require.Less(t, strings.Index(s, "1.5s"), strings.Index(s, "80ms"), "oldest first")
	require.Contains(t, s, "progress (json, 11 bytes):\n  {\n    \"sent\": 40\n  }\n")
	require.NotContains(t, s, "\x1b")

	b, err := json.Marshal(viewOf(j))
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	require.EqualValues(t, 2, m["snoozes"])
	require.EqualValues(t, 5, m["history_dropped"])
	require.Equal(t, map[string]any{"sent": float64(40)}, m["progress"])
	h := m["history"].([]any)
	require.Len(t, h, 2)
	require.Equal(t, "snoozed", h[1].(map[string]any)["outcome"])
	require.EqualValues(t, 1500, h[0].(map[string]any)["duration_ms"])
}

func TestParseInterleaved(t *testing.T) {
	parse := func(args ...string) ([]string, bool, error) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		j := fs.Bool("json", false, "")
		fs.String("queue", "", "")
		ops, err := parseInterleaved(fs, args)
		return ops, *j, err
	}
	ops, j, err := parse("-queue", "q", "a", "-json", "b")
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, ops)
	require.True(t, j)
	ops, j, err = parse("a", "--", "-json", "b")
	require.NoError(t, err)
	require.Equal(t, []string{"a", "-json", "b"}, ops, "after -- everything is an operand")
	require.False(t, j)
	ops, _, err = parse()
	require.NoError(t, err)
	require.Empty(t, ops)
	_, _, err = parse("a", "-nope")
	require.Error(t, err)
	require.False(t, strings.Contains(err.Error(), "\n"))
}
