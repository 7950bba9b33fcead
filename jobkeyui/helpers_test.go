package jobkeyui

import (
	"context"
	"errors"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// Hostile strings: a page that let one of them through as markup would
// run it. Each sets window.__pwned (and the title) and opens a dialog.
const (
	hostileType    = `<script>window.__pwned="type";document.title="pwned";alert(1)</script>`
	hostilePayload = `{"html":"<img src=x onerror=\"window.__pwned='payload';document.title='pwned';alert(2)\">","s":"<script>window.__pwned='payload2';alert(3)</script>"}`
	hostileError   = `boom <img src=x onerror="window.__pwned='error';document.title='pwned';alert(4)"><script>window.__pwned='error2'</script>`
	hostileID      = `<img src=x onerror=window.__pwned='id'>`
	hostileQueue   = `<b>evil"q'`
)

// fixture is a queue with jobs in every state, and a UI over it.
type fixture struct {
	rdb    *redis.Client
	prefix string
	q      *jobkey.Queue // "mails"
	h      *Handler
	srv    *httptest.Server
	// ids by what the fixture made of them
	failed, succeeded, canceled, active, pending, scheduled []string
	corrupt, setAside                                       string
}

// newFixture fills a queue under a prefix of its own:
// 2 succeeded, 3 failed (one hostile), 1 canceled, 1 active,
// 3 pending due now and 1 scheduled in an hour, and one corrupt value
// listed in the ready index, and one in the corrupt index. Queue "other" holds one pending job, and a
// queue with a hostile name one hostile pending job.
func newFixture(t *testing.T, o Options) *fixture {
	t.Helper()
	redistest.RequireReal(t)
	ctx := context.Background()
	f := &fixture{rdb: redistest.Client(t, nil), prefix: redistest.Prefix(t)}
	var err error
	f.q, err = jobkey.NewQueue(f.rdb, "mails", &jobkey.Config{Prefix: f.prefix})
	if err != nil {
		t.Fatal(err)
	}
	// Jobs are claimed one at a time, each while it is the only due job,
	// so every claim takes the job just enqueued.
	run := func(typ, id string, payload []byte, outcome func(j *jobkey.Job) (*jobkey.Job, error)) {
		t.Helper()
		if _, err := f.q.Enqueue(ctx, typ, payload, &jobkey.EnqueueOpts{ID: id}); err != nil {
			t.Fatal(err)
		}
		j, err := f.q.Claim(ctx, "worker-1")
		if err != nil {
			t.Fatal(err)
		}
		if j.ID != id {
			t.Fatalf("claimed %q, want %q", j.ID, id)
		}
		if _, err := outcome(j); err != nil {
			t.Fatal(err)
		}
	}
	complete := func(j *jobkey.Job) (*jobkey.Job, error) { return f.q.Complete(ctx, j, []byte("sent")) }
	fail := func(msg string) func(j *jobkey.Job) (*jobkey.Job, error) {
		return func(j *jobkey.Job) (*jobkey.Job, error) {
			return f.q.Fail(ctx, j, errors.Join(errors.New(msg), jobkey.ErrSkipRetry))
		}
	}
	run("welcome", "s1", []byte(`{"to":"ada@example.com"}`), complete)
	run("welcome", "s2", []byte(`{"to":"bob@example.com"}`), complete)
	run("welcome", "f1", []byte(`{"to":"eve@example.com"}`), fail("smtp: 550 mailbox unavailable"))
	run("digest", "f2", []byte{0x00, 0xff, 0x10, 0x80}, fail("template missing"))
	run(hostileType, hostileID, []byte(hostilePayload), fail(hostileError))
	f.succeeded = []string{"s1", "s2"}
	f.failed = []string{"f1", "f2", hostileID}
	run("welcome", "c1", []byte("plain text payload"), func(j *jobkey.Job) (*jobkey.Job, error) { return f.q.Cancel(ctx, j.ID) })
	f.canceled = []string{"c1"}
	run("welcome", "a1", nil, func(j *jobkey.Job) (*jobkey.Job, error) { return j, nil })
	f.active = []string{"a1"}
	for _, id := range []string{"p1", "p2", "p3"} {
		if _, err := f.q.Enqueue(ctx, "welcome", []byte(`{"n":1}`), &jobkey.EnqueueOpts{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	f.pending = []string{"p1", "p2", "p3"}
	if _, err := f.q.Enqueue(ctx, "digest", nil, &jobkey.EnqueueOpts{ID: "later", Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	f.scheduled = []string{"later"}
	// A value no decoder can read, listed as pending in the ready index.
	f.corrupt = "broken"
	k := f.q.Keys(f.corrupt)
	if err := f.rdb.Set(ctx, k.Job, "\xc1 not a job value", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := f.rdb.ZAdd(ctx, k.Ready, redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: f.corrupt}).Err(); err != nil {
		t.Fatal(err)
	}
	// And one that a claimer has set aside already.
	f.setAside = "set-aside"
	k = f.q.Keys(f.setAside)
	if err := f.rdb.Set(ctx, k.Job, "\x00\x01\x02", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := f.rdb.ZAdd(ctx, k.Corrupt, redis.Z{Score: float64(time.Now().UnixMilli()), Member: f.setAside}).Err(); err != nil {
		t.Fatal(err)
	}

	other, err := jobkey.NewQueue(f.rdb, "other", &jobkey.Config{Prefix: f.prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Enqueue(ctx, "x", nil, nil); err != nil {
		t.Fatal(err)
	}
	evil, err := jobkey.NewQueue(f.rdb, hostileQueue, &jobkey.Config{Prefix: f.prefix})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := evil.Enqueue(ctx, hostileType, []byte(hostilePayload), &jobkey.EnqueueOpts{ID: hostileID}); err != nil {
		t.Fatal(err)
	}

	if o.Prefix == "" {
		o.Prefix = f.prefix
	}
	f.h, err = New(f.rdb, o)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(f.h)
	t.Cleanup(f.srv.Close)
	return f
}

// client is a browser-like client: it keeps cookies, and does not follow
// redirects so that tests see the 303.
func (f *fixture) client(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func wantStatus(t *testing.T, resp *http.Response, body string, code int) {
	t.Helper()
	if resp.StatusCode != code {
		t.Fatalf("%s %s: status %d, want %d\n%s", resp.Request.Method, resp.Request.URL, resp.StatusCode, code, body)
	}
}

// rowCounts reads the counts of a queue's row on the queues page.
func rowCounts(t *testing.T, body, queue string) map[string]int64 {
	t.Helper()
	row := regexp.MustCompile(`(?s)<tr data-queue="` + regexp.QuoteMeta(html.EscapeString(queue)) + `">(.*?)</tr>`).FindStringSubmatch(body)
	if row == nil {
		t.Fatalf("no row for queue %q:\n%s", queue, body)
	}
	out := map[string]int64{}
	for _, m := range regexp.MustCompile(`data-count="(\w+)"[^>]*>(?:<a [^>]*>)?(\d+)`).FindAllStringSubmatch(row[1], -1) {
		n, _ := strconv.ParseInt(m[2], 10, 64)
		out[m[1]] = n
	}
	return out
}

// listedIDs reads the IDs of a listing's job rows.
func listedIDs(body string) []string {
	var ids []string
	tbl := body
	if i := strings.Index(body, `<table class="jobs">`); i >= 0 {
		tbl = body[i:]
	} else {
		return nil
	}
	for _, m := range regexp.MustCompile(`<tr data-id="([^"]*)">`).FindAllStringSubmatch(tbl, -1) {
		ids = append(ids, html.UnescapeString(m[1]))
	}
	return ids
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func formQueues(body string) []string {
	var out []string
	for _, m := range queueFieldRE.FindAllStringSubmatch(body, -1) {
		out = append(out, html.UnescapeString(m[1]))
	}
	return out
}

// replicatedFixture is the queue "mails", with pending jobs p1 to p4 of
// type "welcome", on the master of a master and one replica of its own,
// and a UI over it opened with o.
type replicatedFixture struct {
	*fixture
	set     *redistest.Replicated
	replica *redis.Client
}

func newReplicatedFixture(t *testing.T, o Options) *replicatedFixture {
	t.Helper()
	set := redistest.StartReplicated(t, 1)
	f := &fixture{rdb: redistest.ClientFor(t, set.Master.URL(), nil), prefix: redistest.Prefix(t)}
	var err error
	if f.q, err = jobkey.NewQueue(f.rdb, "mails", &jobkey.Config{Prefix: f.prefix}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"p1", "p2", "p3", "p4"} {
		if _, err := f.q.Enqueue(context.Background(), "welcome", nil, &jobkey.EnqueueOpts{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	o.Prefix = f.prefix
	if f.h, err = New(f.rdb, o); err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(f.h)
	t.Cleanup(f.srv.Close)
	return &replicatedFixture{fixture: f, set: set, replica: redistest.ClientFor(t, set.Replicas[0].URL(), nil)}
}

// freeze stops the replica's process until thaw, or the test's end.
func (f *replicatedFixture) freeze(t *testing.T) (thaw func()) {
	t.Helper()
	s := f.set.Replicas[0]
	if err := s.Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Thaw() })
	return func() {
		if err := s.Thaw(); err != nil {
			t.Fatal(err)
		}
		if err := f.set.WaitSynced(10 * time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

// onReplica is the state of job id as the replica holds it.
func (f *replicatedFixture) onReplica(t *testing.T, id string) jobkey.State {
	t.Helper()
	b, err := f.replica.Get(context.Background(), f.q.Keys(id).Job).Bytes()
	if err != nil {
		t.Fatalf("job %s on the replica: %v", id, err)
	}
	var j jobkey.Job
	if err := jobkey.Unmarshal(b, &j); err != nil {
		t.Fatal(err)
	}
	return j.State
}
