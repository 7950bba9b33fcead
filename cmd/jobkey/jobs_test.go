package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestLs(t *testing.T) {
	f := newFixture(t, 4)
	long := strings.Repeat("x", 100) + " | tail"
	bad := f.failed("report", nil, long)
	ok := f.failed("report", nil, "boom")
	var pending []string
	for i := range 5 {
		typ := "welcome"
		if i == 4 {
			typ = "digest"
		}
		pending = append(pending, f.enqueue(typ, nil).ID)
	}

	out, err := f.run("ls", "-state", "pending")
	require.NoError(t, err)
	require.Contains(t, out, "| id | type | state | attempt | run at | last error |")
	for i, id := range pending {
		require.Contains(t, out, "| "+id+" | ", "job %d", i)
	}
	require.Contains(t, out, " | welcome | pending | 0/1 | ")
	require.NotContains(t, out, "next:", "one page holds them all")
	require.Less(t, strings.Index(out, pending[0]), strings.Index(out, pending[3]), "oldest first")

	out, err = f.run("ls", "-state", "pending", "-type", "digest")
	require.NoError(t, err)
	require.Contains(t, out, pending[4])
	require.NotContains(t, out, pending[0])

	// Paging: -limit 2 prints a cursor, and following it lists every job
	// once.
	seen := map[string]int{}
	cursor := ""
	for range 10 {
		args := []string{"-state", "pending", "-limit", "2", "-json"}
		if cursor != "" {
			args = append(args, "-cursor", cursor)
		}
		out, err = f.run("ls", args...)
		require.NoError(t, err)
		var page lsPage
		require.NoError(t, json.Unmarshal([]byte(out), &page), out)
		require.LessOrEqual(t, len(page.Jobs), 2)
		for _, j := range page.Jobs {
			require.Equal(t, "pending", j.State)
			seen[j.ID]++
		}
		if cursor = page.Next; cursor == "" {
			break
		}
	}
	require.Len(t, seen, len(pending))
	for id, n := range seen {
		require.Equal(t, 1, n, id)
	}
	out, err = f.run("ls", "-state", "pending", "-limit", "2")
	require.NoError(t, err)
	require.Regexp(t, `\n\nnext: \S+\n$`, out)

	// Failed jobs: finished at, attempt of max, the error cut and kept in
	// its cell; a value that cannot be read is a row saying so.
	require.NoError(t, f.rdb.Set(f.ctx, f.q.Keys(bad.ID).Job, "\xc1garbage", 0).Err())
	require.NoError(t, f.rdb.Set(f.ctx, f.q.Keys(ok.ID).Job+"x", "", 0).Err()) // unrelated key, ignored
	out, err = f.run("ls", "-state", "failed")
	require.NoError(t, err)
	require.Contains(t, out, "| id | type | state | attempt | finished at | last error |")
	require.Contains(t, out, "| "+ok.ID+" | report | failed | 1/1 | "+when(ok.UpdatedAt)+" | boom |")
	require.Regexp(t, `\| `+bad.ID+` \| \(unreadable\) \| failed \| - \| - \| jobkey: corrupt job value.* \|\n`, out)

	out, err = f.run("ls", "-state", "failed", "-json")
	require.NoError(t, err)
	var page lsPage
	require.NoError(t, json.Unmarshal([]byte(out), &page), out)
	require.Len(t, page.Jobs, 1)
	require.Equal(t, "boom", page.Jobs[0].LastError)
	require.Len(t, page.Unreadable, 1)
	require.Equal(t, bad.ID, page.Unreadable[0].ID)
	require.Contains(t, page.Unreadable[0].Error, "corrupt")
	require.Empty(t, page.Next)

	// The cut error: a failed job whose error is long and holds a "|".
	f2 := newFixture(t, 1)
	f2.failed("report", nil, long)
	out, err = f2.run("ls", "-state", "failed")
	require.NoError(t, err)
	require.Contains(t, out, " | "+strings.Repeat("x", 60)+"… |\n")

	out, err = f.run("ls", "-state", "corrupt")
	require.NoError(t, err)
	require.Equal(t, "no corrupt jobs in queue \"mail\"\n", out, "no claimer set a value aside yet")
	// As a claimer would set it aside.
	require.NoError(t, f.rdb.ZAdd(f.ctx, f.q.Keys(bad.ID).Corrupt, redis.Z{Score: 1, Member: bad.ID}).Err())
	out, err = f.run("ls", "-state", "corrupt")
	require.NoError(t, err)
	require.Regexp(t, `\| `+bad.ID+` \| \(unreadable\) \| corrupt \| - \| - \| jobkey: corrupt job value.* \|\n`, out)

	out, err = f.run("ls", "-state", "canceled")
	require.NoError(t, err)
	require.Equal(t, "no canceled jobs in queue \"mail\"\n", out)
	out, err = f.run("ls", "-state", "canceled", "-json")
	require.NoError(t, err)
	require.JSONEq(t, `{"jobs":[],"unreadable":[],"next":"","scan_stopped":false,"scanned":0}`, out)
}

