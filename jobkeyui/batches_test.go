package jobkeyui

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/jobkey/jobkey"
)

// The batches page lists a queue's batches with their progress, and links
// a written callback to its job page; the queue page links to it.
func TestBatchesPageShowsProgress(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	jobs := []jobkey.JobSpec{{Type: "resize"}, {Type: "resize"}}
	_, ids, err := f.q.EnqueueBatch(ctx, jobs, jobkey.JobSpec{Type: "album"}, &jobkey.BatchOpts{ID: "album-<7>"})
	if err != nil {
		t.Fatal(err)
	}
	c := f.client(t)
	_, jbody := f.fetch(t, c, "/job?queue=mails&id="+ids[0])
	if want := `<dd id="batch"><a href="/batches?queue=mails">album-&lt;7&gt;</a></dd>`; !strings.Contains(jbody, want) {
		t.Errorf("a batch job's page lacks %q", want)
	}
	resp, body := f.fetch(t, c, "/batches?queue=mails")
	wantStatus(t, resp, body, http.StatusOK)
	for _, want := range []string{
		`<tr data-batch="album-&lt;7&gt;">`,
		`<progress max="2" value="0">0/2</progress>`,
		`<td data-count="pending">2</td>`,
		`<td data-fired="waiting">waiting</td>`,
		`<code>album</code>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("batches page lacks %q:\n%s", want, body)
		}
	}
	// Both jobs end: the callback is written, and linked.
	for range 2 {
		var j *jobkey.Job
		for {
			var err error
			if j, err = f.q.Claim(ctx, "w"); err != nil {
				t.Fatal(err)
			}
			if j.Batch != "" {
				break
			}
			if _, err := f.q.Complete(ctx, j, nil); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := f.q.Complete(ctx, j, nil); err != nil {
			t.Fatal(err)
		}
	}
	resp, body = f.fetch(t, c, "/batches?queue=mails")
	wantStatus(t, resp, body, http.StatusOK)
	for _, want := range []string{
		`<progress max="2" value="2">2/2</progress>`,
		`<td data-count="succeeded">2</td>`,
		`href="/job?id=album-%3C7%3E&amp;queue=mails">enqueued</a>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("batches page lacks %q:\n%s", want, body)
		}
	}
	resp, body = f.fetch(t, c, "/queue?name=mails")
	wantStatus(t, resp, body, http.StatusOK)
	if !strings.Contains(body, `id="batches-link" href="/batches?queue=mails"`) {
		t.Error("the queue page does not link to its batches")
	}
}

// In Chromium, the batches page renders each batch's progress bar with
// its counts, and a batch ID or callback type full of markup runs nothing,
// even with the CSP off.
func TestBrowserBatchesPage(t *testing.T) {
	f := newFixture(t, Options{})
	bg := context.Background()
	jobs := []jobkey.JobSpec{{Type: "resize"}, {Type: "resize"}, {Type: "resize"}}
	if _, _, err := f.q.EnqueueBatch(bg, jobs, jobkey.JobSpec{Type: hostileType}, &jobkey.BatchOpts{ID: hostileID + "-batch"}); err != nil {
		t.Fatal(err)
	}
	for {
		j, err := f.q.Claim(bg, "w")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.q.Complete(bg, j, nil); err != nil {
			t.Fatal(err)
		}
		if j.Batch != "" {
			break
		}
	}
	ctx := browser(t)
	dlg := watchDialogs(ctx)
	bare := httptest.NewServer(dropCSP(f.h))
	defer bare.Close()
	do(t, ctx, chromedp.Navigate(bare.URL+"/batches?queue=mails"), chromedp.WaitVisible(chromedp.CSS(`#batches progress`)))
	got := run(t, ctx, chromedp.Evaluate[[]float64](`(() => { const p = document.querySelector("#batches progress"); return [p.value, p.max]; })()`))
	if len(got) != 2 || got[0] != 1 || got[1] != 3 {
		t.Errorf("progress bar shows %v, want [1 3]", got)
	}
	if s := run(t, ctx, chromedp.Text(chromedp.CSS(`#batches td[data-count="pending"]`))); strings.TrimSpace(s) != "2" {
		t.Errorf("pending shows %q, want 2", s)
	}
	saveScreenshot(t, "batches.png", run(t, ctx, chromedp.CaptureScreenshot()))
	pr := run(t, ctx, chromedp.Evaluate[probe](probeJS))
	if pr.Pwned != "" || pr.Scripts != 0 || pr.Images != 0 || pr.Handlers != 0 || len(dlg.seen()) > 0 {
		t.Errorf("markup in a batch ran: %+v, dialogs %q", pr, dlg.seen())
	}
}
