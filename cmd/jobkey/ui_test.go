package main

import (
	"bytes"
	"context"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

func TestUIRefusesWithoutRedis(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"ui"}, &out, &errOut)
	require.ErrorContains(t, err, "-redis (or REDIS_URL) is required")
	err = run(context.Background(), []string{"ui", "-redis", "redis://127.0.0.1:1", "extra"}, &out, &errOut)
	require.ErrorContains(t, err, "unexpected arguments")
}

func TestUIRefusesABadPrefix(t *testing.T) {
	url := redistest.RequireReal(t).URL
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"ui", "-redis", url, "-prefix", "a{b}", "-addr", "127.0.0.1:0"}, &out, &errOut)
	require.ErrorIs(t, err, jobkey.ErrInvalid)
	require.Empty(t, out.String(), "nothing was served")
}

// startUI runs "jobkey ui" on a free loopback port until the returned stop
// is called, and returns its base URL.
func startUI(t *testing.T, args ...string) (base string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"ui", "-addr", "127.0.0.1:0"}, args...), &out, &errOut)
	}()
	addr := regexp.MustCompile(`http://127\.0\.0\.1:\d+/`)
	deadline := time.Now().Add(10 * time.Second)
	for base = ""; base == ""; base = addr.FindString(out.String()) {
		select {
		case err := <-done:
			cancel()
			t.Fatalf("jobkey ui exited early: %v\n%s%s", err, out.String(), errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("jobkey ui printed no address:\n%s%s", out.String(), errOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("jobkey ui did not stop within 10 s of its context ending")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return base, stop
}

func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

func TestUIServesAndStops(t *testing.T) {
	url := redistest.RequireReal(t).URL
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	prefix := redistest.Prefix(t)
	q, err := jobkey.NewQueue(rdb, "mails", &jobkey.Config{Prefix: prefix})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "welcome", []byte(`{"to":"ada"}`), &jobkey.EnqueueOpts{ID: "j1"})
	require.NoError(t, err)

	base, stop := startUI(t, "-redis", url, "-prefix", prefix)
	resp, body := get(t, base)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, `data-queue="mails"`)
	require.Contains(t, resp.Header.Get("Set-Cookie"), "SameSite=Strict")
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "script-src 'none'")
	_, body = get(t, base+"queue?name=mails&state=pending")
	require.Contains(t, body, "j1")
	require.Contains(t, body, `action/cancel`, "actions are shown without -readonly")
	resp, body = get(t, base+"metrics")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, `jobkey_queue_jobs{jobkey_queue="mails",jobkey_state="pending"`)
	require.Regexp(t, `jobkey_queue_jobs\{jobkey_queue="mails",jobkey_state="pending"[^}]*\} 1\n`, body)

	// Interrupt: the server shuts down, the command returns nil, and the
	// port no longer answers.
	require.NoError(t, stop())
	_, err = http.Get(base)
	require.Error(t, err)
}

func TestUIReadOnly(t *testing.T) {
	url := redistest.RequireReal(t).URL
	ctx := context.Background()
	rdb := redistest.Client(t, nil)
	prefix := redistest.Prefix(t)
	q, err := jobkey.NewQueue(rdb, "mails", &jobkey.Config{Prefix: prefix})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "welcome", nil, &jobkey.EnqueueOpts{ID: "j1"})
	require.NoError(t, err)

	base, _ := startUI(t, "-redis", url, "-prefix", prefix, "-readonly")
	_, body := get(t, base+"queue?name=mails&state=pending")
	require.Contains(t, body, "j1")
	require.Contains(t, body, "read-only")
	require.NotContains(t, body, `method="post"`)
	resp, err := http.Post(base+"action/cancel", "application/x-www-form-urlencoded", strings.NewReader("queue=mails&id=j1"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	j, err := q.Get(ctx, "j1")
	require.NoError(t, err)
	require.Equal(t, jobkey.StatePending, j.State)
}

// jobkey ui -min-replicas: a cancel the replicas did not confirm answers
// with a page that says it was applied on the master only; with the
// replica up, the cancel succeeds and the replica holds it.
func TestUIActionsWaitForTheReplicas(t *testing.T) {
	f := newReplicatedFixture(t)
	ids := []string{f.enqueue("t", nil).ID, f.enqueue("t", nil).ID}
	// A second is a timeout a thawed replica keeps on a loaded machine.
	base, _ := startUI(t, "-redis", f.url, "-prefix", f.prefix, "-min-replicas", "1", "-replica-timeout", "1s")
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	page, err := c.Get(base + "queue?name=mail&state=pending")
	require.NoError(t, err)
	b, err := io.ReadAll(page.Body)
	page.Body.Close()
	require.NoError(t, err)
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(string(b))
	require.NotNil(t, m, "a CSRF token on the page")
	cancel := func(id string) (*http.Response, string) {
		t.Helper()
		resp, err := c.PostForm(base+"action/cancel", url.Values{"csrf": {html.UnescapeString(m[1])}, "queue": {"mail"}, "id": {id}})
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(b)
	}

	thaw := f.freeze()
	resp, body := cancel(ids[0])
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, body)
	require.Contains(t, body, "Job "+ids[0]+" canceled on the master only: 0 of 1 replicas confirmed the write within 1s")
	thaw()
	// The thawed replica catches up with the write it missed first.
	require.Eventually(t, func() bool {
		j := f.onReplica(ids[0])
		return j != nil && j.State == jobkey.StateCanceled
	}, 30*time.Second, 10*time.Millisecond)
	resp, body = cancel(ids[1])
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
	require.Equal(t, jobkey.StateCanceled, f.onReplica(ids[1]).State)
}