func TestShow(t *testing.T) {
	f := newFixture(t, 2)
	js := f.enqueue("welcome", []byte(`{"to":"ada@example.com","n":[1,2]}`))
	text := f.enqueue("note", []byte("hello\nworld"))
	bin := f.enqueue("blob", []byte{0x00, 0x9f, 0xff, 'A', 0x1b})

	out, err := f.run("show", js.ID)
	require.NoError(t, err)
	require.Contains(t, out, "id:           "+js.ID+"\n")
	require.Contains(t, out, "type:         welcome\n")
	require.Contains(t, out, "state:        pending\n")
	require.Contains(t, out, "attempt:      0 of 1\n")
	require.Contains(t, out, "payload (json, 34 bytes):\n  {\n    \"to\": \"ada@example.com\",\n    \"n\": [\n      1,\n      2\n    ]\n  }\n")
	require.Contains(t, out, "result: (empty)\n")
	require.Contains(t, out, "meta:         -\n")
	require.Contains(t, out, "priority:     0\n")
	require.NotContains(t, out, "timeout:")

	require.NotContains(t, out, "concurrency:")

	ctl, err := f.q.Enqueue(f.ctx, "ctl", nil, &jobkey.EnqueueOpts{Priority: 7, Timeout: 90 * time.Second, ConcurrencyKey: "cust\x1b"})
	require.NoError(t, err)
	out, err = f.run("show", ctl.ID)
	require.NoError(t, err)
	require.Contains(t, out, "priority:     7\n")
	require.Contains(t, out, "concurrency:  cust\\x1b\n", "escaped like every field")
	require.Contains(t, out, "timeout:      1m30s\n")
	out, err = f.run("show", ctl.ID, "-json")
	require.NoError(t, err)
	require.Contains(t, out, `"priority": 7`)
	require.Contains(t, out, `"timeout_ms": 90000`)
	require.Contains(t, out, `"concurrency_key": "cust\u001b"`)

	traced, err := f.q.Enqueue(f.ctx, "traced", nil, &jobkey.EnqueueOpts{Meta: map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x\x1b": "a\nb"}})
	require.NoError(t, err)
	out, err = f.run("show", traced.ID)
	require.NoError(t, err)
	require.Contains(t, out, "meta:\n  traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n  x\\x1b: a\\nb\n")
	require.NotContains(t, out, "\x1b")
	out, err = f.run("show", traced.ID, "-json")
	require.NoError(t, err)
	var tv map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &tv), out)
	require.Equal(t, map[string]any{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x\x1b": "a\nb"}, tv["meta"])

	out, err = f.run("show", text.ID)
	require.NoError(t, err)
	require.Contains(t, out, "payload (text, 11 bytes):\n  hello\n  world\n")

	out, err = f.run("show", bin.ID)
	require.NoError(t, err)
	require.Contains(t, out, "payload (binary, 5 bytes):\n  00000000  00 9f ff 41 1b ")
	require.NotContains(t, out, "\x1b")

	// Flags may follow the ID.
	out, err = f.run("show", js.ID, "-json")
	require.NoError(t, err)
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &v), out)
	require.Equal(t, js.ID, v["id"])
	require.Equal(t, "json", v["payload_format"])
	require.Equal(t, map[string]any{"to": "ada@example.com", "n": []any{1.0, 2.0}}, v["payload"])

	require.NoError(t, f.rdb.Del(f.ctx, f.q.Keys(js.ID).Job).Err())
	_, err = f.run("show", js.ID)
	require.ErrorIs(t, err, jobkey.ErrNotFound)
	_, err = f.run("show")
	require.ErrorContains(t, err, "show: want one job ID, got 0")
	_, err = f.run("show", "a", "b")
	require.ErrorContains(t, err, "show: want one job ID, got 2")
}

func TestShowResult(t *testing.T) {
	f := newFixture(t, 1)
	j, err := f.q.Complete(f.ctx, f.claimed("t", nil), []byte(`["done"]`))
	require.NoError(t, err)
	out, err := f.run("show", j.ID)
	require.NoError(t, err)
	require.Contains(t, out, "state:        succeeded\n")
	require.Contains(t, out, "payload: (empty)\n")
	require.Contains(t, out, "result (json, 8 bytes):\n  [\n    \"done\"\n  ]\n")
}

// A page of a rare type that stopped at its bound of entries says so, in
// the table and in -json, so nobody takes it for all there is. Here 2
// digests among 1,200 jobs, at 0 and 1,100.
func TestLsSaysWhenItsScanStoppedEarly(t *testing.T) {
	f := newFixture(t, 2)
	var specs []jobkey.JobSpec
	for i := range 1200 {
		typ := "welcome"
		if i == 0 || i == 1100 {
			typ = "digest"
		}
		specs = append(specs, jobkey.JobSpec{Type: typ, Opts: &jobkey.EnqueueOpts{Delay: time.Minute + time.Duration(i)*time.Millisecond}})
	}
	var digests []string
	for c := range slices.Chunk(specs, 200) {
		jobs, err := f.q.EnqueueMany(f.ctx, c)
		require.NoError(t, err)
		for _, j := range jobs {
			if j.Type == "digest" {
				digests = append(digests, j.ID)
			}
		}
	}
	out, err := f.run("ls", "-state", "pending", "-type", "digest", "-limit", "20")
	require.NoError(t, err)
	require.Contains(t, out, "| "+digests[0]+" | digest | pending |")
	require.Contains(t, out, "\n\nthis page stopped after reading 1000 entries, with 1 of 20 pending jobs of type \"digest\": it is not the last page, more may follow\n\nnext: ")

	out, err = f.run("ls", "-state", "pending", "-type", "digest", "-limit", "20", "-json")
	require.NoError(t, err)
	var page lsPage
	require.NoError(t, json.Unmarshal([]byte(out), &page), out)
	require.True(t, page.ScanStopped)
	require.Equal(t, 1000, page.Scanned)
	require.Len(t, page.Jobs, 1)

	out, err = f.run("ls", "-state", "pending", "-type", "digest", "-limit", "20", "-cursor", page.Next)
	require.NoError(t, err)
	require.Contains(t, out, "| "+digests[1]+" | digest | pending |")
	require.NotContains(t, out, "stopped")
	require.NotContains(t, out, "next:")

	// A page that found none says so too.
	out, err = f.run("ls", "-state", "pending", "-type", "resize", "-limit", "20")
	require.NoError(t, err)
	require.Regexp(t, `^no pending jobs of type "resize" on this page of queue "mail"\n`+
		`this page stopped after reading 1000 entries, with 0 of 20 pending jobs of type "resize": it is not the last page, more may follow\n\nnext: \S+\n$`, out)
}

// signUp is job arguments as a user writes them for EnqueueArgs.
type signUp struct {
	Email string
	Plan  string
	Seats int
}

func (signUp) Kind() string { return "sign_up" }

