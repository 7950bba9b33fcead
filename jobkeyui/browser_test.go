package jobkeyui

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// EnvScreenshots names a directory the browser tests write their
// screenshots to, besides each test's temporary directory: docs/ui's are
// made with JOBKEY_UI_SCREENSHOTS=$PWD/docs/ui.
const EnvScreenshots = "JOBKEY_UI_SCREENSHOTS"

// chromium returns the path of a headless-capable Chromium. Without one
// the test skips, or fails in CI, where .ci/run installs Debian's.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if redistest.InCI() {
		t.Fatal("no chromium found and CI is set: install it (apt-get install chromium)")
	}
	t.Skip("no chromium found: the browser test needs one (apt-get install chromium)")
	return ""
}

// browser starts a headless Chromium for t, and returns its tab.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox, // tests often run as root, where Chromium's sandbox refuses to start
		chromedp.WindowSize(1200, 760),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil { // start the browser, with no deadline
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// dropCSP serves h without its Content-Security-Policy, so that a page
// that let markup through would run it: what stops a script there is the
// escaping alone.
func dropCSP(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(noCSP{w}, r)
	})
}

type noCSP struct{ http.ResponseWriter }

func (w noCSP) WriteHeader(code int) {
	w.Header().Del("Content-Security-Policy")
	w.ResponseWriter.WriteHeader(code)
}

func (w noCSP) Write(b []byte) (int, error) {
	w.Header().Del("Content-Security-Policy")
	return w.ResponseWriter.Write(b)
}

// probe is what a page shows of anything that ran in it.
type probe struct {
	Pwned    string `json:"pwned"`    // window.__pwned, "" when unset
	Title    string `json:"title"`    // document.title
	Scripts  int    `json:"scripts"`  // <script> elements
	Images   int    `json:"images"`   // <img> elements
	Handlers int    `json:"handlers"` // elements with an inline event handler
}

const probeJS = `({
	pwned: window.__pwned === undefined ? "" : String(window.__pwned),
	title: document.title,
	scripts: document.scripts.length,
	images: document.images.length,
	handlers: document.querySelectorAll("[onerror],[onload],[onclick],[onmouseover]").length,
})`

// dialogs records (and dismisses) every JavaScript dialog a tab opens.
type dialogs struct {
	mu   sync.Mutex
	msgs []string
}

func watchDialogs(ctx context.Context) *dialogs {
	d := &dialogs{}
	evs := chromedp.Events(ctx, cdppage.JavascriptDialogOpening)
	go func() {
		for ev, err := range evs {
			if err != nil {
				return
			}
			d.mu.Lock()
			d.msgs = append(d.msgs, ev.Message)
			d.mu.Unlock()
			_, _ = chromedp.Call(ctx, cdppage.HandleJavaScriptDialog, cdppage.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	return d
}

func (d *dialogs) seen() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.msgs...)
}

func run[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(tctx, a)
	if err != nil {
		t.Fatalf("chromedp: %v", err)
	}
	return v
}

func do(t *testing.T, ctx context.Context, a ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, a...); err != nil {
		t.Fatalf("chromedp: %v", err)
	}
}

const listedJS = `Array.from(document.querySelectorAll("table.jobs:not(.unreadable) tr[data-id]"), e => e.dataset.id)`

