package jobkeyui

import (
	"context"
	"errors"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// fetch GETs a path of the fixture's UI and returns the status and body.
func (f *fixture) fetch(t *testing.T, c *http.Client, path string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(f.srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// post POSTs a form to an action of the fixture's UI.
func (f *fixture) post(t *testing.T, c *http.Client, action string, form url.Values) (*http.Response, string) {
	t.Helper()
	resp, err := c.PostForm(f.srv.URL+"/action/"+action, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

var tokenRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// token loads a page with c and returns the CSRF token of its forms.
func (f *fixture) token(t *testing.T, c *http.Client) string {
	t.Helper()
	_, body := f.fetch(t, c, "/queue?name=mails&state=failed")
	m := tokenRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF token on the page:\n%s", body)
	}
	return html.UnescapeString(m[1])
}

func TestQueuesPageCounts(t *testing.T) {
	f := newFixture(t, Options{})
	c := f.client(t)
	resp, body := f.fetch(t, c, "/")
	wantStatus(t, resp, body, http.StatusOK)
	st, err := f.q.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := rowCounts(t, body, "mails")
	want := map[string]int64{
		"pending": st.Pending, "due": st.Due, "scheduled": st.Scheduled, "active": 1,
		"succeeded": 2, "failed": 3, "canceled": 1, "corrupt": st.Corrupt,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("queues page: mails %s = %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
	if st.Due != 3 {
		t.Errorf("Stats.Due = %d, want the fixture's 3", st.Due)
	}
	if got := rowCounts(t, body, "other"); got["pending"] != 1 {
		t.Errorf("queues page: other pending = %d, want 1", got["pending"])
	}
	if rowCounts(t, body, hostileQueue)["pending"] != 1 {
		t.Error("the hostile queue's row is missing or wrong")
	}
	if strings.Contains(body, "paused") {
		t.Error("no queue is paused, yet the page says paused")
	}
}

// A handler that ignores its canceled context shows as stuck on the
// queues page and on its queue's page, and no longer once it returns.
func TestStuckHandlersShown(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	q, err := jobkey.NewQueue(f.rdb, "stuck", &jobkey.Config{Prefix: f.prefix})
	if err != nil {
		t.Fatal(err)
	}
	j, err := q.Enqueue(ctx, "stubborn", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(wctx, jobkey.HandlerFunc(func(context.Context, *jobkey.Job) ([]byte, error) {
			close(started)
			<-release // ignores its context
			return nil, nil
		}), &jobkey.WorkOpts{Concurrency: 1, StuckAfter: 100 * time.Millisecond, TrimInterval: -1,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	<-started
	if _, err := q.Cancel(ctx, j.ID); err != nil {
		t.Fatal(err)
	}
	stuck := func() int64 {
		st, err := q.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.StuckHandlers
	}
	for deadline := time.Now().Add(10 * time.Second); stuck() != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the handler was never reported stuck")
		}
	}
	c := f.client(t)
	resp, body := f.fetch(t, c, "/")
	wantStatus(t, resp, body, http.StatusOK)
	if got := rowCounts(t, body, "stuck")["stuck"]; got != 1 {
		t.Errorf("queues page: stuck = %d, want 1", got)
	}
	if _, ok := rowCounts(t, body, "mails")["stuck"]; ok {
		t.Error("queues page: a queue with no stuck handler is marked stuck")
	}
	resp, body = f.fetch(t, c, "/queue?name=stuck")
	wantStatus(t, resp, body, http.StatusOK)
	if !regexp.MustCompile(`data-count="stuck"[^>]*>1 stuck handlers`).MatchString(body) {
		t.Errorf("queue page does not show the stuck handler:\n%s", body)
	}

	close(release)
	for deadline := time.Now().Add(10 * time.Second); stuck() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stuck count did not drop")
		}
	}
	resp, body = f.fetch(t, c, "/queue?name=stuck")
	wantStatus(t, resp, body, http.StatusOK)
	if strings.Contains(body, `data-count="stuck"`) {
		t.Error("queue page still shows a stuck handler after it returned")
	}
}

func TestQueuePageListsEveryState(t *testing.T) {
	f := newFixture(t, Options{})
	c := f.client(t)
	for _, tc := range []struct {
		state string
		want  []string
	}{
		{"pending", []string{"p1", "p2", "p3", "later"}},
		{"active", f.active},
		{"succeeded", f.succeeded},
		{"failed", f.failed},
		{"canceled", f.canceled},
	} {
		resp, body := f.fetch(t, c, "/queue?name=mails&state="+tc.state)
		wantStatus(t, resp, body, http.StatusOK)
		got := listedIDs(body)
		if !sameSet(got, tc.want) {
			t.Errorf("%s: listed %q, want %q", tc.state, got, tc.want)
		}
		if !strings.Contains(body, `data-state="`+tc.state+`" class="on"`) {
			t.Errorf("%s: its tab is not marked current", tc.state)
		}
	}
	// Pending comes by RunAt: the scheduled job last.
	_, body := f.fetch(t, c, "/queue?name=mails&state=pending")
	if ids := listedIDs(body); len(ids) == 0 || ids[len(ids)-1] != "later" {
		t.Errorf("pending: %q, want the job scheduled in an hour last", ids)
	}
	// The unreadable value listed as pending is shown as such, with why.
	if !regexp.MustCompile(`<tr data-id="broken"><td class="id"><a href="[^"]+">broken</a></td><td class="error">[^<]*corrupt job value`).MatchString(body) {
		t.Errorf("pending: the corrupt entry is not listed as unreadable:\n%s", body)
	}
	// The corrupt listing: the value claimers set aside.
	resp, body := f.fetch(t, c, "/queue?name=mails&state=corrupt")
	wantStatus(t, resp, body, http.StatusOK)
	if !strings.Contains(body, `<tr data-id="set-aside">`) || !strings.Contains(body, `data-state="corrupt" class="on"`) {
		t.Errorf("corrupt: set-aside not listed:\n%s", body)
	}
	// Type filter.
	_, body = f.fetch(t, c, "/queue?name=mails&state=failed&type=digest")
	if got := listedIDs(body); !sameSet(got, []string{"f2"}) {
		t.Errorf("failed of type digest: %q, want [f2]", got)
	}
	_, body = f.fetch(t, c, "/queue?name=mails&state=failed&type=nope")
	if got := listedIDs(body); len(got) != 0 || !strings.Contains(body, "No failed jobs of type") {
		t.Errorf("failed of type nope: %q, and the page does not say none", got)
	}
}

func TestQueuePagePages(t *testing.T) {
	f := newFixture(t, Options{PageSize: 2})
	c := f.client(t)
	var seen []string
	next := "/queue?name=mails&state=pending"
	for pages := 0; next != ""; pages++ {
		if pages > 10 {
			t.Fatal("more than 10 pages for 4 jobs")
		}
		resp, body := f.fetch(t, c, next)
		wantStatus(t, resp, body, http.StatusOK)
		ids := listedIDs(body)
		if len(ids) > 2 {
			t.Fatalf("page of %d jobs with PageSize 2", len(ids))
		}
		seen = append(seen, ids...)
		next = ""
		if m := regexp.MustCompile(`<a href="([^"]+)" rel="next">`).FindStringSubmatch(body); m != nil {
			next = strings.TrimPrefix(html.UnescapeString(m[1]), "")
		}
		if pages > 0 && !strings.Contains(body, "first page") {
			t.Error("a later page has no link back to the first")
		}
	}
	if len(seen) != 4 || !sameSet(seen, []string{"p1", "p2", "p3", "later"}) {
		t.Errorf("paging saw %q, want each pending job once", seen)
	}
}

// A page of a rare type that stopped at its bound of entries says so, so
// nobody takes it for all there is. Here 2 digests among 1,200 jobs, at 0
// and 1,100, and pages of 50: the first page reads 1,000 entries.
func TestQueuePageSaysWhenItsScanStoppedEarly(t *testing.T) {
	f := newFixture(t, Options{})
	c := f.client(t)
	ctx := context.Background()
	q, err := jobkey.NewQueue(f.rdb, "sparse", &jobkey.Config{Prefix: f.prefix})
	require.NoError(t, err)
	var specs []jobkey.JobSpec
	for i := range 1200 {
		typ := "welcome"
		if i == 0 || i == 1100 {
			typ = "digest"
		}
		specs = append(specs, jobkey.JobSpec{Type: typ, Opts: &jobkey.EnqueueOpts{Delay: time.Minute + time.Duration(i)*time.Millisecond}})
	}
	for c := range slices.Chunk(specs, 200) {
		_, err := q.EnqueueMany(ctx, c)
		require.NoError(t, err)
	}
	resp, body := f.fetch(t, c, "/queue?name=sparse&state=pending&type=digest")
	wantStatus(t, resp, body, http.StatusOK)
	require.Len(t, listedIDs(body), 1)
	require.Contains(t, body, `<p class="note" id="scan-stopped">This page stopped after reading 1000 entries, with 1 of the 50 jobs a page holds: it is not the last page, and the next may hold more.</p>`)
	require.Contains(t, body, `rel="next">next page`)

	_, body = f.fetch(t, c, "/queue?name=sparse&state=pending&type=resize")
	require.Contains(t, body, "No pending jobs of type <code>resize</code> on this page.")
	require.Contains(t, body, `id="scan-stopped"`)

	_, body = f.fetch(t, c, "/queue?name=sparse&state=pending")
	require.NotContains(t, body, `id="scan-stopped"`, "a full page did not stop early")
}

func TestJobPage(t *testing.T) {
	f := newFixture(t, Options{})
	c := f.client(t)
	job := func(id string) string {
		t.Helper()
		resp, body := f.fetch(t, c, "/job?queue=mails&id="+url.QueryEscape(id))
		wantStatus(t, resp, body, http.StatusOK)
		return body
	}
	body := job("f1")
	for _, want := range []string{
		`<span class="badge state-failed">failed</span>`,
		`<code>welcome</code>`,
		"1 of 25",
		"smtp: 550 mailbox unavailable",
		"Payload <span class=\"note\">(JSON, 24 bytes)",
		"{\n  &#34;to&#34;: &#34;eve@example.com&#34;\n}", // indented
		"worker-1",
		"Claimed 1 time of 25 allowed",
		f.q.Keys("f1").Job,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("job f1: page lacks %q", want)
		}
	}
	if body := job("f2"); !strings.Contains(body, "(hex, 4 bytes)") || !strings.Contains(body, "00 ff 10 80") {
		t.Errorf("job f2: binary payload not shown as hex:\n%s", body)
	}
	if body := job("c1"); !strings.Contains(body, "(text, 18 bytes)") || !strings.Contains(body, "plain text payload") {
		t.Error("job c1: text payload not shown as text")
	}
	if body := job("s1"); !strings.Contains(body, "Result") || !strings.Contains(body, "sent") {
		t.Error("job s1: result not shown")
	}
	// Meta, such as a trace context: every entry shown, escaped.
	_, err := f.q.Enqueue(context.Background(), "welcome", nil, &jobkey.EnqueueOpts{ID: "m1",
		Meta: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "<b>k": "<i>v"}})
	if err != nil {
		t.Fatal(err)
	}
	body = job("m1")
	for _, want := range []string{
		"meta <code>traceparent</code>", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"meta <code>&lt;b&gt;k</code>", "<code>&lt;i&gt;v</code>",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("job m1: page lacks %q", want)
		}
	}
	// A concurrency key, escaped like every string.
	_, err = f.q.Enqueue(context.Background(), "welcome", nil, &jobkey.EnqueueOpts{ID: "k1", ConcurrencyKey: "<b>acme"})
	if err != nil {
		t.Fatal(err)
	}
	if body := job("k1"); !strings.Contains(body, `<dt>concurrency key</dt><dd id="concurrency-key"><code>&lt;b&gt;acme</code>`) {
		t.Errorf("job k1: concurrency key not shown escaped:\n%s", body)
	}
	if body := job("m1"); strings.Contains(body, "concurrency key") {
		t.Error("job m1: a job without a key shows one")
	}
	body = job(f.corrupt)
	if !strings.Contains(body, "unreadable") || !strings.Contains(body, "corrupt job value") {
		t.Errorf("corrupt job: page does not say it is unreadable and why:\n%s", body)
	}
	if !strings.Contains(body, "c1 20 6e 6f 74") { // "\xc1 not", the stored bytes
		t.Errorf("corrupt job: stored bytes not shown:\n%s", body)
	}
}

// The job page lists the runs the value keeps, oldest first, escaped, and
// how many older ones were dropped; it and the active listing show a
// running job's progress.
func TestJobPageShowsAttemptHistoryAndProgress(t *testing.T) {
	f := newFixture(t, Options{})
	c := f.client(t)
	ctx := context.Background()
	q, err := jobkey.NewQueue(f.rdb, "hist", &jobkey.Config{Prefix: f.prefix})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "welcome", nil, &jobkey.EnqueueOpts{ID: "h1"})
	require.NoError(t, err)
	j, err := q.Claim(ctx, "worker-<7>")
	require.NoError(t, err)
	require.Equal(t, "h1", j.ID)
	_, err = q.Fail(ctx, j, jobkey.RetryAfter(0, errors.New("<b>429</b>")))
	require.NoError(t, err)
	j, err = q.Claim(ctx, "worker-8")
	require.NoError(t, err)
	_, err = q.Fail(ctx, j, jobkey.Snooze(time.Hour))
	require.NoError(t, err)

	resp, body := f.fetch(t, c, "/job?queue=hist&id=h1")
	wantStatus(t, resp, body, http.StatusOK)
	for _, want := range []string{
		`<table class="runs" id="history">`,
		`<code>worker-&lt;7&gt;</code>`, `&lt;b&gt;429&lt;/b&gt; (retry after 0s)`, `outcome-failed">failed`,
		`<code>worker-8</code>`, `outcome-snoozed">snoozed`, "jobkey: snoozed for 1h0m0s",
		`<dt>snoozes</dt><dd id="snoozes">1</dd>`,
	} {
		require.Contains(t, body, want)
	}
	table := body[strings.Index(body, `id="history"`):]
	require.Less(t, strings.Index(table, "worker-&lt;7&gt;"), strings.Index(table, "worker-8"), "oldest first")
	require.NotContains(t, body, "<b>429")

	// A running job's progress, on its page and in the active listing.
	_, err = q.Enqueue(ctx, "import", nil, &jobkey.EnqueueOpts{ID: "p1"})
	require.NoError(t, err)
	j, err = q.Claim(ctx, "worker-9")
	require.NoError(t, err)
	require.Equal(t, "p1", j.ID)
	j.Progress = []byte("<i>rows 40 of 100</i>")
	_, err = q.Extend(ctx, j)
	require.NoError(t, err)
	resp, body = f.fetch(t, c, "/job?queue=hist&id=p1")
	wantStatus(t, resp, body, http.StatusOK)
	require.Contains(t, body, `<dt>progress</dt><dd id="progress"><code>&lt;i&gt;rows 40 of 100&lt;/i&gt;</code></dd>`)
	resp, body = f.fetch(t, c, "/queue?name=hist&state=active")
	wantStatus(t, resp, body, http.StatusOK)
	require.Contains(t, body, `<th>progress</th>`)
	require.Contains(t, body, `<td class="progress">&lt;i&gt;rows 40 of 100&lt;/i&gt;</td>`)
}

// signUp is job arguments as a user writes them for EnqueueArgs.
type signUp struct {
	Email string
	Plan  string
}

func (signUp) Kind() string { return "sign_up" }

// A payload EnqueueArgs wrote is msgpack: the job page shows it as
// indented JSON, and a <script> inside a string stays text.
func TestJobPageShowsEnqueueArgsPayloadAsJSON(t *testing.T) {
	f := newFixture(t, Options{})
	c := f.client(t)
	j, err := jobkey.EnqueueArgs(context.Background(), f.q, signUp{Email: "ada@example.com", Plan: "<script>window.__pwned=1</script>\x1b[2J"},
		&jobkey.EnqueueOpts{ID: "args1"})
	require.NoError(t, err)
	resp, body := f.fetch(t, c, "/job?queue=mails&id=args1")
	wantStatus(t, resp, body, http.StatusOK)
	require.Contains(t, body, "Payload <span class=\"note\">(msgpack, "+strconv.Itoa(len(j.Payload))+" bytes, shown as JSON)")
	require.Contains(t, body, "{\n  &#34;Email&#34;: &#34;ada@example.com&#34;,\n  &#34;Plan&#34;: &#34;&lt;script&gt;window.__pwned=1&lt;/script&gt;\\u001b[2J&#34;\n}")
	require.NotContains(t, body, "<script>window")
	require.NotContains(t, body, "\x1b")
}

// Once a job succeeded, the error an earlier attempt left is history: the
// job page and the succeeded listing show it so, not in red as the job's
// last error.
func TestSucceededJobShowsItsErrorAsHistory(t *testing.T) {
	f := newFixture(t, Options{})
	c := f.client(t)
	ctx := context.Background()
	q, err := jobkey.NewQueue(f.rdb, "retried", &jobkey.Config{Prefix: f.prefix})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "welcome", nil, &jobkey.EnqueueOpts{ID: "r1", MaxAttempts: 1})
	require.NoError(t, err)
	j, err := q.Claim(ctx, "worker-1")
	require.NoError(t, err)
	_, err = q.Fail(ctx, j, errors.New("smtp: 550 mailbox unavailable"))
	require.NoError(t, err)
	_, err = q.Retry(ctx, "r1")
	require.NoError(t, err)
	j, err = q.Claim(ctx, "worker-2")
	require.NoError(t, err)
	done, err := q.Complete(ctx, j, nil)
	require.NoError(t, err)
	require.Equal(t, jobkey.StateSucceeded, done.State)
	require.Equal(t, "smtp: 550 mailbox unavailable", done.LastError, "the value keeps it")

	resp, body := f.fetch(t, c, "/job?queue=retried&id=r1")
	wantStatus(t, resp, body, http.StatusOK)
	require.Contains(t, body, "<h2>Error of an earlier attempt</h2>")
	require.Contains(t, body, `<pre class="past-error" id="past-error">smtp: 550 mailbox unavailable</pre>`)
	require.Contains(t, body, "An earlier attempt failed: <code>smtp: 550 mailbox unavailable</code>")
	require.NotContains(t, body, `id="last-error"`)
	require.NotContains(t, body, "Last error")

	_, body = f.fetch(t, c, "/queue?name=retried&state=succeeded")
	require.Contains(t, body, "<th>earlier error</th>")
	require.Contains(t, body, `<td class="past-error">smtp: 550 mailbox unavailable</td>`)
	require.NotContains(t, body, `<td class="error">smtp`)

	_, body = f.fetch(t, c, "/job?queue=mails&id=f2") // still failed
	require.Contains(t, body, `<pre class="error" id="last-error">template missing`)
}