// A payload EnqueueArgs wrote is msgpack: show prints it as indented JSON,
// and show -json and ls -json carry it as a JSON value with its format
// and its exact bytes. A hostile string inside stays inert.
func TestShowAndLsPrintEnqueueArgsPayloadsAsJSON(t *testing.T) {
	f := newFixture(t, 1)
	args := signUp{Email: "ada@example.com", Plan: "<script>x</script>\x1b[2J", Seats: 3}
	j, err := jobkey.EnqueueArgs(f.ctx, f.q, args, nil)
	require.NoError(t, err)

	out, err := f.run("show", j.ID)
	require.NoError(t, err)
	require.Contains(t, out, fmt.Sprintf("payload (msgpack, %d bytes, shown as JSON):\n", len(j.Payload))+
		"  {\n    \"Email\": \"ada@example.com\",\n    \"Plan\": \"<script>x</script>\\u001b[2J\",\n    \"Seats\": 3\n  }\n")
	require.NotContains(t, out, "\x1b")

	want := map[string]any{"Email": "ada@example.com", "Plan": "<script>x</script>\x1b[2J", "Seats": 3.0}
	out, err = f.run("show", j.ID, "-json")
	require.NoError(t, err)
	require.NotContains(t, out, "\x1b")
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &v), out)
	require.Equal(t, "msgpack", v["payload_format"])
	require.Equal(t, want, v["payload"])
	require.Equal(t, base64.StdEncoding.EncodeToString(j.Payload), v["payload_base64"], "the exact bytes")
	require.NotContains(t, v, "payload_cut")

	out, err = f.run("ls", "-state", "pending", "-json")
	require.NoError(t, err)
	var page struct {
		Jobs []map[string]any `json:"jobs"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &page), out)
	require.Len(t, page.Jobs, 1)
	require.Equal(t, "msgpack", page.Jobs[0]["payload_format"])
	require.Equal(t, want, page.Jobs[0]["payload"])
	require.Equal(t, base64.StdEncoding.EncodeToString(j.Payload), page.Jobs[0]["payload_base64"])
}

// Once a job succeeded, the error an earlier attempt left is history: show
// and ls say so, instead of showing it as the job's last error.
func TestSucceededJobShowsItsErrorAsAnEarlierAttempts(t *testing.T) {
	f := newFixture(t, 1)
	failed := f.failed("report", nil, "smtp: 550 mailbox unavailable")
	_, err := f.q.Retry(f.ctx, failed.ID)
	require.NoError(t, err)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	done, err := f.q.Complete(f.ctx, c, nil)
	require.NoError(t, err)
	require.Equal(t, jobkey.StateSucceeded, done.State)
	require.Equal(t, "smtp: 550 mailbox unavailable", done.LastError, "the value keeps it")

	out, err := f.run("show", done.ID)
	require.NoError(t, err)
	require.Contains(t, out, "earlier error (of an attempt before the one that succeeded):\n  smtp: 550 mailbox unavailable\n")
	require.NotContains(t, out, "last error")

	out, err = f.run("ls", "-state", "succeeded")
	require.NoError(t, err)
	require.Contains(t, out, "| id | type | state | attempt | finished at | earlier error |")
	require.NotContains(t, out, "last error")

	out, err = f.run("ls", "-state", "failed")
	require.NoError(t, err)
	require.Contains(t, out, "no failed jobs")
	f.failed("report", nil, "boom")
	out, err = f.run("ls", "-state", "failed")
	require.NoError(t, err)
	require.Contains(t, out, "| last error |", "a failed job's error is its own")
}

func TestActionsByID(t *testing.T) {
	f := newFixture(t, 3)
	active := f.claimed("t", nil)
	failed := f.failed("t", nil, "boom")
	p1, p2 := f.enqueue("t", nil), f.enqueue("t", nil)

	out, err := f.run("retry", failed.ID)
	require.NoError(t, err)
	require.Contains(t, out, "| "+failed.ID+" | retried, now pending |")
	require.Contains(t, out, "retry: 1 done, 0 failed")
	require.Equal(t, jobkey.StatePending, f.state(failed.ID))

	out, err = f.run("cancel", p1.ID, p2.ID, "-json")
	require.NoError(t, err)
	var res struct {
		Action string
		Done   int
		Failed int
		Jobs   []jobOutcome
	}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, 2, res.Done)
	require.Equal(t, "canceled", res.Jobs[1].State)
	require.Equal(t, jobkey.StateCanceled, f.state(p1.ID))
	require.Equal(t, jobkey.StateCanceled, f.state(p2.ID))

	out, err = f.run("delete", p1.ID)
	require.NoError(t, err)
	require.Contains(t, out, "| "+p1.ID+" | deleted |")
	_, err = f.q.Get(f.ctx, p1.ID)
	require.ErrorIs(t, err, jobkey.ErrNotFound)

	// An active job is refused, named by its state, and left alone.
	_, err = f.run("delete", active.ID)
	var se *jobkey.StateError
	require.ErrorAs(t, err, &se)
	require.Equal(t, jobkey.StateActive, se.State)
	require.Contains(t, err.Error(), "it is active")
	require.Equal(t, jobkey.StateActive, f.state(active.ID))

	// A missing job among others: the others are done, the command fails.
	out, err = f.run("delete", p2.ID, "nope")
	require.ErrorIs(t, err, jobkey.ErrNotFound)
	require.ErrorContains(t, err, "delete: 1 of 2 jobs not deleted")
	require.Contains(t, out, "| nope | not deleted: jobkey: job not found")
	_, err = f.q.Get(f.ctx, p2.ID)
	require.ErrorIs(t, err, jobkey.ErrNotFound)

	_, err = f.run("retry", "nope")
	require.ErrorIs(t, err, jobkey.ErrNotFound)
	_, err = f.run("retry", active.ID)
	require.ErrorIs(t, err, jobkey.ErrState)
}

func TestBulkActions(t *testing.T) {
	f := newFixture(t, 4)
	var failedIDs []string
	for i := range 3 {
		typ := "a"
		if i == 2 {
			typ = "b"
		}
		failedIDs = append(failedIDs, f.failed(typ, nil, "boom").ID)
	}
	a1, a2, b1 := f.enqueue("a", nil), f.enqueue("a", nil), f.enqueue("b", nil)
	before := f.stats()

	// Without -yes: say what it would do, change nothing, exit non-zero.
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"retry", "-all"}, `retry: would retry 3 failed jobs in queue "mail"`},
		{[]string{"retry", "-all", "-type", "b"}, `retry: would retry 1 failed jobs of type "b" in queue "mail"`},
		{[]string{"cancel", "-all", "-type", "a"}, `cancel: would cancel 2 pending jobs of type "a" in queue "mail"`},
		{[]string{"cancel", "-all"}, `cancel: would cancel 3 pending jobs in queue "mail"`},
		{[]string{"delete", "-all", "-state", "failed"}, `delete: would delete 3 failed jobs in queue "mail"`},
		{[]string{"delete", "-all", "-state", "succeeded", "-type", "a"}, `delete: would delete 0 succeeded jobs of type "a"`},
	} {
		out, err := f.run(c.args[0], c.args[1:]...)
		require.ErrorIs(t, err, errNotConfirmed, "%v", c.args)
		require.ErrorContains(t, err, c.says)
		require.Empty(t, out)
	}
	require.Equal(t, before, f.stats(), "nothing changed")

	out, err := f.run("cancel", "-all", "-type", "a", "-yes")
	require.NoError(t, err)
	require.Contains(t, out, "| cancel | pending | a | 2 | 0 | 0 |")
	require.Equal(t, jobkey.StateCanceled, f.state(a1.ID))
	require.Equal(t, jobkey.StateCanceled, f.state(a2.ID))
	require.Equal(t, jobkey.StatePending, f.state(b1.ID), "another type is left alone")

	out, err = f.run("retry", "-all", "-type", "a", "-yes", "-json")
	require.NoError(t, err)
	var res bulkOutcome
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, bulkOutcome{Action: "retry", State: "failed", Type: "a", Done: 2}, res)
	require.Equal(t, jobkey.StateFailed, f.state(failedIDs[2]))
	require.Equal(t, jobkey.StatePending, f.state(failedIDs[0]))

	out, err = f.run("delete", "-all", "-state", "canceled", "-yes")
	require.NoError(t, err)
	require.Contains(t, out, "| delete | canceled | - | 2 | 0 | 0 |")
	_, err = f.q.Get(f.ctx, a1.ID)
	require.ErrorIs(t, err, jobkey.ErrNotFound)

	out, err = f.run("retry", "-all", "-yes")
	require.NoError(t, err)
	require.Contains(t, out, "| retry | failed | - | 1 | 0 | 0 |")
	require.Equal(t, jobkey.StatePending, f.state(failedIDs[2]))
	require.Zero(t, f.stats().Failed)
}

func TestPauseResume(t *testing.T) {
	f := newFixture(t, 3)
	f.enqueue("t", nil)
	out, err := f.run("pause")
	require.NoError(t, err)
	require.Contains(t, out, `queue "mail" paused`)
	require.True(t, f.stats().Paused)
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, jobkey.ErrNoJob, "a paused queue gives out nothing")

	out, err = f.run("stats")
	require.NoError(t, err)
	require.Contains(t, out, "| paused |\n")
	require.Contains(t, out, " | yes |\n")

	var qs bytes.Buffer
	require.NoError(t, run(f.ctx, []string{"queues", "-redis", f.url, "-prefix", f.prefix}, &qs, &qs))
	require.Contains(t, qs.String(), "| mail | yes | 1 |")

	out, err = f.run("resume", "-json")
	require.NoError(t, err)
	require.JSONEq(t, `{"queue":"mail","paused":false}`, out)
	require.False(t, f.stats().Paused)
	out, err = f.run("stats")
	require.NoError(t, err)
	require.Contains(t, out, " | no |\n")
	_, err = f.run("pause", "extra")
	require.ErrorContains(t, err, "unexpected arguments")
}

func TestLimit(t *testing.T) {
	f := newFixture(t, 3)
	_, err := f.q.Enqueue(f.ctx, "t", nil, &jobkey.EnqueueOpts{ConcurrencyKey: "acme"})
	require.NoError(t, err)
	_, err = f.q.Enqueue(f.ctx, "t", nil, &jobkey.EnqueueOpts{ConcurrencyKey: "acme"})
	require.NoError(t, err)
	_, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, jobkey.ErrNoJob, "the default limit is 1")

	out, err := f.run("limit", "acme")
	require.NoError(t, err)
	require.Equal(t, "key acme of queue \"mail\": no limit of its own, so each worker's Config.ConcurrencyLimit holds it "+
		"(not stored in Redis: this command cannot tell it; jobkey's default is 1), 1 active, 1 waiting\n", out)
	out, err = f.run("limit", "acme", "2", "-json")
	require.NoError(t, err)
	require.JSONEq(t, `{"queue":"mail","key":"acme","limit":2,"default":false,"active":1,"waiting":1}`, out)
	j, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err, "the raised limit lets the waiting job run")
	require.Equal(t, "acme", j.ConcurrencyKey)
	out, err = f.run("limit", "acme")
	require.NoError(t, err)
	require.Equal(t, "key acme of queue \"mail\": limit 2 (its own), 2 active, 0 waiting\n", out)
	out, err = f.run("limit", "acme", "0", "-json")
	require.NoError(t, err)
	require.JSONEq(t, `{"queue":"mail","key":"acme","limit":null,"default":true,"active":2,"waiting":0}`, out)

	for _, bad := range [][]string{{"-rate", "3/1s"}, {"acme", "-1"}, {"acme", "x"}, {"a", "1", "2"}, {"a{b}"}} {
		_, err := f.run("limit", bad...)
		require.Error(t, err, "%q", bad)
	}
}

// limit with no key lists every key that has a value in Redis, with its
// limit, use and rate.
func TestLimitWithNoKeyListsEveryKey(t *testing.T) {
	f := newFixture(t, 3)
	require.NoError(t, f.q.SetConcurrencyLimit(f.ctx, "acme", 4))
	require.NoError(t, f.q.SetRateLimit(f.ctx, "glob|ex", 5, time.Second))
	_, err := f.q.Enqueue(f.ctx, "t", nil, &jobkey.EnqueueOpts{ConcurrencyKey: "acme"})
	require.NoError(t, err)
	_, err = f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	out, err := f.run("limit")
	require.NoError(t, err)
	require.Contains(t, out, "| acme | 4 | 1 | 0 | - | - |")
	require.Contains(t, out, `| glob\|ex | workers' default | 0 | 0 | 5 per 1s | 0 |`)
	out, err = f.run("limit", "-json")
	require.NoError(t, err)
	require.JSONEq(t, `{"queue":"mail","more":false,"keys":[{"key":"acme","limit":4,"active":1,"waiting":0},`+
		`{"key":"glob|ex","limit":null,"active":0,"waiting":0,"rate":{"n":5,"period":"1s","started":0}}]}`, out)
}

