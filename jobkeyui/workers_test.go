package jobkeyui

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/require"
)

// workerEnv makes the test binary run a Work instead of the tests: the
// browser test kills that process with SIGKILL, as a crash would. Its
// value is "<redis URL> <prefix> <queue> <worker name> [<schedule>]": with
// a schedule, the Work keeps an hourly one of that name and type, which
// enqueues its latest tick's job at once (and runs it, in a slot of its
// own).
const workerEnv = "JOBKEYUI_TEST_WORKER"

// workerLease is the Lease of the queue the child works: its report lapses
// this long after the child dies.
const workerLease = 2 * time.Second

func init() {
	v := os.Getenv(workerEnv)
	if v == "" {
		return
	}
	f := strings.Fields(v)
	o, err := redis.ParseURL(f[0])
	if err != nil {
		panic(err)
	}
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	rdb := redis.NewClient(o)
	q, err := jobkey.NewQueue(rdb, f[2], &jobkey.Config{Prefix: f[1], Lease: workerLease})
	if err != nil {
		panic(err)
	}
	opts := &jobkey.WorkOpts{Name: f[3], Concurrency: 2, PollInterval: 50 * time.Millisecond}
	if len(f) > 4 {
		opts.Periodic = []jobkey.PeriodicJob{{Name: f[4], Schedule: jobkey.Every(time.Hour), Type: f[4], StartWithLatestTick: true}}
	}
	err = q.Work(context.Background(), jobkey.HandlerFunc(func(ctx context.Context, j *jobkey.Job) ([]byte, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}), opts)
	panic(err)
}

// startWorkerProcess runs a Work named name on queue in a child process,
// keeping the schedule named schedule unless it is "", and returns it to
// be killed.
func startWorkerProcess(t *testing.T, f *fixture, queue, name, schedule string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerEnv+"="+strings.TrimSpace(redistest.RequireReal(t).URL+" "+f.prefix+" "+queue+" "+name+" "+schedule))
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// The workers page lists a running Work with the job it runs, linked; the
// job's page links back to the worker's row.
func TestWorkersPageListsRunningWorksAndLinksTheirJobs(t *testing.T) {
	f := newFixture(t, Options{})
	q, err := jobkey.NewQueue(f.rdb, "work", &jobkey.Config{Prefix: f.prefix, Lease: workerLease})
	require.NoError(t, err)
	ctx := context.Background()
	j, err := q.Enqueue(ctx, "mail", nil, nil)
	require.NoError(t, err)
	startWorkerProcess(t, f, "work", "box<b>|1", "")
	c := f.client(t)
	var body string
	require.Eventually(t, func() bool {
		var resp *http.Response
		resp, body = f.fetch(t, c, "/workers?name=work")
		wantStatus(t, resp, body, http.StatusOK)
		return strings.Contains(body, `data-run="`+j.ID+`"`)
	}, 20*time.Second, 50*time.Millisecond, "the child's report lists its run")
	require.Contains(t, body, `<tr id="worker-box_3cb_3e_7c1" data-worker="box&lt;b&gt;|1">`)
	require.Contains(t, body, `data-busy="1">1 of 2</td>`)
	require.NotContains(t, body, "<b>|1")

	_, jbody := f.fetch(t, c, "/job?queue=work&id="+url.QueryEscape(j.ID))
	require.Contains(t, jbody, `<a href="/workers?name=work#worker-box_3cb_3e_7c1" id="worker-link">box&lt;b&gt;|1/`)
}