func TestErrorStatuses(t *testing.T) {
	f := newFixture(t, Options{})
	c := f.client(t)
	for _, tc := range []struct {
		path string
		code int
	}{
		{"/job?queue=mails&id=nope", http.StatusNotFound},
		{"/job?queue=nope&id=x", http.StatusNotFound},
		{"/queue?name=nope", http.StatusNotFound},
		{"/queue?name=mails&state=weird", http.StatusBadRequest},
		{"/job?queue=mails&id=", http.StatusBadRequest},
		{"/queue?name=a:b", http.StatusBadRequest},
		{"/no/such/page", http.StatusNotFound},
	} {
		resp, body := f.fetch(t, c, tc.path)
		wantStatus(t, resp, body, tc.code)
		if !strings.Contains(body, `<p class="error" id="message">`) {
			t.Errorf("%s: no one-line message", tc.path)
		}
	}
	// A Redis that cannot be reached: 503, one line that says so.
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { down.Close() })
	h, err := New(down, Options{Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "Redis at 127.0.0.1:1 could not be reached") {
		t.Errorf("unreachable Redis: %d\n%s", rec.Code, rec.Body.String())
	}
}

func TestStatusOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
	}{
		{jobkey.ErrNotFound, 404},
		{&jobkey.StateError{ID: "x", Op: "delete", State: jobkey.StateActive}, 409},
		{errors.Join(errors.New("wrapped"), jobkey.ErrInvalid), 400},
		{&jobkey.UnreachableError{Addr: "h:1", Err: errors.New("refused")}, 503},
		{errors.New("anything else"), 500},
	} {
		if got := status(tc.err); got != tc.code {
			t.Errorf("status(%v) = %d, want %d", tc.err, got, tc.code)
		}
	}
}