// The command never shows its own Config.ConcurrencyLimit as the workers':
// a worker with ConcurrencyLimit 2 runs two jobs of a key with no limit of
// its own, and the command, which cannot know that 2, says so instead of
// printing "limit 1" beside "2 active".
// limit -rate sets a key's rate limit, shows it with the starts in its
// last period, refuses a rate it cannot keep before writing anything, and
// 0 takes it away.
func TestLimitSetsAndShowsARate(t *testing.T) {
	f := newFixture(t, 3)
	for range 3 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &jobkey.EnqueueOpts{ConcurrencyKey: "acme"})
		require.NoError(t, err)
	}
	for _, bad := range []string{"3", "x/1s", "0/1s", "3/0s", "3/1us", "3/forever", fmt.Sprintf("%d/1s", jobkey.MaxRateLimit+1)} {
		_, err := f.run("limit", "acme", "5", "-rate", bad)
		require.ErrorContains(t, err, "-rate", bad)
		info, err := f.q.Concurrency(f.ctx, "acme")
		require.NoError(t, err)
		require.False(t, info.Own, "a bad -rate writes nothing, not even the limit given with it (%s)", bad)
	}
	out, err := f.run("limit", "acme", "5", "-rate", "2/1h", "-json")
	require.NoError(t, err)
	require.JSONEq(t, `{"queue":"mail","key":"acme","limit":5,"default":false,"active":0,"waiting":0,"rate":{"n":2,"period":"1h0m0s","started":0}}`, out)
	for range 2 {
		_, err = f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
	}
	_, err = f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, jobkey.ErrNoJob, "the rate lets two start within the hour")
	out, err = f.run("limit", "acme")
	require.NoError(t, err)
	require.Equal(t, "key acme of queue \"mail\": limit 5 (its own), 2 active, 0 waiting; rate 2 per 1h0m0s, 2 started in the last 1h0m0s\n", out)
	out, err = f.run("limit", "acme", "-rate", "0", "-json")
	require.NoError(t, err)
	require.JSONEq(t, `{"queue":"mail","key":"acme","limit":5,"default":false,"active":2,"waiting":0}`, out)
}