// A killed worker disappears from the page within its report's TTL, in a
// real browser; the page shows it until then.
func TestBrowserWorkersPageDropsAKilledWorkerWithinItsLease(t *testing.T) {
	f := newFixture(t, Options{})
	q, err := jobkey.NewQueue(f.rdb, "work", &jobkey.Config{Prefix: f.prefix, Lease: workerLease})
	require.NoError(t, err)
	_, err = q.Enqueue(context.Background(), "mail", nil, nil)
	require.NoError(t, err)
	cmd := startWorkerProcess(t, f, "work", "doomed-1", "digest")
	ctx := browser(t)
	listed := func() bool {
		do(t, ctx, chromedp.Navigate(f.srv.URL+"/workers?name=work"), chromedp.WaitReady("body"))
		return run(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll('tr[data-worker="doomed-1"]').length`)) == 1
	}
	require.Eventually(t, listed, 20*time.Second, 100*time.Millisecond, "the worker is listed while it runs")
	// The schedule it keeps, with its latest tick's job (StartWithLatestTick
	// enqueued it, and the child runs it: its handler waits, so active).
	require.Eventually(t, func() bool {
		do(t, ctx, chromedp.Navigate(f.srv.URL+"/workers?name=work"), chromedp.WaitReady("body"))
		return run(t, ctx, chromedp.Evaluate[string](`(() => { const s = document.querySelector('tr[data-schedule="digest"] .state'); return s ? s.dataset.state : ""; })()`)) != ""
	}, 20*time.Second, 100*time.Millisecond, "the schedule's last tick's job is shown")
	cells := run(t, ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('tr[data-schedule="digest"] td'), td => td.textContent.trim())`))
	require.Len(t, cells, 7)
	require.Equal(t, []string{"digest", "every 1h0m0s", "digest"}, cells[:3])
	require.Contains(t, cells[5], "periodic:digest:")
	require.Equal(t, "doomed-1", cells[6])
	saveScreenshot(t, "workers.png", run(t, ctx, chromedp.CaptureScreenshot()))
	require.NoError(t, cmd.Process.Kill())
	killed := time.Now()
	_ = cmd.Wait()
	for listed() {
		require.Less(t, time.Since(killed), workerLease+2*time.Second, "still listed past its Lease")
		time.Sleep(100 * time.Millisecond)
	}
	require.Equal(t, 1, run(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll('#no-workers').length`)))
	t.Logf("gone %v after the kill (Lease %v)", time.Since(killed).Round(10*time.Millisecond), workerLease)
}

// The keys page shows each concurrency key's limit, use and rate, as
// Queue.Concurrency reads them; a hostile key name stays text.
func TestKeysPageShowsEachKeysLimitUseAndRate(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	require.NoError(t, f.q.SetConcurrencyLimit(ctx, "tenant-a", 3))
	require.NoError(t, f.q.SetRateLimit(ctx, `<i>x</i>`, 7, time.Minute))
	c := f.client(t)
	resp, body := f.fetch(t, c, "/keys?name=mails")
	wantStatus(t, resp, body, http.StatusOK)
	require.Contains(t, body, `<tr data-key="tenant-a">`)
	require.Contains(t, body, `<td data-limit>3</td><td data-active>0</td><td data-waiting>0</td>`)
	require.Contains(t, body, `<td>7 per 1m0s</td><td>0</td>`)
	require.Contains(t, body, `&lt;i&gt;x&lt;/i&gt;`)
	require.NotContains(t, body, `<i>x</i>`)
	_, qbody := f.fetch(t, c, "/queue?name=mails")
	require.Contains(t, qbody, `<a href="/keys?name=mails" id="keys-link">`)
}

// On a cluster with a master down, the keys page lists the live masters'
// keys and names the shards it left out: it does not fail whole.
func TestKeysPageOfTheLiveMastersWhenOneIsDead(t *testing.T) {
	cl := redistest.StartCluster(t, 3, "--cluster-require-full-coverage", "no")
	rdb := cl.Client(t, func(o *redis.ClusterOptions) { o.DialTimeout, o.MaxRetries = 300*time.Millisecond, 1 })
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	q, err := jobkey.NewQueue(rdb, "q", &jobkey.Config{Prefix: prefix})
	require.NoError(t, err)
	node := func(key string) string {
		m, err := rdb.MasterForKey(ctx, key)
		require.NoError(t, err)
		return m.Options().Addr
	}
	for i := range 40 {
		require.NoError(t, q.SetConcurrencyLimit(ctx, "tenant-"+strconv.Itoa(i), 2))
	}
	// The dead master is one that holds keys but not the queue's meta key.
	meta := node(prefix + ":{q}:meta")
	var dead *redistest.Server
	var live []string
	for _, n := range cl.Nodes {
		if n.Addr != meta {
			dead = n
			break
		}
	}
	for i := range 40 {
		k := "tenant-" + strconv.Itoa(i)
		if node(q.Keys(mustIDFor(t, q, k)).Job) != dead.Addr {
			live = append(live, k)
		}
	}
	require.Less(t, len(live), 40, "the dead master holds some keys")
	dead.Stop()

	h, err := New(rdb, Options{Prefix: prefix, Logger: discardLogger()})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/keys?name=q")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	body := string(b)
	wantStatus(t, resp, body, http.StatusOK)
	require.Contains(t, body, `id="keys-missing"`)
	for _, k := range live {
		require.Contains(t, body, `<tr data-key="`+k+`">`)
	}
}

// mustIDFor is an ID in the shard of concurrency key k.
func mustIDFor(t *testing.T, q *jobkey.Queue, k string) string {
	t.Helper()
	id, err := q.IDFor(k, "x")
	require.NoError(t, err)
	return id
}

// A forged report whose busy count is below the runs it lists shows no
// negative "more": the runs it lists, and nothing else.
func TestWorkersPageShowsNoNegativeCountOfAForgedReport(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	report := `{"v":1,"name":"forged","busy":-5,"slots":1,"running":[{"id":"r1","type":"t","runner":"forged/0"},{"id":"r2","type":"t","runner":"forged/1"}]}`
	require.NoError(t, f.rdb.Set(ctx, f.prefix+":{mails}:worker:forged", report, time.Minute).Err())
	require.NoError(t, f.rdb.ZAdd(ctx, f.prefix+":{mails}:workers", redis.Z{Score: float64(time.Now().Add(time.Minute).UnixMilli()), Member: "forged"}).Err())
	resp, body := f.fetch(t, f.client(t), "/workers?name=mails")
	wantStatus(t, resp, body, http.StatusOK)
	require.Contains(t, body, `data-run="r2"`)
	require.NotContains(t, body, "-7 more")
	require.NotRegexp(t, `and -?\d+ more`, body)
}
