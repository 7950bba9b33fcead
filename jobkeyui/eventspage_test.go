package jobkeyui

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// The events page opens at the end of the streams, reloading itself, and
// shows every transition since, newest first; hostile strings in forged
// entries stay text.
func TestEventsPageTailsTransitionsSinceItOpened(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Options{})
	ctx := context.Background()
	require.NoError(t, f.q.EnableEvents(ctx))
	// Not due: the claim below must not take it, or its claim (after the
	// page opened) would name its type.
	if _, err := f.q.Enqueue(ctx, "before", nil, &jobkey.EnqueueOpts{Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	c := f.client(t)
	resp, _ := f.fetch(t, c, "/events?queue=mails")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	live := resp.Header.Get("Location")
	require.Contains(t, live, "from=e1")
	require.Contains(t, live, "refresh=2")

	resp, body := f.fetch(t, c, live)
	wantStatus(t, resp, body, http.StatusOK)
	require.Contains(t, body, `<meta http-equiv="refresh" content="2">`)
	require.Contains(t, body, `id="events-empty"`)

	j, err := f.q.Enqueue(ctx, "welcome", nil, &jobkey.EnqueueOpts{ID: "tail-1"})
	require.NoError(t, err)
	_, err = f.q.Claim(ctx, "worker-9") // p1..p3 are due first
	require.NoError(t, err)
	require.NoError(t, f.rdb.XAdd(ctx, &redis.XAddArgs{Stream: f.q.Keys(j.ID).Events, Values: []any{"job", hostileID, "at", "1"}}).Err())

	resp, body = f.fetch(t, c, live)
	wantStatus(t, resp, body, http.StatusOK)
	require.NotContains(t, body, "before", "written before the page opened")
	require.Contains(t, body, "tail-1")
	require.Contains(t, body, "none → pending")
	require.Contains(t, body, "pending → active")
	require.Contains(t, body, "worker-9")
	require.Contains(t, body, `data-kind="malformed"`)
	require.NotContains(t, body, hostileID, "a forged entry's text is escaped")
	require.Less(t, strings.Index(body, `data-kind="malformed"`), strings.Index(body, "tail-1"), "newest first")

	resp, body = f.fetch(t, c, "/events?queue=mails&from=junk")
	wantStatus(t, resp, body, http.StatusBadRequest)
	resp, body = f.fetch(t, c, "/queue?name=mails")
	wantStatus(t, resp, body, http.StatusOK)
	require.Contains(t, body, `id="events-link"`)
}