func TestLimitNeverShowsTheCommandsDefaultAsTheWorkers(t *testing.T) {
	f := newFixtureWith(t, jobkey.Config{ConcurrencyLimit: 2})
	for range 3 {
		_, err := f.q.Enqueue(f.ctx, "t", nil, &jobkey.EnqueueOpts{ConcurrencyKey: "acme"})
		require.NoError(t, err)
	}
	for range 2 {
		_, err := f.q.Claim(f.ctx, "w")
		require.NoError(t, err)
	}
	_, err := f.q.Claim(f.ctx, "w")
	require.ErrorIs(t, err, jobkey.ErrNoJob, "the key is full: the third job waits")
	out, err := f.run("limit", "acme")
	require.NoError(t, err)
	require.NotContains(t, out, "limit 1")
	require.Contains(t, out, "no limit of its own, so each worker's Config.ConcurrencyLimit holds it")
	require.Contains(t, out, "2 active, 1 waiting")
	out, err = f.run("limit", "acme", "-json")
	require.NoError(t, err)
	require.JSONEq(t, `{"queue":"mail","key":"acme","limit":null,"default":true,"active":2,"waiting":1}`, out)
}

// queues finds every queue under the prefix without being told a name,
// each opened with the shard count it stored.
func TestQueues(t *testing.T) {
	f := newFixture(t, 2)
	f.failed("t", nil, "boom")
	other, err := jobkey.NewQueue(f.rdb, "reports", &jobkey.Config{Prefix: f.prefix, Shards: 5})
	require.NoError(t, err)
	for range 3 {
		_, err = other.Enqueue(f.ctx, "r", nil, nil)
		require.NoError(t, err)
	}
	// A queue under another prefix is not listed.
	elsewhere, err := jobkey.NewQueue(f.rdb, "hidden", &jobkey.Config{Prefix: f.prefix + "x"})
	require.NoError(t, err)
	_, err = elsewhere.Enqueue(f.ctx, "r", nil, nil)
	require.NoError(t, err)

	var out, errOut bytes.Buffer
	require.NoError(t, run(f.ctx, []string{"queues", "-redis", f.url, "-prefix", f.prefix}, &out, &errOut))
	s := out.String()
	require.Contains(t, s, "| queue | paused | pending | due | scheduled | active | expired leases | succeeded | failed | canceled | corrupt |")
	require.Contains(t, s, "| mail | no | 0 | 0 | 0 | 0 | 0 | 0 | 1 | 0 | 0 |")
	require.Contains(t, s, "| reports | no | 3 | 3 | 0 | 0 | 0 | 0 | 0 | 0 | 0 |")
	require.NotContains(t, s, "hidden")

	out.Reset()
	require.NoError(t, run(f.ctx, []string{"queues", "-redis", f.url, "-prefix", f.prefix, "-json"}, &out, &errOut))
	var doc struct {
		Prefix string
		Queues []queueView
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &doc), out.String())
	require.Equal(t, f.prefix, doc.Prefix)
	require.Len(t, doc.Queues, 2)
	require.Equal(t, "reports", doc.Queues[1].Name)
	require.EqualValues(t, 3, doc.Queues[1].Pending)

	out.Reset()
	require.NoError(t, run(f.ctx, []string{"queues", "-redis", f.url, "-prefix", f.prefix + "none"}, &out, &errOut))
	require.Equal(t, "no queues under prefix \""+f.prefix+"none\"\n", out.String())

	t.Setenv("REDIS_URL", "")
	err = run(f.ctx, []string{"queues"}, &out, &errOut)
	require.ErrorContains(t, err, "queues: -redis (or REDIS_URL) is required")
}

// Bad flags are refused with one line before anything connects: the
// Redis given cannot be reached, and the error is never about it.
func TestJobCommandsRefuseBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"ls"}, "ls: -state is required"},
		{[]string{"ls", "-state", "done"}, `ls: -state "done": want one of pending, active, succeeded, failed, canceled`},
		{[]string{"ls", "-state", "failed", "-limit", "0"}, "ls: -limit 0: want 1 to 1000"},
		{[]string{"ls", "-state", "failed", "-limit", "1001"}, "ls: -limit 1001: want 1 to 1000"},
		{[]string{"ls", "-state", "failed", "x"}, "ls: unexpected arguments"},
		{[]string{"retry"}, "retry: give job IDs, or -all"},
		{[]string{"retry", "-all", "id"}, "retry: give job IDs or -all, not both"},
		{[]string{"cancel", "-type", "t", "id"}, "cancel: -type and -state go with -all only"},
		{[]string{"delete", "-all", "-yes"}, "delete: -state is required: one of succeeded, failed, canceled"},
		{[]string{"delete", "-all", "-state", "pending", "-yes"}, `delete: -state "pending": want one of succeeded, failed, canceled`},
		{[]string{"delete", "-state", "failed", "id"}, "delete: -type and -state go with -all only"},
		{[]string{"retry", "-all", "-state", "failed"}, "flag provided but not defined: -state"},
		{[]string{"show"}, "show: want one job ID, got 0"},
		{[]string{"pause", "-nope"}, "flag provided but not defined: -nope"},
	} {
		var out, errOut bytes.Buffer
		args := append([]string{c.args[0], "-redis", "redis://127.0.0.1:1", "-queue", "q"}, c.args[1:]...)
		err := run(context.Background(), args, &out, &errOut)
		require.Error(t, err, "%v", c.args)
		require.Contains(t, err.Error()+errOut.String(), c.says, "%v", c.args)
		require.NotContains(t, err.Error(), "could not be reached", "%v: judged before connecting", c.args)
		require.NotContains(t, oneLine(err), "\n")
	}
	t.Setenv("REDIS_URL", "")
	var out, errOut bytes.Buffer
	for _, cmd := range []string{"ls", "show", "retry", "cancel", "delete", "pause", "resume"} {
		err := run(context.Background(), []string{cmd, "-queue", "q", "-state", "failed", "id"}, &out, &errOut)
		if cmd != "ls" {
			err = run(context.Background(), []string{cmd, "-queue", "q", "id"}, &out, &errOut)
		}
		require.ErrorContains(t, err, cmd+": -redis (or REDIS_URL) is required", cmd)
	}
	err := run(context.Background(), []string{"ls", "-redis", "redis://127.0.0.1:1", "-state", "failed"}, &out, &errOut)
	require.ErrorContains(t, err, "ls: -queue is required")
	require.False(t, errors.Is(err, flag.ErrHelp))
}