// TestHostileStringsAreEscaped looks for every hostile string, as markup,
// in every page that shows it: none may appear unescaped.
func TestHostileStringsAreEscaped(t *testing.T) {
	f := newFixture(t, Options{})
	c := f.client(t)
	pages := []string{
		"/",
		"/queue?name=mails&state=failed",
		"/job?queue=mails&id=" + url.QueryEscape(hostileID),
		"/queue?name=" + url.QueryEscape(hostileQueue) + "&state=pending",
		"/job?queue=" + url.QueryEscape(hostileQueue) + "&id=" + url.QueryEscape(hostileID),
		"/job?queue=mails&id=" + url.QueryEscape("<script>x</script>"), // a 404 that names the ID
	}
	raw := []string{"<script>window", "<img src=x", "<img/", "<b>evil", `onerror="window`}
	for _, p := range pages {
		_, body := f.fetch(t, c, p)
		for _, r := range raw {
			if strings.Contains(body, r) {
				t.Errorf("%s: %q appears unescaped", p, r)
			}
		}
	}
	// And the escaped forms are there: the strings are shown, not dropped.
	_, body := f.fetch(t, c, "/job?queue=mails&id="+url.QueryEscape(hostileID))
	for _, want := range []string{
		"&lt;script&gt;window.__pwned=&#34;type&#34;",
		"&lt;img src=x onerror=\\&#34;window.__pwned=",
		"boom &lt;img src=x onerror=&#34;window.__pwned=",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("hostile job page lacks the escaped %q", want)
		}
	}
}