// TestBrowser drives the UI in headless Chromium against a real Redis:
// counts and listings as the browser renders them, a click on retry, a
// screenshot, and jobs full of markup that must not run.
func TestBrowser(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := browser(t)
	dlg := watchDialogs(ctx)
	base := f.srv.URL

	// The queues page: the counts Stats gives.
	do(t, ctx, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS(`tr[data-queue="mails"]`)))
	st, err := f.q.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int64{
		"pending": st.Pending, "active": 1, "succeeded": 2, "failed": 3, "canceled": 1, "corrupt": st.Corrupt,
	} {
		got := run(t, ctx, chromedp.Text(chromedp.CSS(`tr[data-queue="mails"] td[data-count="`+name+`"]`)))
		if strings.TrimSpace(got) != strconv.FormatInt(want, 10) {
			t.Errorf("queues page shows mails %s = %q, want %d", name, got, want)
		}
	}
	queues := run(t, ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("tr[data-queue]"), e => e.dataset.queue)`))
	if !sameSet(queues, []string{"mails", "other", hostileQueue}) {
		t.Errorf("queues page lists %q", queues)
	}

	// Follow the failed count to the listing.
	if _, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`tr[data-queue="mails"] td[data-count="failed"] a`))); err != nil {
		t.Fatal(err)
	}
	if ids := run(t, ctx, chromedp.Evaluate[[]string](listedJS)); !sameSet(ids, f.failed) {
		t.Fatalf("failed listing shows %q, want %q", ids, f.failed)
	}
	shot := run(t, ctx, chromedp.CaptureScreenshot())
	saveScreenshot(t, "screenshot.png", shot)

	// Click retry on f1: the browser lands on f1's page, which says
	// pending, and so does Redis.
	resp, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`tr[data-id="f1"] button.retry`)))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != http.StatusOK {
		t.Errorf("after the retry click: status %d", resp.Status)
	}
	loc := run(t, ctx, chromedp.Location())
	if !strings.HasPrefix(loc, base+"/job?") || !strings.Contains(loc, "id=f1") {
		t.Errorf("after the retry click the browser is at %s", loc)
	}
	if s := run(t, ctx, chromedp.Text(chromedp.CSS("#state"))); strings.TrimSpace(s) != "pending" {
		t.Errorf("job page after retry says state %q", s)
	}
	if msg := run(t, ctx, chromedp.Text(chromedp.CSS("p.flash"))); !strings.Contains(msg, "retried: it is pending") {
		t.Errorf("flash %q", msg)
	}
	if j, err := f.q.Get(context.Background(), "f1"); err != nil || j.State != jobkey.StatePending {
		t.Fatalf("f1 in Redis after the click: %v %v", j, err)
	}
	// And the pending listing has it; the failed one no longer does.
	do(t, ctx, chromedp.Navigate(base+"/queue?name=mails&state=pending"))
	if ids := run(t, ctx, chromedp.Evaluate[[]string](listedJS)); !sameSet(ids, []string{"p1", "p2", "p3", "later", "f1"}) {
		t.Errorf("pending listing after retry: %q", ids)
	}
	do(t, ctx, chromedp.Navigate(base+"/queue?name=mails&state=failed"))
	if ids := run(t, ctx, chromedp.Evaluate[[]string](listedJS)); !sameSet(ids, []string{"f2", hostileID}) {
		t.Errorf("failed listing after retry: %q", ids)
	}

	// The events page tails the stream by reloading itself: a job
	// enqueued after it opened shows up without a click. A forged entry
	// of hostile strings joins the hostile pages below.
	if err := f.q.EnableEvents(context.Background()); err != nil {
		t.Fatal(err)
	}
	do(t, ctx, chromedp.Navigate(base+"/events?queue=mails&refresh=1"), chromedp.WaitVisible(chromedp.CSS("#events-empty")))
	if _, err := f.q.Enqueue(context.Background(), "welcome", nil, &jobkey.EnqueueOpts{ID: "tail-1"}); err != nil {
		t.Fatal(err)
	}
	tctx, cancelTail := context.WithTimeout(ctx, 10*time.Second)
	do(t, tctx, chromedp.WaitVisible(chromedp.CSS(`tr[data-kind="transition"] a[href*="tail-1"]`)))
	cancelTail()
	if err := f.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: f.q.Keys("tail-1").Events,
		Values: []any{"job", hostileID, "type", hostileType, "worker", hostileError, "at", "1"}}).Err(); err != nil {
		t.Fatal(err)
	}

	// Hostile jobs: every page that shows them, served first without the
	// CSP (the escaping alone must hold), then as shipped.
	bare := httptest.NewServer(dropCSP(f.h))
	t.Cleanup(bare.Close)
	hostilePages := []string{
		"/",
		"/queue?name=mails&state=failed",
		"/job?queue=mails&id=" + url.QueryEscape(hostileID),
		"/queue?name=" + url.QueryEscape(hostileQueue) + "&state=pending",
		"/job?queue=" + url.QueryEscape(hostileQueue) + "&id=" + url.QueryEscape(hostileID),
		"/job?queue=mails&id=" + url.QueryEscape(`<script>window.__pwned="404";alert(5)</script>`),
		"/events?queue=mails&from=",
	}
	for _, srv := range []string{bare.URL, base} {
		for _, p := range hostilePages {
			do(t, ctx, chromedp.Navigate(srv+p), chromedp.WaitReady(chromedp.CSS("footer")), chromedp.Sleep(300*time.Millisecond))
			pr := run(t, ctx, chromedp.Evaluate[probe](probeJS))
			if pr.Pwned != "" || pr.Title == "pwned" || pr.Scripts != 0 || pr.Images != 0 || pr.Handlers != 0 {
				t.Errorf("%s%s: something from a job ran or became markup: %+v", srv, p, pr)
			}
		}
	}
	// The strings are shown, as text.
	do(t, ctx, chromedp.Navigate(bare.URL+"/job?queue=mails&id="+url.QueryEscape(hostileID)))
	for sel, want := range map[string]string{"#type": hostileType, "#last-error": hostileError, "h1 code.id": hostileID} {
		// LastError is the cause's text, which ends with ErrSkipRetry's.
		if got := run(t, ctx, chromedp.TextContent(chromedp.CSS(sel))); !strings.HasPrefix(strings.TrimSpace(got), want) {
			t.Errorf("%s shows %q, want the text %q", sel, got, want)
		}
	}
	if got := run(t, ctx, chromedp.TextContent(chromedp.CSS("#payload"))); !strings.Contains(got, `<img src=x onerror=\"window.__pwned='payload'`) {
		t.Errorf("payload shows %q", got)
	}
	if d := dlg.seen(); len(d) != 0 {
		t.Errorf("dialogs opened: %q", d)
	}

	// Controls: the probe does see markup that runs. Injected into the
	// page served without CSP it runs and opens a dialog; under the
	// shipped CSP the same inline handler is refused.
	const inject = `document.body.insertAdjacentHTML("beforeend", "<img src=x onerror=\"window.__pwned='control';alert('control')\">")`
	do(t, ctx, chromedp.Evaluate[chromedp.Void](inject), chromedp.Sleep(500*time.Millisecond))
	if pr := run(t, ctx, chromedp.Evaluate[probe](probeJS)); pr.Pwned != "control" {
		t.Fatalf("control: injected markup did not run (%+v): the probe proves nothing", pr)
	}
	if d := waitDialogs(dlg, 1); len(d) != 1 || d[0] != "control" {
		t.Fatalf("control: dialogs %q, want the control's alert: the dialog watch proves nothing", d)
	}
	do(t, ctx, chromedp.Navigate(base+"/job?queue=mails&id="+url.QueryEscape(hostileID)),
		chromedp.Evaluate[chromedp.Void](inject), chromedp.Sleep(500*time.Millisecond))
	if pr := run(t, ctx, chromedp.Evaluate[probe](probeJS)); pr.Pwned != "" {
		t.Errorf("under the shipped CSP an inline handler ran: %+v", pr)
	}
	if d := dlg.seen(); len(d) != 1 {
		t.Errorf("dialogs after the CSP control: %q", d)
	}
}