// Run as an operator runs it: the binary exits 1 and prints one line.
func TestJobCommandsExitNonZeroWithOneLine(t *testing.T) {
	f := newFixture(t, 2)
	active := f.claimed("t", nil)
	base := "-redis " + f.url + " -queue mail -prefix " + f.prefix
	for _, c := range []struct{ args, says string }{
		{"show " + base + " missing-job", `jobkey: job not found: "missing-job" in queue "mail"`},
		{"delete " + base + " " + active.ID, `jobkey: cannot delete job "` + active.ID + `": it is active`},
		{"ls " + base + " -state bogus", `jobkey: ls: -state "bogus": want one of`},
		{"ls " + base + " -state failed -limit 5000", "jobkey: ls: -limit 5000: want 1 to 1000"},
		{"retry " + base + " -all", `jobkey: retry: would retry 0 failed jobs in queue "mail"; nothing changed: add -yes to do it`},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), runMainEnv+"=1", runMainEnv+"_ARGS="+c.args)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%s: exits non-zero", c.args)
		require.Equal(t, 1, exit.ExitCode(), c.args)
		require.Equal(t, 1, strings.Count(stderr.String(), "\n"), "%s: one line: %q", c.args, stderr.String())
		require.True(t, strings.HasPrefix(stderr.String(), c.says), "%s: %q", c.args, stderr.String())
		require.Empty(t, stdout.String(), c.args)
	}
	require.Equal(t, jobkey.StateActive, f.state(active.ID))

	// And success exits 0.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), runMainEnv+"=1", runMainEnv+"_ARGS=show "+base+" "+active.ID)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	require.Contains(t, string(out), "state:        active")
}

// breakShard makes one priority's ready index of shard s a string, so
// that pending listings cannot read the shard, and returns which of ids
// sit on it.
func (f *fixture) breakShard(s int, ids []string) (on []string) {
	f.t.Helper()
	bad := ""
	for _, id := range ids {
		// The ready key is <prefix>:{mail/<shard>[.<k>]}:ready.
		k := f.q.Keys(id).Ready
		tag := k[strings.Index(k, "{")+1 : strings.Index(k, "}")]
		if n, _, _ := strings.Cut(strings.TrimPrefix(tag, "mail/"), "."); n == strconv.Itoa(s) {
			bad = k + ".5" // priority 5's ready index, of that shard
			on = append(on, id)
		}
	}
	require.NotEmpty(f.t, on, "some jobs on shard %d", s)
	require.Less(f.t, len(on), len(ids), "and some elsewhere")
	require.NoError(f.t, f.rdb.Set(f.ctx, bad, "not a zset", 0).Err())
	return on
}

// cancel -all -yes with a shard that cannot be read prints the counts of
// what it did, then fails with an error that says so, and -json carries
// the missing shards.
func TestBulkActionPrintsWhatItDidBeforeTheError(t *testing.T) {
	f := newFixture(t, 4)
	var ids []string
	for range 12 {
		ids = append(ids, f.enqueue("t", nil).ID)
	}
	on := f.breakShard(1, ids)
	done := len(ids) - len(on)

	// Without -yes, the count of the shards it can read, and which not.
	for _, args := range [][]string{{"cancel", "-all"}, {"cancel", "-all", "-type", "t"}} {
		out, err := f.run(args[0], args[1:]...)
		require.ErrorIs(t, err, errNotConfirmed)
		require.ErrorContains(t, err, fmt.Sprintf(`would cancel %d pending jobs`, done))
		require.ErrorContains(t, err, "1 of 4 shards could not be read ([1])")
		require.Empty(t, out)
	}

	out, err := f.run("cancel", "-all", "-yes")
	var be *jobkey.BulkError
	require.ErrorAs(t, err, &be)
	require.Equal(t, done, be.Result.Done)
	require.Contains(t, out, fmt.Sprintf("| cancel | pending | - | %d | 0 | 0 |", done))
	require.Contains(t, oneLine(err), fmt.Sprintf("cancel: %d done", done))
	require.Contains(t, oneLine(err), "1 of 4 shards could not be read ([1])")
	require.NotContains(t, oneLine(err), "nothing was written")
	for _, id := range on {
		require.Equal(t, jobkey.StatePending, f.state(id))
	}

	for _, id := range ids {
		if !slices.Contains(on, id) {
			_, err := f.q.Retry(f.ctx, id)
			require.NoError(t, err)
		}
	}
	out, err = f.run("cancel", "-all", "-yes", "-json")
	require.ErrorAs(t, err, &be)
	var res bulkOutcome
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, done, res.Done)
	require.Equal(t, []int{1}, res.MissingShards)
	require.Contains(t, res.Error, "could not be read")
}