func TestSecurityHeaders(t *testing.T) {
	f := newFixture(t, Options{})
	c := f.client(t)
	for _, p := range []string{"/", "/queue?name=mails", "/job?queue=mails&id=f1", "/job?queue=mails&id=nope", "/static/style.css", "/action/retry"} {
		resp, body := f.fetch(t, c, p)
		h := resp.Header
		csp := h.Get("Content-Security-Policy")
		if !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "script-src 'none'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("%s: CSP %q", p, csp)
		}
		if h.Get("X-Content-Type-Options") != "nosniff" || h.Get("X-Frame-Options") != "DENY" || h.Get("Referrer-Policy") != "same-origin" {
			t.Errorf("%s: headers %v", p, h)
		}
		if strings.Contains(body, "<script") {
			t.Errorf("%s: the page carries a script element", p)
		}
	}
	resp, body := f.fetch(t, c, "/static/style.css")
	wantStatus(t, resp, body, http.StatusOK)
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/css") || !strings.Contains(body, "table") {
		t.Errorf("stylesheet: %s %q", resp.Header.Get("Content-Type"), body[:min(len(body), 80)])
	}
}

func TestActionsRefuseGET(t *testing.T) {
	f := newFixture(t, Options{})
	c := f.client(t)
	tok := f.token(t, c)
	for _, a := range []string{"retry", "cancel", "delete", "pause", "resume", "retry-failed", "delete-finished", "cancel-pending"} {
		resp, body := f.fetch(t, c, "/action/"+a+"?queue=mails&id=f1&confirm=yes&state=failed&csrf="+url.QueryEscape(tok))
		wantStatus(t, resp, body, http.StatusMethodNotAllowed)
		if resp.Header.Get("Allow") != "POST" {
			t.Errorf("%s: Allow %q", a, resp.Header.Get("Allow"))
		}
	}
	j, err := f.q.Get(context.Background(), "f1")
	if err != nil || j.State != jobkey.StateFailed {
		t.Fatalf("after GETs on actions: %v %v, want f1 still failed", j, err)
	}
	// And pages refuse POST.
	resp, err := c.PostForm(f.srv.URL+"/queue", url.Values{"name": {"mails"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST to a page: %d", resp.StatusCode)
	}
}

func TestCSRF(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	c := f.client(t)
	tok := f.token(t, c)
	stillFailed := func() {
		t.Helper()
		j, err := f.q.Get(ctx, "f1")
		if err != nil || j.State != jobkey.StateFailed {
			t.Fatalf("f1: %v %v, want still failed", j, err)
		}
	}
	form := func(token string) url.Values {
		v := url.Values{"queue": {"mails"}, "id": {"f1"}}
		if token != "" {
			v.Set("csrf", token)
		}
		return v
	}

	// No cookie at all (another site's form, or a script), with and
	// without a token taken from a real session.
	bare := &http.Client{CheckRedirect: c.CheckRedirect}
	for _, v := range []url.Values{form(""), form(tok)} {
		resp, body := f.post(t, bare, "retry", v)
		wantStatus(t, resp, body, http.StatusForbidden)
	}
	// The session cookie but no token, a wrong token, a token of another
	// session.
	other := f.client(t)
	for _, token := range []string{"", "AAAA" + tok[4:], tok + "x", f.token(t, other), "not base64!"} {
		resp, body := f.post(t, c, "retry", form(token))
		wantStatus(t, resp, body, http.StatusForbidden)
	}
	// A browser that says the request is cross-site.
	req, _ := http.NewRequest("POST", f.srv.URL+"/action/retry", strings.NewReader(form(tok).Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("Sec-Fetch-Site cross-site: %d, want 403", resp.StatusCode)
	}
	stillFailed()

	// The right token in its own session: done.
	resp, body := f.post(t, c, "retry", form(tok))
	wantStatus(t, resp, body, http.StatusSeeOther)
	if j, err := f.q.Get(ctx, "f1"); err != nil || j.State != jobkey.StatePending {
		t.Fatalf("f1 after retry: %v %v, want pending", j, err)
	}
}

func TestSessionCookieAttributes(t *testing.T) {
	f := newFixture(t, Options{BasePath: "/"})
	resp, err := http.Get(f.srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var found bool
	for _, ck := range resp.Cookies() {
		if ck.Name == sessionCookie {
			found = true
			if ck.SameSite != http.SameSiteStrictMode || !ck.HttpOnly || ck.Path != "/" {
				t.Errorf("session cookie %+v: want SameSite=Strict, HttpOnly, Path /", ck)
			}
		}
	}
	if !found {
		t.Error("no session cookie set by a page with forms")
	}
}

func TestActions(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	c := f.client(t)
	tok := f.token(t, c)
	do := func(action string, v url.Values, code int) (*http.Response, string) {
		t.Helper()
		v.Set("csrf", tok)
		resp, body := f.post(t, c, action, v)
		wantStatus(t, resp, body, code)
		return resp, body
	}
	state := func(id string) jobkey.State {
		t.Helper()
		j, err := f.q.Get(ctx, id)
		if err != nil {
			t.Fatalf("Get %s: %v", id, err)
		}
		return j.State
	}

	// Retry: 303 to the job's page, which shows the flash once.
	resp, _ := do("retry", url.Values{"queue": {"mails"}, "id": {"f1"}}, http.StatusSeeOther)
	if loc := resp.Header.Get("Location"); loc != "/job?id=f1&queue=mails" {
		t.Errorf("retry redirects to %q", loc)
	}
	if state("f1") != jobkey.StatePending {
		t.Error("f1 not pending after retry")
	}
	_, body := f.fetch(t, c, resp.Header.Get("Location"))
	if !strings.Contains(body, `<p class="flash" role="status">Job f1 retried: it is pending.</p>`) {
		t.Errorf("no flash after retry:\n%s", body)
	}
	if _, body := f.fetch(t, c, "/"); strings.Contains(body, "flash") {
		t.Error("the flash shows twice")
	}

	// Cancel a pending job, then cancel it again (no change), retry a
	// pending job (409), delete an active one (409).
	do("cancel", url.Values{"queue": {"mails"}, "id": {"p1"}}, http.StatusSeeOther)
	if state("p1") != jobkey.StateCanceled {
		t.Error("p1 not canceled")
	}
	do("retry", url.Values{"queue": {"mails"}, "id": {"p2"}}, http.StatusConflict)
	do("delete", url.Values{"queue": {"mails"}, "id": {"a1"}}, http.StatusConflict)
	if state("a1") != jobkey.StateActive {
		t.Error("a1 changed by a refused delete")
	}
	do("cancel", url.Values{"queue": {"mails"}, "id": {"nope"}}, http.StatusNotFound)
	do("cancel", url.Values{"queue": {"nope"}, "id": {"p2"}}, http.StatusNotFound)

	// Delete: 303 to the listing of the state it was in; the job is gone.
	resp, _ = do("delete", url.Values{"queue": {"mails"}, "id": {"s1"}, "state": {"succeeded"}}, http.StatusSeeOther)
	if loc := resp.Header.Get("Location"); loc != "/queue?name=mails&state=succeeded" {
		t.Errorf("delete redirects to %q", loc)
	}
	if _, err := f.q.Get(ctx, "s1"); !errors.Is(err, jobkey.ErrNotFound) {
		t.Errorf("s1 after delete: %v", err)
	}

	// Pause and resume.
	do("pause", url.Values{"queue": {"mails"}}, http.StatusSeeOther)
	if st, _ := f.q.Stats(ctx); !st.Paused {
		t.Error("not paused")
	}
	_, body = f.fetch(t, c, "/queue?name=mails")
	if !strings.Contains(body, `<span class="badge paused">paused</span>`) || !strings.Contains(body, "Resume queue") {
		t.Error("queue page does not show the pause")
	}
	if _, body = f.fetch(t, c, "/"); !strings.Contains(body, "paused") {
		t.Error("queues page does not show the pause")
	}
	do("resume", url.Values{"queue": {"mails"}}, http.StatusSeeOther)
	if st, _ := f.q.Stats(ctx); st.Paused {
		t.Error("still paused")
	}

	// Bulk: refused unconfirmed; then retry every failed job.
	do("retry-failed", url.Values{"queue": {"mails"}}, http.StatusBadRequest)
	if st, _ := f.q.Stats(ctx); st.Failed != 2 {
		t.Fatalf("failed = %d before the bulk retry, want 2", st.Failed)
	}
	_, body = do("retry-failed", url.Values{"queue": {"mails"}, "confirm": {"yes"}}, http.StatusSeeOther)
	_ = body
	if st, _ := f.q.Stats(ctx); st.Failed != 0 {
		t.Errorf("failed = %d after retry-failed", st.Failed)
	}
	_, body = f.fetch(t, c, "/queue?name=mails&state=failed")
	if !strings.Contains(body, "Retried failed jobs: 2.") {
		t.Errorf("no count in the bulk flash:\n%s", body)
	}

	// Delete every canceled job: p1 goes; c1, canceled while it ran, stays
	// until that run's lease ends (its handler may still be stopping).
	do("delete-finished", url.Values{"queue": {"mails"}, "state": {"pending"}, "confirm": {"yes"}}, http.StatusBadRequest)
	do("delete-finished", url.Values{"queue": {"mails"}, "state": {"canceled"}, "confirm": {"yes"}}, http.StatusSeeOther)
	if st, _ := f.q.Stats(ctx); st.Canceled != 1 {
		t.Errorf("canceled = %d after delete-finished, want 1 (c1, whose run's lease lasts)", st.Canceled)
	}
	if _, err := f.q.Get(ctx, "c1"); err != nil {
		t.Errorf("c1: %v", err)
	}

	// Cancel the pending jobs of one type only.
	do("cancel-pending", url.Values{"queue": {"mails"}, "type": {"digest"}, "confirm": {"yes"}}, http.StatusSeeOther)
	if state("later") != jobkey.StateCanceled || state("f2") != jobkey.StateCanceled {
		t.Error("digest jobs not canceled")
	}
	if state("p2") != jobkey.StatePending {
		t.Error("a welcome job was canceled by a cancel of digest jobs")
	}
}

func TestReadOnly(t *testing.T) {
	f := newFixture(t, Options{ReadOnly: true})
	c := f.client(t)
	for _, p := range []string{"/", "/queue?name=mails&state=failed", "/queue?name=mails&state=pending", "/job?queue=mails&id=f1", "/job?queue=mails&id=p1"} {
		_, body := f.fetch(t, c, p)
		for _, hidden := range []string{`method="post"`, `name="csrf"`, "action/"} {
			if strings.Contains(body, hidden) {
				t.Errorf("read-only %s shows %q", p, hidden)
			}
		}
		if !strings.Contains(body, "read-only") {
			t.Errorf("read-only %s does not say so", p)
		}
	}
	// Every action is refused, whatever the form holds.
	for _, a := range []string{"retry", "cancel", "delete", "pause", "resume", "retry-failed", "delete-finished", "cancel-pending"} {
		resp, body := f.post(t, c, a, url.Values{"queue": {"mails"}, "id": {"f1"}, "confirm": {"yes"}, "state": {"failed"}})
		wantStatus(t, resp, body, http.StatusForbidden)
	}
	j, err := f.q.Get(context.Background(), "f1")
	if err != nil || j.State != jobkey.StateFailed {
		t.Fatalf("f1: %v %v after refused actions", j, err)
	}
	if st, _ := f.q.Stats(context.Background()); st.Paused || st.Failed != 3 {
		t.Errorf("read-only actions changed the queue: %+v", st)
	}
}

func TestBasePath(t *testing.T) {
	f := newFixture(t, Options{BasePath: "/ops/jobs"})
	mux := http.NewServeMux()
	mux.Handle("/ops/jobs/", http.StripPrefix("/ops/jobs", f.h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/ops/jobs/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body := string(b)
	wantStatus(t, resp, body, http.StatusOK)
	for _, want := range []string{`href="/ops/jobs/static/style.css"`, `href="/ops/jobs/queue?name=mails"`} {
		if !strings.Contains(body, want) {
			t.Errorf("mounted page lacks %s", want)
		}
	}
	for _, ck := range resp.Cookies() {
		if ck.Name == sessionCookie && ck.Path != "/ops/jobs/" {
			t.Errorf("session cookie path %q", ck.Path)
		}
	}
	resp, err = http.Get(srv.URL + "/ops/jobs/static/style.css")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("stylesheet under the base path: %d", resp.StatusCode)
	}
}

func TestNewRefuses(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	for _, o := range []Options{
		{BasePath: "jobs"}, {BasePath: "/a b/"}, {BasePath: "//evil.example/"},
		{CSRFKey: []byte("short")}, {PageSize: -1}, {PageSize: 1001},
	} {
		if _, err := New(rdb, o); !errors.Is(err, jobkey.ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", o, err)
		}
	}
	if _, err := New(nil, Options{}); !errors.Is(err, jobkey.ErrInvalid) {
		t.Errorf("New(nil) = %v", err)
	}
}

func TestShow(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		kind string
		text string
	}{
		{nil, "empty", ""},
		{[]byte(`{"a":[1,2]}`), "JSON", "{\n  \"a\": [\n    1,\n    2\n  ]\n}"},
		{[]byte("héllo\tworld\n"), "text", "héllo\tworld\n"},
		{[]byte("bell\x07"), "hex", ""},
		{[]byte{0xff, 0xfe}, "hex", ""},
		{[]byte(`"just a string"`), "JSON", `"just a string"`},
	} {
		s := show(tc.in)
		if s.Kind != tc.kind || (tc.text != "" && s.Text != tc.text) || s.Bytes != len(tc.in) {
			t.Errorf("show(%q) = %+v, want %s %q", tc.in, s, tc.kind, tc.text)
		}
	}
	big := []byte(strings.Repeat("é", showLimit)) // 2 bytes a rune
	s := show(big)
	if !s.Cut || len(s.Text) > showLimit || s.Kind != "text" || !strings.HasSuffix(s.Text, "é") {
		t.Errorf("big text: cut %v, %d bytes, kind %s", s.Cut, len(s.Text), s.Kind)
	}
}

// queueForms reads the queue every form of a page posts.
var queueFieldRE = regexp.MustCompile(`<input type="hidden" name="queue" value="([^"]*)">`)

// A value copied from queue "other" into queue mails' key names "other"
// as its queue. The job page of mails shows it, and its forms act on
// mails, the page's queue: Delete there used to delete other's job.
func TestJobPageFormsActOnThePagesQueue(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	other, err := jobkey.NewQueue(f.rdb, "other", &jobkey.Config{Prefix: f.prefix})
	require.NoError(t, err)
	_, err = other.Enqueue(ctx, "x", []byte("other's"), &jobkey.EnqueueOpts{ID: "same"})
	require.NoError(t, err)
	_, err = f.q.Enqueue(ctx, "x", []byte("mails'"), &jobkey.EnqueueOpts{ID: "same"})
	require.NoError(t, err)
	copied, err := f.rdb.Get(ctx, other.Keys("same").Job).Result()
	require.NoError(t, err)
	require.NoError(t, f.rdb.Set(ctx, f.q.Keys("same").Job, copied, 0).Err())

	c := f.client(t)
	tok := f.token(t, c)
	resp, body := f.fetch(t, c, "/job?queue=mails&id=same")
	wantStatus(t, resp, body, http.StatusOK)
	queues := formQueues(body)
	for _, q := range queues {
		require.Equal(t, "mails", q, "a form of mails' job page acts on queue %q", q)
	}
	if len(queues) == 0 {
		// A value that names another queue may be shown as unreadable,
		// without forms; then nothing can be posted from it.
		require.Contains(t, body, "unreadable")
	} else {
		resp, body = f.post(t, c, "delete", url.Values{"csrf": {tok}, "queue": {queues[len(queues)-1]}, "id": {"same"}, "state": {"pending"}})
		require.NotEqual(t, http.StatusInternalServerError, resp.StatusCode, body)
	}
	j, err := other.Get(ctx, "same")
	require.NoError(t, err, "queue other's job is still there")
	require.Equal(t, []byte("other's"), j.Payload)

	// Every form of every page names the page's queue.
	for _, p := range []string{"/queue?name=mails&state=failed", "/queue?name=mails&state=pending", "/job?queue=mails&id=f1", "/job?queue=mails&id=p1"} {
		_, body := f.fetch(t, c, p)
		qs := formQueues(body)
		require.NotEmpty(t, qs, p)
		for _, q := range qs {
			require.Equal(t, "mails", q, p)
		}
	}
}

// brokenQueue makes queue "wide" of 4 shards with 12 pending jobs under
// f's prefix, and makes shard 1's pending listing unreadable (one of its
// ready indexes holds a string). It returns the jobs on the other shards.
func brokenQueue(t *testing.T, f *fixture) (q *jobkey.Queue, readable []string) {
	t.Helper()
	ctx := context.Background()
	q, err := jobkey.NewQueue(f.rdb, "wide", &jobkey.Config{Prefix: f.prefix, Shards: 4})
	require.NoError(t, err)
	bad := ""
	for i := range 12 {
		id := "w" + strconv.Itoa(i)
		_, err := q.Enqueue(ctx, "t", nil, &jobkey.EnqueueOpts{ID: id})
		require.NoError(t, err)
		ready := q.Keys(id).Ready
		if strings.Contains(ready, "{wide/1}") || strings.Contains(ready, "{wide/1.") {
			bad = ready + ".5"
		} else {
			readable = append(readable, id)
		}
	}
	require.NotEmpty(t, bad, "some jobs on shard 1")
	require.NotEmpty(t, readable)
	require.NoError(t, f.rdb.Set(ctx, bad, "not a zset", 0).Err())
	return q, readable
}

// A bulk action that left out a shard it could not read answers with
// what it did and the shard, not a bare 500.
func TestBulkActionAnswersWithWhatItDid(t *testing.T) {
	f := newFixture(t, Options{Logger: discardLogger()})
	q, readable := brokenQueue(t, f)
	c := f.client(t)
	tok := f.token(t, c)
	resp, body := f.post(t, c, "cancel-pending", url.Values{"csrf": {tok}, "queue": {"wide"}, "confirm": {"yes"}})
	wantStatus(t, resp, body, http.StatusInternalServerError)
	require.Contains(t, body, `<p class="flash" id="done">Done in part: Canceled pending jobs: `+strconv.Itoa(len(readable))+`.</p>`)
	require.Contains(t, body, `<p class="error" id="missing">1 of 4 shards could not be read: [1].`)
	require.Contains(t, body, `<a href="/queue?name=wide&amp;state=pending" id="back">`)
	require.NotContains(t, body, "nothing was written")
	st, err := q.Stats(context.Background())
	var se *jobkey.ShardsError
	require.ErrorAs(t, err, &se)
	require.EqualValues(t, len(readable), st.Canceled, "the page says what was done")
}

// The queue page lists the shards it could read, and names the others.
func TestQueuePageShowsTheReadableShards(t *testing.T) {
	f := newFixture(t, Options{})
	_, readable := brokenQueue(t, f)
	c := f.client(t)
	resp, body := f.fetch(t, c, "/queue?name=wide&state=pending")
	wantStatus(t, resp, body, http.StatusOK)
	require.ElementsMatch(t, readable, listedIDs(body))
	require.Contains(t, body, `<p class="error" id="list-missing">This page leaves out the jobs of 1 of 4 shards, which could not be read ([1])`)
}

// A queue deleted and created again with another shard count is read
// with its new count, without a restart.
func TestQueueCreatedAgainIsReadWithItsNewShardCount(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	c := f.client(t)
	two, err := jobkey.NewQueue(f.rdb, "again", &jobkey.Config{Prefix: f.prefix, Shards: 2})
	require.NoError(t, err)
	_, err = two.Enqueue(ctx, "t", nil, &jobkey.EnqueueOpts{ID: "old"})
	require.NoError(t, err)
	resp, body := f.fetch(t, c, "/queue?name=again&state=pending")
	wantStatus(t, resp, body, http.StatusOK)
	require.Equal(t, []string{"old"}, listedIDs(body))

	keys, err := f.rdb.Keys(ctx, f.prefix+":{again*").Result()
	require.NoError(t, err)
	require.NotEmpty(t, keys)
	require.NoError(t, f.rdb.Del(ctx, keys...).Err())
	resp, body = f.fetch(t, c, "/queue?name=again&state=pending")
	wantStatus(t, resp, body, http.StatusNotFound)

	eight, err := jobkey.NewQueue(f.rdb, "again", &jobkey.Config{Prefix: f.prefix, Shards: 8})
	require.NoError(t, err)
	var ids []string
	for i := range 16 {
		j, err := eight.Enqueue(ctx, "t", nil, &jobkey.EnqueueOpts{ID: "new" + strconv.Itoa(i)})
		require.NoError(t, err)
		ids = append(ids, j.ID)
	}
	resp, body = f.fetch(t, c, "/queue?name=again&state=pending")
	wantStatus(t, resp, body, http.StatusOK)
	require.ElementsMatch(t, ids, listedIDs(body), "every shard of the new count is read")
	for _, id := range ids {
		resp, body := f.fetch(t, c, "/job?queue=again&id="+id)
		wantStatus(t, resp, body, http.StatusOK)
	}
}

// readerLine is the README's ACL line of a user that can only read.
func readerLine(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "ACL SETUSER jobkey-reader ") {
			return strings.TrimSpace(line)
		}
	}
	t.Fatal("README.md has no jobkey-reader line")
	return ""
}

// A read-only UI whose Redis user may only read (the README's reader
// line) serves every page, and Redis refuses it nothing: opening a queue
// reads its shard count instead of writing it.
func TestReadOnlyACLUserSeesEveryPage(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	ctx := context.Background()
	root := redistest.ClientFor(t, srv.URL(), nil)
	q, err := jobkey.NewQueue(root, "mails", &jobkey.Config{Shards: 4})
	require.NoError(t, err)
	for _, id := range []string{"p1", "p2"} {
		_, err := q.Enqueue(ctx, "welcome", []byte(`{"n":1}`), &jobkey.EnqueueOpts{ID: id})
		require.NoError(t, err)
	}
	j, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	_, err = q.Fail(ctx, j, errors.Join(errors.New("boom"), jobkey.ErrSkipRetry))
	require.NoError(t, err)

	var cmd []any
	for _, w := range strings.Fields(readerLine(t)) {
		cmd = append(cmd, w)
	}
	require.NoError(t, root.Do(ctx, cmd...).Err())
	require.NoError(t, root.Do(ctx, "acl", "log", "reset").Err())
	reader := redistest.ClientFor(t, srv.URL(), func(o *redis.Options) { o.Username, o.Password = "jobkey-reader", "PASSWORD" })

	h, err := New(reader, Options{ReadOnly: true})
	require.NoError(t, err)
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	for _, p := range []string{"/", "/queue?name=mails", "/queue?name=mails&state=failed", "/queue?name=mails&state=active",
		"/queue?name=mails&state=succeeded", "/queue?name=mails&state=canceled", "/queue?name=mails&state=corrupt",
		"/job?queue=mails&id=p1", "/history?name=mails", "/workers?name=mails", "/keys?name=mails", "/job?queue=mails&id=" + j.ID} {
		resp, err := http.Get(s.URL + p)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s:\n%s", p, b)
	}
	refused, err := root.Do(ctx, "acl", "log").Slice()
	require.NoError(t, err)
	require.Empty(t, refused, "Redis refused the reader nothing")
	require.ErrorContains(t, reader.Set(ctx, "jobkey:{mails}:meta", "shards=1", 0).Err(), "NOPERM", "and it cannot write")
}

// dropKey leaves out of every pipeline the commands on key, answering
// them with a connection error, as a cluster node that is down would.
type dropKey string

func (h dropKey) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h dropKey) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h dropKey) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var keep []redis.Cmder
		for _, c := range cmds {
			if a := c.Args(); len(a) > 1 && a[1] == string(h) {
				c.SetErr(errors.New("dial tcp 10.0.0.9:6379: connect: connection refused"))
				continue
			}
			keep = append(keep, c)
		}
		return next(ctx, keep)
	}
}