func waitDialogs(d *dialogs, n int) []string {
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if s := d.seen(); len(s) >= n {
			return s
		}
		time.Sleep(20 * time.Millisecond)
	}
	return d.seen()
}

// saveScreenshot keeps the screenshot with the test's files, and writes it
// under name in the directory EnvScreenshots names when it is set.
func saveScreenshot(t *testing.T, name string, png []byte) {
	t.Helper()
	if len(png) < 8 || string(png[1:4]) != "PNG" {
		t.Fatalf("screenshot is not a PNG (%d bytes)", len(png))
	}
	if err := os.WriteFile(filepath.Join(t.TempDir(), name), png, 0o644); err != nil {
		t.Fatal(err)
	}
	if dir := os.Getenv(EnvScreenshots); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot written to %s", p)
	}
}

// pointsJS sums, per series, the values the points of a chart's SVG show
// in their tooltips ("succeeded: 2 jobs at minutes from now -1"), and
// reports the drawn chart's size.
const pointsJS = `(() => {
	const svg = document.querySelector("#last-hour svg");
	const sums = {};
	for (const t of document.querySelectorAll("#last-hour svg .point title")) {
		const m = t.textContent.match(/^(\w+): (\d+) jobs/);
		if (m) sums[m[1]] = (sums[m[1]] || 0) + Number(m[2]);
	}
	const r = svg.getBoundingClientRect();
	return {sums: sums, width: r.width, height: r.height};
})()`

