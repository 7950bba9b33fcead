package jobkeyui

import (
	"context"
	"html/template"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/stretchr/testify/require"
)

// historyRows reads the numbers table of the chart with id from a history
// page: one [succeeded, failed, canceled, scheduled] per row.
func historyRows(t *testing.T, body, id string) [][4]int64 {
	t.Helper()
	i := strings.Index(body, `<figure class="chart" id="`+id+`">`)
	require.GreaterOrEqual(t, i, 0, "chart %s on the page", id)
	fig := body[i:]
	fig = fig[:strings.Index(fig, "</figure>")]
	require.Contains(t, fig, "<svg", "chart %s is drawn", id)
	var rows [][4]int64
	re := regexp.MustCompile(`<tr><td>[0-9-]+ [0-9:]+</td><td>(\d+)</td><td>(\d+)</td><td>(\d+)</td><td>(\d+)</td></tr>`)
	for _, m := range re.FindAllStringSubmatch(fig, -1) {
		var r [4]int64
		for k := range r {
			r[k], _ = strconv.ParseInt(m[k+1], 10, 64)
		}
		rows = append(rows, r)
	}
	return rows
}

func sumRows(rows [][4]int64) (s [4]int64) {
	for _, r := range rows {
		for k := range r {
			s[k] += r[k]
		}
	}
	return s
}

// The history page charts what Queue.Throughput counts: the fixture's
// 2 succeeded, 3 failed and 1 canceled in the last hour, and over the
// retention; its scheduled job in the next day.
func TestHistoryPageChartsTheQueuesThroughput(t *testing.T) {
	f := newFixture(t, Options{})
	c := f.client(t)
	resp, body := f.fetch(t, c, "/history?name=mails")
	wantStatus(t, resp, body, http.StatusOK)

	now := time.Now()
	th, err := f.q.Throughput(context.Background(), now.Add(-time.Hour), now, time.Minute)
	require.NoError(t, err)
	var want [4]int64
	for _, b := range th.Buckets {
		want[0] += b.Succeeded
		want[1] += b.Failed
		want[2] += b.Canceled
	}
	require.Equal(t, [4]int64{2, 3, 1, 0}, want, "the fixture's finishes")
	hour := historyRows(t, body, "last-hour")
	require.True(t, len(hour) == 60 || len(hour) == 61, "a row per minute: %d", len(hour))
	require.Equal(t, want, sumRows(hour))
	require.Equal(t, want, sumRows(historyRows(t, body, "retention")))
	ahead := sumRows(historyRows(t, body, "ahead"))
	require.EqualValues(t, 2, ahead[3], "the job scheduled in an hour, and the corrupt value listed as pending in an hour is counted by its entry")
	require.Contains(t, body, "exact from")
	depth := body[strings.Index(body, `<figure class="chart" id="depth">`):]
	depth = depth[:strings.Index(depth, "</figure>")]
	st, err := f.q.Stats(context.Background())
	require.NoError(t, err)
	require.Contains(t, depth, "<title>now, jobs: due "+strconv.FormatInt(st.Due, 10)+"</title>", "the depth bar's due segment is Stats'")
	require.Contains(t, depth, "<title>now, jobs: scheduled "+strconv.FormatInt(st.Scheduled, 10)+"</title>")
	_, qbody := f.fetch(t, c, "/queue?name=mails")
	require.Contains(t, qbody, `<a href="/history?name=mails" id="history-link">history</a>`)
}

// A shard that cannot be read leaves the others' charts, with a note that
// names it: the page does not fail whole.
func TestHistoryPageLeavesOutAShardItCannotRead(t *testing.T) {
	f := newFixture(t, Options{Logger: discardLogger()})
	brokenQueue(t, f)
	c := f.client(t)
	resp, body := f.fetch(t, c, "/history?name=wide")
	wantStatus(t, resp, body, http.StatusOK)
	require.Contains(t, body, `id="history-missing"`)
	require.Contains(t, body, "leave out 1 of 4 shards")
	require.Contains(t, body, "<svg")
}

// A hostile queue name is text in the page and in the charts.
func TestHistoryPageEscapesTheQueueName(t *testing.T) {
	f := newFixture(t, Options{})
	c := f.client(t)
	resp, body := f.fetch(t, c, "/history?name="+url.QueryEscape(hostileQueue))
	wantStatus(t, resp, body, http.StatusOK)
	require.NotContains(t, body, hostileQueue)
	require.Contains(t, body, "&lt;b&gt;evil")
}

// The queue page counts its jobs by type, each type linked to its filter,
// and the type filter offers the types it knows.
func TestQueuePageCountsJobsByType(t *testing.T) {
	f := newFixture(t, Options{})
	c := f.client(t)
	resp, body := f.fetch(t, c, "/queue?name=mails")
	wantStatus(t, resp, body, http.StatusOK)
	tc, err := f.q.CountByType(context.Background(), 0)
	require.NoError(t, err)
	require.True(t, tc.Complete)
	for _, typ := range tc.Types {
		row := `<tr data-type="` + template.HTMLEscapeString(typ.Type) + `">`
		require.Contains(t, body, row)
		i := strings.Index(body, row)
		cells := body[i : i+strings.Index(body[i:], "</tr>")]
		want := "</a></td><td>" + strconv.FormatInt(typ.Pending, 10) + "</td><td>" + strconv.FormatInt(typ.Active, 10) +
			"</td><td>" + strconv.FormatInt(typ.Succeeded, 10) + "</td><td>" + strconv.FormatInt(typ.Failed, 10) +
			"</td><td>" + strconv.FormatInt(typ.Canceled, 10) + "</td>"
		require.Contains(t, cells, want, typ.Type)
	}
	require.Contains(t, body, `<datalist id="known-types"><option value="welcome">`)
	require.NotContains(t, body, hostileType, "the hostile type stays text")
}