// A Pause that could not write one shard says on how many it did, and
// which it could not write.
func TestPauseOnSomeShardsSaysWhichItDid(t *testing.T) {
	f := newFixture(t, Options{Logger: discardLogger()})
	ctx := context.Background()
	q, err := jobkey.NewQueue(f.rdb, "four", &jobkey.Config{Prefix: f.prefix, Shards: 4})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	c := f.client(t)
	tok := f.token(t, c)
	// The shard of an ID on shard 2 names its pause flag: same tag.
	flag := ""
	for i := 0; flag == ""; i++ {
		ready := q.Keys("id" + strconv.Itoa(i)).Ready
		if strings.Contains(ready, "{four/2}") || strings.Contains(ready, "{four/2.") {
			flag = strings.TrimSuffix(ready, ":ready") + ":paused"
		}
	}
	f.rdb.AddHook(dropKey(flag))
	resp, body := f.post(t, c, "pause", url.Values{"csrf": {tok}, "queue": {"four"}})
	wantStatus(t, resp, body, http.StatusInternalServerError)
	require.Contains(t, body, `<p class="flash" id="done">Done in part: Queue paused on 3 of 4 shards.</p>`)
	require.Contains(t, body, `<p class="error" id="missing">1 of 4 shards could not be written: [2].</p>`)
}