// The history page's charts render in a browser, and the numbers their
// points show are Queue.Throughput's.
func TestBrowserHistoryChartsShowThroughput(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := browser(t)
	dlg := watchDialogs(ctx)
	do(t, ctx, chromedp.Navigate(f.srv.URL+"/queue?name=mails"), chromedp.WaitVisible(chromedp.CSS(`#history-link`)))
	if _, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(`#history-link`))); err != nil {
		t.Fatal(err)
	}
	do(t, ctx, chromedp.WaitVisible(chromedp.CSS(`#last-hour svg`)))
	type drawn struct {
		Sums          map[string]int64 `json:"sums"`
		Width, Height float64
	}
	got := run(t, ctx, chromedp.Evaluate[drawn](pointsJS))
	now := time.Now()
	th, err := f.q.Throughput(context.Background(), now.Add(-time.Hour), now, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{}
	for _, b := range th.Buckets {
		want["succeeded"] += b.Succeeded
		want["failed"] += b.Failed
		want["canceled"] += b.Canceled
	}
	if want["succeeded"] != 2 || want["failed"] != 3 || want["canceled"] != 1 {
		t.Fatalf("Throughput counts %v, want the fixture's 2, 3 and 1", want)
	}
	for k, v := range want {
		if got.Sums[k] != v {
			t.Errorf("the chart's %s points add up to %d, Throughput's to %d", k, got.Sums[k], v)
		}
	}
	if got.Width < 300 || got.Height < 150 {
		t.Errorf("the chart is drawn %vx%v", got.Width, got.Height)
	}
	saveScreenshot(t, "history.png", run(t, ctx, chromedp.CaptureScreenshot()))
	p := run(t, ctx, chromedp.Evaluate[probe](probeJS))
	if p.Pwned != "" || p.Scripts != 0 || p.Handlers != 0 {
		t.Errorf("the history page runs something: %+v", p)
	}
	if msgs := dlg.seen(); len(msgs) > 0 {
		t.Errorf("dialogs opened: %q", msgs)
	}
}

// A job's page in a browser shows its attempt history, oldest first, and a
// running job's progress, with hostile text inert.
func TestBrowserJobPageShowsHistoryAndProgress(t *testing.T) {
	f := newFixture(t, Options{})
	bg := context.Background()
	q, err := jobkey.NewQueue(f.rdb, "hist", &jobkey.Config{Prefix: f.prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(bg, "import", nil, &jobkey.EnqueueOpts{ID: "h1"}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"worker-a", "worker-b"} {
		j, err := q.Claim(bg, w)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := q.Fail(bg, j, jobkey.RetryAfter(0, errors.New(`<img src=x onerror="window.__pwned='hist'">`))); err != nil {
			t.Fatal(err)
		}
	}
	j, err := q.Claim(bg, "worker-c")
	if err != nil {
		t.Fatal(err)
	}
	j.Progress = []byte(`{"rows":40,"of":100}`)
	if _, err := q.Extend(bg, j); err != nil {
		t.Fatal(err)
	}
	ctx := browser(t)
	dlg := watchDialogs(ctx)
	do(t, ctx, chromedp.Navigate(f.srv.URL+"/job?queue=hist&id=h1"), chromedp.WaitVisible(chromedp.CSS(`#history`)))
	workers := run(t, ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("#history tbody tr"), tr => tr.textContent)`))
	if len(workers) != 2 || !strings.Contains(workers[0], "worker-a") || !strings.Contains(workers[1], "worker-b") {
		t.Errorf("history rows %q, want worker-a's run then worker-b's", workers)
	}
	if got := run(t, ctx, chromedp.Text(chromedp.CSS(`#progress`))); strings.Join(strings.Fields(got), "") != `{"rows":40,"of":100}` {
		t.Errorf("progress shows %q", got)
	}
	p := run(t, ctx, chromedp.Evaluate[probe](probeJS))
	if p.Pwned != "" || p.Images != 0 || p.Handlers != 0 || len(dlg.seen()) > 0 {
		t.Errorf("the history's error ran: %+v, dialogs %q", p, dlg.seen())
	}
	saveScreenshot(t, "job.png", run(t, ctx, chromedp.CaptureScreenshot()))
}