// The history page says from when its counts are exact by the retention
// the workers keep (Options.Retention): a job their Trim removed once its
// 1s passed is older than the span it calls exact.
func TestHistoryPageSaysExactSinceByTheWorkersRetention(t *testing.T) {
	f := newFixture(t, Options{Retention: time.Second, FailedRetention: time.Minute})
	ctx := context.Background()
	short, err := jobkey.NewQueue(f.rdb, "short", &jobkey.Config{Prefix: f.prefix, Retention: time.Second, FailedRetention: time.Minute})
	require.NoError(t, err)
	_, err = short.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)
	j, err := short.Claim(ctx, "w")
	require.NoError(t, err)
	j, err = short.Complete(ctx, j, nil)
	require.NoError(t, err)
	time.Sleep(2200 * time.Millisecond) // the retention and Trim's second of grace
	n, err := short.Trim(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)

	resp, body := f.fetch(t, f.client(t), "/history?name=short")
	wantStatus(t, resp, body, http.StatusOK)
	m := regexp.MustCompile(`Counts are exact from ([0-9-]+ [0-9:]+) for succeeded`).FindStringSubmatch(body)
	require.NotNil(t, m, body)
	since, err := time.Parse(time.DateTime, m[1])
	require.NoError(t, err)
	require.False(t, since.Before(j.UpdatedAt.Truncate(time.Second)), "exact from %v, but the job that finished at %v is not counted", since, j.UpdatedAt)
	require.Contains(t, body, "keep finished jobs 1s and failed ones 1m0s")
}

// A retention of a thousand hours or more still charts the thousand
// hours Throughput can count, whatever the minute.
func TestHistoryPageChartsALongRetention(t *testing.T) {
	f := newFixture(t, Options{FailedRetention: 60 * 24 * time.Hour})
	resp, body := f.fetch(t, f.client(t), "/history?name=mails")
	wantStatus(t, resp, body, http.StatusOK)
	rows := historyRows(t, body, "retention")
	require.True(t, len(rows) >= 999 && len(rows) <= jobkey.MaxThroughputBuckets, "%d rows", len(rows))
	require.Equal(t, [4]int64{2, 3, 1, 0}, sumRows(rows))
}

// The per-type table says how many of the values it read it could not
// decode, which no type counts: the fixture's corrupt pending value.
func TestQueuePageSaysHowManyValuesTheTypeCountCouldNotRead(t *testing.T) {
	f := newFixture(t, Options{})
	tc, err := f.q.CountByType(context.Background(), 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, tc.Unreadable, "the fixture's corrupt value listed as pending")
	resp, body := f.fetch(t, f.client(t), "/queue?name=mails")
	wantStatus(t, resp, body, http.StatusOK)
	require.Regexp(t, `id="types-note">[^<]*1 job value could not be read`, body)
}

// A shard whose depth Stats cannot read is named on the page: the depth
// bar and counts of the others are not given as the queue's.
func TestHistoryPageNamesAShardItsDepthLeavesOut(t *testing.T) {
	f := newFixture(t, Options{Logger: discardLogger()})
	ctx := context.Background()
	q, err := jobkey.NewQueue(f.rdb, "deep", &jobkey.Config{Prefix: f.prefix, Shards: 4})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "t", nil, &jobkey.EnqueueOpts{ID: "d1"})
	require.NoError(t, err)
	// Only the leased index is broken: Stats reads it, Throughput does not.
	require.NoError(t, f.rdb.Set(ctx, q.Keys("d1").Leased, "not a zset", 0).Err())
	_, err = q.Stats(ctx)
	var se *jobkey.ShardsError
	require.ErrorAs(t, err, &se)
	c := f.client(t)
	resp, body := f.fetch(t, c, "/history?name=deep")
	wantStatus(t, resp, body, http.StatusOK)
	require.Contains(t, body, `id="depth"`)
	require.Contains(t, body, `id="counts-partial"`, "the counts and the depth bar say a shard is left out")
}

// The expired leases are among the active jobs: a Stats that counted more
// expired leases than active jobs (the two are read apart) does not draw a
// bar longer than the active jobs.
func TestDepthChartKeepsExpiredLeasesWithinTheActive(t *testing.T) {
	svg := string(depthChart(jobkey.Stats{Due: 1, Active: 2, ExpiredLeases: 5}))
	require.Contains(t, svg, "<title>now, jobs: expired leases 2</title>")
	require.NotContains(t, svg, "expired leases 5")
	require.Contains(t, svg, "<title>now, jobs: active 0</title>")
}