// With Options.MinReplicas, an action the replicas did not confirm
// answers with an error page that says it was applied on the master only,
// never with a success; a bulk action says how many of its jobs were. Once
// the replica is back, the same action succeeds, and the replica holds
// what it did when it answers. (The replica timeout is one a just-thawed
// replica keeps on a loaded machine.)
func TestActionTheReplicasDidNotConfirmIsMasterOnly(t *testing.T) {
	t.Parallel()
	f := newReplicatedFixture(t, Options{MinReplicas: 1, ReplicaTimeout: time.Second, Logger: discardLogger()})
	ctx := context.Background()
	c := f.client(t)
	tok := f.token(t, c)
	thaw := f.freeze(t)

	resp, body := f.post(t, c, "cancel", url.Values{"csrf": {tok}, "queue": {"mails"}, "id": {"p1"}})
	wantStatus(t, resp, body, http.StatusServiceUnavailable)
	require.Contains(t, body, `<p class="error" id="master-only">Job p1 canceled on the master only: `+
		`0 of 1 replicas confirmed the write within 1s, so a failover now may undo it.`)
	require.NotContains(t, body, "Done in part")
	require.Empty(t, resp.Header.Get("Location"))
	j, err := f.q.Get(ctx, "p1")
	require.NoError(t, err)
	require.Equal(t, jobkey.StateCanceled, j.State, "applied on the master, as the page says")

	resp, body = f.post(t, c, "cancel-pending", url.Values{"csrf": {tok}, "queue": {"mails"}, "confirm": {"yes"}})
	wantStatus(t, resp, body, http.StatusServiceUnavailable)
	require.Contains(t, body, `<p class="flash" id="done">Done in part: Canceled pending jobs: 3; 3 of them on the master only.</p>`)
	require.Contains(t, body, `<p class="error" id="master-only">3 of them were applied on the master only: `+
		`0 of 1 replicas confirmed the write within 1s, so a failover now may undo it.`)

	// A pause waits for the replicas too: written on the master only.
	resp, body = f.post(t, c, "pause", url.Values{"csrf": {tok}, "queue": {"mails"}})
	wantStatus(t, resp, body, http.StatusServiceUnavailable)
	require.Contains(t, body, "Queue paused on 1 of 1 shards; 1 of them on the master only.")
	require.Contains(t, body, `id="master-only"`)

	thaw()
	resp, body = f.post(t, c, "cancel", url.Values{"csrf": {tok}, "queue": {"mails"}, "id": {"p1"}})
	wantStatus(t, resp, body, http.StatusSeeOther)
	require.Equal(t, jobkey.StateCanceled, f.onReplica(t, "p1"))
	resp, body = f.post(t, c, "retry", url.Values{"csrf": {tok}, "queue": {"mails"}, "id": {"p2"}})
	wantStatus(t, resp, body, http.StatusSeeOther)
	require.Equal(t, jobkey.StatePending, f.onReplica(t, "p2"), "the retry is on the replica when the UI answers")
}

// The UI's queues use Options.MinReplicas and ReplicaTimeout, which New
// checks as jobkey.Config does.
func TestNewRefusesABadReplicaSetting(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { rdb.Close() })
	for _, o := range []Options{{MinReplicas: -1}, {MinReplicas: 65}, {MinReplicas: 1, ReplicaTimeout: 2 * time.Minute}} {
		_, err := New(rdb, o)
		require.ErrorIs(t, err, jobkey.ErrInvalid, "%+v", o)
	}
	_, err := New(rdb, Options{MinReplicas: 2, ReplicaTimeout: 3 * time.Second})
	require.NoError(t, err)
}