// ls with a shard that cannot be read lists the others' jobs, names the
// shard, and exits non-zero; -json carries the missing shards.
func TestLsShowsTheReadableShards(t *testing.T) {
	f := newFixture(t, 4)
	var ids []string
	for range 12 {
		ids = append(ids, f.enqueue("t", nil).ID)
	}
	on := f.breakShard(2, ids)

	out, err := f.run("ls", "-state", "pending")
	require.ErrorIs(t, err, errPartialPage)
	for _, id := range ids {
		if slices.Contains(on, id) {
			require.NotContains(t, out, id)
		} else {
			require.Contains(t, out, id)
		}
	}
	require.Contains(t, out, "1 of 4 shards could not be read ([2])")

	out, err = f.run("ls", "-state", "pending", "-json")
	require.ErrorIs(t, err, errPartialPage)
	var page lsPage
	require.NoError(t, json.Unmarshal([]byte(out), &page), out)
	require.Len(t, page.Jobs, len(ids)-len(on))
	require.Equal(t, []int{2}, page.MissingShards)
	require.Contains(t, page.Error, "could not be read")
}

// With -min-replicas, a write the replicas did not confirm is reported as
// applied on the master only, and the command exits non-zero: never as
// done. The replica is stopped for every write here; the setting is read
// from the flags, the Redis URL and the environment alike.
func TestWriteTheReplicasDidNotConfirmIsReportedAsMasterOnly(t *testing.T) {
	f := newReplicatedFixture(t)
	failed := f.failed("t", nil, "boom")
	succeeded := f.claimed("t", nil)
	_, err := f.q.Complete(f.ctx, succeeded, nil)
	require.NoError(t, err)
	var pending []string
	for range 9 {
		pending = append(pending, f.enqueue("t", nil).ID)
	}
	lost := pending[8] // its ready entry goes, for verify to find
	require.NoError(t, f.rdb.ZRem(f.ctx, f.q.Keys(lost).Ready, lost).Err())
	require.NoError(t, f.set.WaitSynced(10*time.Second))
	thaw := f.freeze()
	wait := []string{"-min-replicas", "1", "-replica-timeout", "200ms"}

	masterOnly := func(what string, err error, args ...string) {
		t.Helper()
		require.Error(t, err, "%s: not reported as done", args)
		require.ErrorIs(t, err, jobkey.ErrNotReplicated, args)
		require.Contains(t, oneLine(err), what+" on the master only: 0 of 1 replicas confirmed it within 200ms, so a failover now may undo it", args)
	}
	_, err = f.run("cancel", append(wait, pending[0])...)
	masterOnly(fmt.Sprintf("cancel: job %q canceled", pending[0]), err, "cancel")
	require.Equal(t, jobkey.StateCanceled, f.state(pending[0]), "applied on the master, as it says")
	_, err = f.run("retry", append(wait, failed.ID)...)
	masterOnly(fmt.Sprintf("retry: job %q retried", failed.ID), err, "retry")
	_, err = f.run("delete", append(wait, succeeded.ID)...)
	masterOnly(fmt.Sprintf("delete: job %q deleted", succeeded.ID), err, "delete")
	_, err = f.run("limit", append(wait, "acme", "3")...)
	masterOnly(`limit: the limit of key "acme" set`, err, "limit")
	// A pause and a resume: every shard written on the master only.
	_, err = f.run("pause", wait...)
	require.ErrorIs(t, err, jobkey.ErrNotReplicated, "pause")
	require.Contains(t, oneLine(err), "pause: 1 of 1 shards were written on the master only, not confirmed by the replicas")
	_, err = f.run("resume", wait...)
	require.ErrorIs(t, err, jobkey.ErrNotReplicated, "resume")
	require.Contains(t, oneLine(err), "resume: 1 of 1 shards were written on the master only")

	// Several IDs: each row says what became of its job.
	out, err := f.run("cancel", append(wait, pending[1], pending[2])...)
	require.ErrorIs(t, err, jobkey.ErrNotReplicated)
	require.Contains(t, out, "| "+pending[1]+" | canceled on the master only: 0 of 1 replicas confirmed it within 200ms")
	require.Contains(t, out, "cancel: 2 done (2 of them on the master only), 0 failed")
	require.Contains(t, oneLine(err), "cancel: 2 of 2 jobs canceled on the master only, not confirmed by the replicas")
	out, err = f.run("cancel", append(wait, "-json", pending[3], "missing")...)
	require.ErrorIs(t, err, jobkey.ErrNotReplicated)
	var doc struct {
		Done       int          `json:"done"`
		MasterOnly int          `json:"master_only"`
		Failed     int          `json:"failed"`
		Jobs       []jobOutcome `json:"jobs"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	require.Equal(t, 1, doc.Done, "done, on the master only")
	require.Equal(t, 1, doc.MasterOnly)
	require.Equal(t, 1, doc.Failed)
	require.True(t, doc.Jobs[0].MasterOnly)
	require.False(t, doc.Jobs[0].OK)

	// A bulk action says how many jobs it did on the master only: the 4
	// pending jobs still listed, and the failed one retried above.
	out, err = f.run("cancel", append(wait, "-all", "-type", "t", "-yes")...)
	require.ErrorIs(t, err, jobkey.ErrNotReplicated)
	require.Contains(t, out, "| cancel | pending | t | 5 | 0 | 0 | 5 |")
	require.Contains(t, oneLine(err), "5 done (5 of them applied on the master only, not confirmed by the replicas)")

	// verify -fix: the repair is not reported as made.
	out, err = f.run("verify", append(wait, "-fix", "-keys")...)
	require.ErrorIs(t, err, jobkey.ErrNotReplicated, out)
	masterOnly("verify: a fix (of a finding above, not marked fixed) written", err, "verify")
	require.Contains(t, out, "| "+lost+" | missing-entry | ")
	require.Contains(t, out, "| false |")
	require.Contains(t, out, fmt.Sprintf("fix of job %q: write to", lost))

	// The URL's min_replicas and replica_timeout, and the environment's.
	more := []string{f.enqueue("t", nil).ID, f.enqueue("t", nil).ID}
	var stdout, stderr bytes.Buffer
	err = run(f.ctx, []string{"cancel", "-redis", f.url + "?min_replicas=1&replica_timeout=200ms", "-queue", "mail", "-prefix", f.prefix, more[0]}, &stdout, &stderr)
	masterOnly(fmt.Sprintf("cancel: job %q canceled", more[0]), err, "the URL's")
	t.Setenv("JOBKEY_MIN_REPLICAS", "1")
	t.Setenv("JOBKEY_REPLICA_TIMEOUT", "200ms")
	_, err = f.run("cancel", more[1])
	masterOnly(fmt.Sprintf("cancel: job %q canceled", more[1]), err, "the environment's")

	// As an operator runs it: exit 1, one line.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), runMainEnv+"=1", runMainEnv+"_ARGS=retry -redis "+f.url+" -queue mail -prefix "+f.prefix+" "+more[1])
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	var exit *exec.ExitError
	require.ErrorAs(t, cmd.Run(), &exit)
	require.Equal(t, 1, exit.ExitCode())
	require.Equal(t, 1, strings.Count(errOut.String(), "\n"), errOut.String())
	require.Contains(t, errOut.String(), fmt.Sprintf("jobkey: retry: job %q retried on the master only", more[1]))

	// Once the replica is back, the same commands succeed, and what they
	// report is on the replica when they return: cancel again waits for
	// the replica before it says canceled.
	thaw()
	t.Setenv("JOBKEY_REPLICA_TIMEOUT", "10s")
	out, err = f.run("cancel", pending[0])
	require.NoError(t, err)
	require.Contains(t, out, "canceled")
	require.Equal(t, jobkey.StateCanceled, f.onReplica(pending[0]).State)
}

// With the replica up, every writing command with -min-replicas succeeds,
// and what it reports is on the replica when it returns.
func TestWritesWaitForTheReplicas(t *testing.T) {
	f := newReplicatedFixture(t)
	failed := f.failed("t", nil, "boom")
	p := []string{f.enqueue("t", nil).ID, f.enqueue("t", nil).ID, f.enqueue("t", nil).ID}
	wait := []string{"-min-replicas", "1", "-replica-timeout", "10s"}

	out, err := f.run("cancel", append(wait, p[0])...)
	require.NoError(t, err)
	require.Contains(t, out, "canceled, now canceled")
	require.Equal(t, jobkey.StateCanceled, f.onReplica(p[0]).State)
	_, err = f.run("retry", append(wait, failed.ID)...)
	require.NoError(t, err)
	require.Equal(t, jobkey.StatePending, f.onReplica(failed.ID).State)
	_, err = f.run("delete", append(wait, p[0])...)
	require.NoError(t, err)
	require.Nil(t, f.onReplica(p[0]))
	out, err = f.run("cancel", append(wait, "-all", "-yes")...)
	require.NoError(t, err)
	require.Contains(t, out, "| cancel | pending | - | 3 | 0 | 0 | 0 |")
	for _, id := range []string{p[1], p[2], failed.ID} {
		require.Equal(t, jobkey.StateCanceled, f.onReplica(id).State)
	}
	_, err = f.run("limit", append(wait, "acme", "3")...)
	require.NoError(t, err)
	var stdout, stderr bytes.Buffer
	require.NoError(t, run(f.ctx, []string{"limit", "-redis", f.set.Replicas[0].URL(), "-queue", "mail", "-prefix", f.prefix, "acme"}, &stdout, &stderr))
	require.Contains(t, stdout.String(), "limit 3 (its own)", "read on the replica")
	// A command that only reads takes a URL that carries the setting.
	stdout.Reset()
	require.NoError(t, run(f.ctx, []string{"ls", "-redis", f.url + "?min_replicas=1&replica_timeout=2s", "-queue", "mail", "-prefix", f.prefix, "-state", "canceled"}, &stdout, &stderr))
	require.Contains(t, stdout.String(), "| canceled |")
	// A pause and a resume wait for the replicas too.
	out, err = f.run("pause", wait...)
	require.NoError(t, err)
	require.Contains(t, out, `queue "mail" paused`)
	out, err = f.run("resume", wait...)
	require.NoError(t, err)
	require.Contains(t, out, `queue "mail" resumed`)
}

// ls of active jobs shows what each handler last reported.
func TestLsShowsTheProgressOfRunningJobs(t *testing.T) {
	f := newFixture(t, 1)
	j := f.claimed("import", nil)
	j.Progress = []byte(`{"rows":120,"of":400}`)
	_, err := f.q.Extend(f.ctx, j)
	require.NoError(t, err)
	out, err := f.run("ls", "-state", "active")
	require.NoError(t, err)
	require.Contains(t, out, "| id | type | state | attempt | lease until | last error | progress |")
	require.Contains(t, out, `| {"rows":120,"of":400} |`)
	out, err = f.run("ls", "-state", "pending")
	require.NoError(t, err)
	require.NotContains(t, out, "progress")
}

// events turns a queue's stream on, prints its transitions with a cursor
// to resume from, and follows what comes next until interrupted.
func TestEventsCommand(t *testing.T) {
	f := newFixture(t, 2)
	_, err := f.q.Enqueue(f.ctx, "before", nil, &jobkey.EnqueueOpts{Delay: time.Hour}) // the queue exists; its events are off
	require.NoError(t, err)
	out, err := f.run("events", "-enable")
	require.NoError(t, err)
	require.Contains(t, out, `queue "mail": events on`)
	j := f.claimed("send", nil)

	out, err = f.run("events")
	require.NoError(t, err)
	require.Contains(t, out, "events on")
	require.Contains(t, out, "send "+j.ID+": none -> pending, attempt 0")
	require.Contains(t, out, "send "+j.ID+": pending -> active, attempt 1, worker w")
	require.NotContains(t, out, "before", "written while the events were off")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := lines[len(lines)-1]
	require.True(t, strings.HasPrefix(last, "# cursor e1:"), last)
	cursor := strings.TrimPrefix(last, "# cursor ")

	_, err = f.q.Complete(f.ctx, j, nil)
	require.NoError(t, err)
	out, err = f.run("events", "-from", cursor, "-json")
	require.NoError(t, err)
	rows := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, rows, 2, "the completion, then the cursor")
	require.Contains(t, rows[0], `"kind":"transition"`)
	require.Contains(t, rows[0], `"from":"active","to":"succeeded"`)
	require.Contains(t, rows[1], `"cursor":"e1:`)

	ctx, cancel := context.WithCancel(f.ctx)
	var buf syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"events", "-redis", f.url, "-queue", "mail", "-prefix", f.prefix, "-follow"}, &buf, &buf)
	}()
	time.Sleep(200 * time.Millisecond) // from now on
	k := f.enqueue("later", nil)
	require.Eventually(t, func() bool { return strings.Contains(buf.String(), "later "+k.ID+": none -> pending") }, 10*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	require.NotContains(t, buf.String(), j.ID, "-follow starts now")

	_, err = f.run("events", "-from", "junk")
	require.ErrorIs(t, err, jobkey.ErrInvalid)
	_, err = f.run("events", "-follow", "-limit", "3")
	require.ErrorContains(t, err, "-limit with -follow")
	out, err = f.run("events", "-disable")
	require.NoError(t, err)
	require.Contains(t, out, "events off")
}
