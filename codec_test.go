package jobkey

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/msgpk"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

var updateGolden = flag.Bool("update-golden", false, "write the golden file of the current format version (never an older one: they must decode forever)")

func ms(t time.Time) time.Time { return t.Truncate(time.Millisecond).UTC() }

func fullJob() *Job {
	now := ms(time.Date(2026, 11, 30, 6, 30, 0, 123e6, time.UTC))
	return &Job{
		ID: "01JDQ4Z0000000000000000000", Queue: "emails", Type: "send-welcome",
		Payload: []byte(`{"to":"a@example.com"}`), State: StateActive, Attempt: 3, MaxAttempts: 25,
		RunAt: now, LeaseOwner: "host-1/worker-7", LeaseUntil: now.Add(30 * time.Second),
		LastError: "smtp: 421 try later", Result: []byte{0, 1, 2, 255},
		CreatedAt: now.Add(-time.Hour), UpdatedAt: now, Rev: 7, LeaseToken: 0x1234_5678_9abc_def0,
	}
}

// fullJobMeta is fullJob with the field of format 1.2, a trace context as
// the otel package writes it.
func fullJobMeta() *Job {
	j := fullJob()
	j.Meta = map[string]string{
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":  "congo=t61rcWkgMzE",
	}
	return j
}

// fullJobTimeout is fullJobMeta with the field of format 1.3.
func fullJobTimeout() *Job {
	j := fullJobMeta()
	j.Timeout = 90*time.Second + 250*time.Millisecond
	return j
}

// fullJobPriority is fullJobTimeout with the field of format 1.4.
func fullJobPriority() *Job {
	j := fullJobTimeout()
	j.Priority = 7
	return j
}

// fullJobConcurrency is fullJobPriority with the field of format 1.5.
func fullJobConcurrency() *Job {
	j := fullJobPriority()
	j.ConcurrencyKey = "customer-42"
	return j
}

// fullJobRetention is fullJobConcurrency with the fields of format 1.6.
func fullJobRetention() *Job {
	j := fullJobConcurrency()
	j.Retention = 36*time.Hour + 500*time.Millisecond
	j.Deadline = ms(time.Date(2026, 12, 24, 18, 0, 0, 250e6, time.UTC))
	return j
}

// fullJobHistory is fullJobRetention with the fields of format 1.7.
func fullJobHistory() *Job {
	j := fullJobRetention()
	start := ms(time.Date(2026, 11, 30, 6, 0, 0, 500e6, time.UTC))
	j.Snoozes = 2
	j.StartedAt = start.Add(20 * time.Minute)
	j.History = []AttemptRecord{
		{Attempt: 1, Started: start, Duration: 1500 * time.Millisecond, Worker: "host-1/worker-2", Outcome: OutcomeFailed, Error: "smtp: 421 try later"},
		{Attempt: 2, Started: start.Add(time.Minute), Duration: 30 * time.Second, Worker: "host-2/worker-0", Outcome: OutcomeLost, Error: "its lease ran out"},
		{Attempt: 2, Started: start.Add(10 * time.Minute), Duration: 80 * time.Millisecond, Worker: "host-1/worker-7", Outcome: OutcomeSnoozed, Error: "jobkey: snoozed for 30s"},
	}
	j.HistoryDropped = 4
	j.Progress = []byte(`{"sent":40,"of":100}`)
	return j
}

// fullJobBatch is fullJobHistory, a job of a batch (format 1.8).
func fullJobBatch() *Job {
	j := fullJobHistory()
	j.Batch = "01JDQ4ZBATCH0000000000000"
	return j
}

// bigHistoryJob has a History at both limits: MaxHistoryEntries records,
// MaxHistoryBytes of text, errors at MaxHistoryErrorLen.
func bigHistoryJob() *Job {
	j := &Job{ID: "h", State: StateFailed, HistoryDropped: MaxAttemptsLimit, Snoozes: MaxAttemptsLimit, Progress: bytes.Repeat([]byte{7}, MaxProgressBytes)}
	for i := range MaxHistoryEntries {
		j.History = append(j.History, AttemptRecord{Attempt: i + 1, Started: ms(time.UnixMilli(int64(i+1) << 40)), Duration: time.Duration(i) * time.Hour,
			Worker: "w", Outcome: Outcome(1 + i%5)})
	}
	left := MaxHistoryBytes - MaxHistoryEntries
	for i := 0; left > 0; i++ {
		n := min(left, MaxHistoryErrorLen)
		j.History[i].Error = strings.Repeat("e", n)
		left -= n
	}
	return j
}

// bigMeta is a Meta at both limits: MaxMetaEntries entries, MaxMetaBytes
// bytes, some of them strings of every msgpack width up to str16.
func bigMeta() map[string]string {
	m := make(map[string]string, MaxMetaEntries)
	for i := range MaxMetaEntries - 2 {
		m[fmt.Sprintf("k%02d", i)] = "v"
	}
	used := (MaxMetaEntries - 2) * 4
	m[strings.Repeat("K", 40)] = strings.Repeat("ü", 100) // str8, 200 bytes
	m["long"] = strings.Repeat("x", MaxMetaBytes-used-40-200-len("long"))
	return m
}

func TestCodecRoundTrip(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte{0xab}, 300<<10) // forces bin32
	long := strings.Repeat("é", 40000)         // forces str32 (80,000 bytes)
	cases := map[string]*Job{
		"minimal":         {State: StatePending},
		"full":            fullJob(),
		"meta":            fullJobMeta(),
		"retention":       fullJobRetention(),
		"maxRetention":    {ID: "r", State: StateSucceeded, Retention: MaxRetention, Deadline: ms(time.UnixMilli(1<<62 - 1))},
		"negDeadline":     {ID: "d", State: StatePending, Deadline: ms(time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC))},
		"metaAtLimits":    {ID: "m", State: StatePending, Meta: bigMeta()},
		"history":         fullJobHistory(),
		"historyAtLimits": bigHistoryJob(),
		"metaOneEmpty":    {ID: "e", State: StatePending, Meta: map[string]string{"k": ""}},
		"unicode":         {ID: "ジョブ-🚀", Queue: "κουέ", Type: "тип", LastError: "ошибка: 失败", State: StateFailed},
		"zeroTime":        {ID: "z", State: StateSucceeded, RunAt: time.Time{}, CreatedAt: time.Time{}},
		"negTime":         {ID: "n", State: StatePending, RunAt: ms(time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC))},
		"largePayload":    {ID: "big", State: StatePending, Payload: big, Result: big[:70000]},
		"longStrings":     {ID: long[:300], Type: long[:1000], LastError: long, State: StateCanceled},
		"maximal": {
			ID: strings.Repeat("x", 255), State: StateCanceled, Attempt: 1<<31 - 1, MaxAttempts: 1<<31 - 1,
			Rev: 1<<64 - 1, RunAt: ms(time.UnixMilli(1<<62 - 1)), LeaseUntil: ms(time.UnixMilli(-1 << 62)),
		},
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b, err := Marshal(in)
			require.NoError(t, err)
			require.Len(t, b, encodedSize(in), "encodedSize must be exact")
			var out Job
			require.NoError(t, Unmarshal(b, &out))
			require.Equal(t, *in, out)
		})
	}
}

func TestCodecEmptyBytesDecodeNil(t *testing.T) {
	t.Parallel()
	b, err := Marshal(&Job{State: StatePending, Payload: []byte{}, Meta: map[string]string{}, History: []AttemptRecord{}, Progress: []byte{}})
	require.NoError(t, err)
	var out Job
	require.NoError(t, Unmarshal(b, &out))
	require.Nil(t, out.Payload)
	require.Nil(t, out.Meta)
	require.Nil(t, out.History)
	require.Nil(t, out.Progress)
	require.Equal(t, []byte{0x80, 0x00, 0x00, 0xa0, 0x00, 0x00, 0x00, 0x00, 0x90, 0x00, 0xc4, 0x00, 0xa0}, b[len(b)-13:],
		"an empty Meta is one byte, an empty fixmap; then the zero Timeout and Priority, no ConcurrencyKey, the zero Retention, no Deadline, no snoozes or start, an empty History, none dropped, an empty Progress and no Batch")
	nilMeta, err := Marshal(&Job{State: StatePending})
	require.NoError(t, err)
	require.Equal(t, b, nilMeta, "nil and empty Meta encode alike")
}

// Meta is written in key order, so the same job always has the same bytes.
func TestCodecMetaDeterministic(t *testing.T) {
	t.Parallel()
	first, err := Marshal(&Job{State: StatePending, Meta: bigMeta()})
	require.NoError(t, err)
	for range 20 {
		again, err := Marshal(&Job{State: StatePending, Meta: bigMeta()})
		require.NoError(t, err)
		require.Equal(t, first, again)
	}
}

func TestUnmarshalZeroesTarget(t *testing.T) {
	t.Parallel()
	b, err := Marshal(&Job{ID: "a", State: StatePending})
	require.NoError(t, err)
	out := *fullJob()
	require.NoError(t, Unmarshal(b, &out))
	require.Equal(t, Job{ID: "a", State: StatePending}, out)

	// A failed decode leaves the target zeroed, never half-filled.
	out = *fullJob()
	require.ErrorIs(t, Unmarshal(b[:len(b)-1], &out), ErrCorrupt)
	require.Equal(t, Job{}, out)
}

func TestMarshalRefuses(t *testing.T) {
	t.Parallel()
	_, err := Marshal(&Job{ID: "s"})
	require.ErrorContains(t, err, "invalid state 0")
	_, err = Marshal(&Job{State: 9})
	require.ErrorContains(t, err, "invalid state 9")
	_, err = Marshal(nil)
	require.Error(t, err)
	_, err = Marshal(&Job{State: StatePending, Payload: make([]byte, MaxValueBytes)})
	require.ErrorIs(t, err, ErrTooLarge)
	// What Unmarshal would refuse is never written.
	for _, j := range []*Job{
		{State: StatePending, MaxAttempts: MaxAttemptsLimit + 1},
		{State: StatePending, Attempt: MaxAttemptsLimit + 1},
		{State: StatePending, Attempt: -1},
		{State: StatePending, MaxAttempts: -1},
		{State: StatePending, Meta: map[string]string{"": "v"}},
		{State: StatePending, Meta: func() map[string]string { m := bigMeta(); m["one"] = "more"; return m }()},
		{State: StatePending, Meta: func() map[string]string { m := bigMeta(); m["long"] += "x"; return m }()},
		{State: StatePending, Retention: -time.Millisecond},
		{State: StatePending, Retention: MaxRetention + time.Millisecond},
		{State: StatePending, Retention: time.Second + time.Microsecond},
	} {
		_, err = Marshal(j)
		require.ErrorIs(t, err, ErrInvalid, "%+v", j)
	}
}

// The golden files are the wire formats this build has written. They are
// checked in and must decode to the same Job forever: a v1.0 value (from
// before LeaseToken) still decodes, with a zero token, and a v1.1 value
// (from before Meta) with a nil Meta.
func TestCodecGoldenV1(t *testing.T) {
	t.Parallel()
	old, err := os.ReadFile(filepath.Join("testdata", "job-v1.0.msgpack"))
	require.NoError(t, err)
	var got Job
	require.NoError(t, Unmarshal(old, &got))
	want := fullJob()
	want.LeaseToken = 0
	require.Equal(t, *want, got)

	v11, err := os.ReadFile(filepath.Join("testdata", "job-v1.1.msgpack"))
	require.NoError(t, err)
	got = Job{}
	require.NoError(t, Unmarshal(v11, &got))
	require.Equal(t, *fullJob(), got)
	require.Len(t, old, len(v11)-9, "1.1 appends one element to 1.0: the token, a uint64")

	v12 := goldenV12(t)
	got = Job{}
	require.NoError(t, Unmarshal(v12, &got))
	require.Equal(t, *fullJobMeta(), got, "a v1.2 value has no Timeout")
	meta := appendMeta(nil, fullJobMeta().Meta)
	require.Equal(t, []byte{0xdc, 0, 18, 1, 1}, v11[:5], "array16 of 18, version 1.1")
	require.Equal(t, []byte{0xdc, 0, 19, 1, 2}, v12[:5], "array16 of 19, version 1.2")
	require.Equal(t, v11[5:], v12[5:len(v12)-len(meta)], "1.2 appends one element to 1.1: Meta")
	require.Equal(t, meta, v12[len(v12)-len(meta):])

	v13 := goldenV13(t)
	got = Job{}
	require.NoError(t, Unmarshal(v13, &got))
	require.Equal(t, *fullJobTimeout(), got, "a v1.3 value has priority 0")
	require.Equal(t, []byte{0xdc, 0, 20, 1, 3}, v13[:5], "array16 of 20, version 1.3")
	timeout := msgpk.AppendInt(nil, fullJobTimeout().Timeout.Milliseconds())
	require.Equal(t, v12[5:], v13[5:len(v13)-len(timeout)], "1.3 appends one element to 1.2: Timeout")
	require.Equal(t, timeout, v13[len(v13)-len(timeout):])

	v14 := goldenV14(t)
	got = Job{}
	require.NoError(t, Unmarshal(v14, &got))
	require.Equal(t, *fullJobPriority(), got, "a v1.4 value has no ConcurrencyKey")
	require.Equal(t, []byte{0xdc, 0, 21, 1, 4}, v14[:5], "array16 of 21, version 1.4")
	require.Equal(t, v13[5:], v14[5:len(v14)-1], "1.4 appends one element to 1.3: Priority")
	require.Equal(t, byte(7), v14[len(v14)-1])

	v15 := goldenV15(t)
	got = Job{}
	require.NoError(t, Unmarshal(v15, &got))
	require.Equal(t, *fullJobConcurrency(), got, "a v1.5 value has no Retention or Deadline of its own")
	require.Equal(t, []byte{0xdc, 0, 22, 1, 5}, v15[:5], "array16 of 22, version 1.5")
	ck := msgpk.AppendStr(nil, fullJobConcurrency().ConcurrencyKey)
	require.Equal(t, v14[5:], v15[5:len(v15)-len(ck)], "1.5 appends one element to 1.4: ConcurrencyKey")
	require.Equal(t, ck, v15[len(v15)-len(ck):])

	v16 := goldenV16(t)
	got = Job{}
	require.NoError(t, Unmarshal(v16, &got))
	require.Equal(t, *fullJobRetention(), got, "a v1.6 value has no snoozes, history or progress")
	require.Equal(t, []byte{0xdc, 0, 24, 1, 6}, v16[:5], "array16 of 24, version 1.6")
	tail := msgpk.AppendInt(msgpk.AppendInt(nil, fullJobRetention().Retention.Milliseconds()), toMillis(fullJobRetention().Deadline))
	require.Equal(t, v15[5:], v16[5:len(v16)-len(tail)], "1.6 appends two elements to 1.5: Retention and Deadline")
	require.Equal(t, tail, v16[len(v16)-len(tail):])

	v17 := goldenV17(t)
	got = Job{}
	require.NoError(t, Unmarshal(v17, &got))
	require.Equal(t, *fullJobHistory(), got, "a v1.7 value has no batch")
	require.Equal(t, []byte{0xdc, 0, 29, 1, 7}, v17[:5], "array16 of 29, version 1.7")
	h := fullJobHistory()
	tail = msgpk.AppendUint(nil, uint64(h.Snoozes))
	tail = msgpk.AppendInt(tail, toMillis(h.StartedAt))
	tail = appendHistory(tail, h.History)
	tail = msgpk.AppendBin(msgpk.AppendUint(tail, uint64(h.HistoryDropped)), h.Progress)
	require.Equal(t, v16[5:], v17[5:len(v17)-len(tail)], "1.7 appends five elements to 1.6: Snoozes, StartedAt, History, HistoryDropped, Progress")
	require.Equal(t, tail, v17[len(v17)-len(tail):])

	golden := goldenV18(t)
	got = Job{}
	require.NoError(t, Unmarshal(golden, &got))
	require.Equal(t, *fullJobBatch(), got)
	// The current encoder writes v1.8 byte for byte.
	b, err := Marshal(fullJobBatch())
	require.NoError(t, err)
	require.Equal(t, golden, b)
	require.Equal(t, []byte{0xdc, 0, 30, 1, 8}, golden[:5], "array16 of 30, version 1.8")
	tail = msgpk.AppendStr(nil, fullJobBatch().Batch)
	require.Equal(t, v17[5:], golden[5:len(golden)-len(tail)], "1.8 appends one element to 1.7: Batch")
	require.Equal(t, tail, golden[len(golden)-len(tail):])
}

// goldenV12 is the value 1.2 wrote for fullJobMeta, checked in. It is
// never written again: it must decode forever.
func goldenV12(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "job-v1.2.msgpack"))
	require.NoError(t, err)
	return b
}

// goldenV13 is the value 1.3 wrote for fullJobTimeout, checked in; never
// written again.
func goldenV13(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "job-v1.3.msgpack"))
	require.NoError(t, err)
	return b
}

// goldenV14 is the value 1.4 wrote for fullJobPriority, checked in; never
// written again.
func goldenV14(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "job-v1.4.msgpack"))
	require.NoError(t, err)
	return b
}

// goldenV15 is the value 1.5 wrote for fullJobConcurrency, checked in;
// never written again.
func goldenV15(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "job-v1.5.msgpack"))
	require.NoError(t, err)
	return b
}

// goldenV16 is the value 1.6 wrote for fullJobRetention, checked in;
// never written again.
func goldenV16(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "job-v1.6.msgpack"))
	require.NoError(t, err)
	return b
}

// goldenV17 is the value 1.7 wrote for fullJobHistory, checked in; never
// written again.
func goldenV17(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "job-v1.7.msgpack"))
	require.NoError(t, err)
	return b
}

// goldenV18 is the value this build writes for fullJobBatch, checked in.
func goldenV18(t *testing.T) []byte {
	t.Helper()
	path := filepath.Join("testdata", "job-v1.8.msgpack")
	if *updateGolden {
		b, err := Marshal(fullJobBatch())
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, b, 0o644))
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// A value of each minor version since 1.2, read by a build that knows only
// the minor version before it, keeps the field that version appended raw
// and writes it back unchanged, byte for byte: an older worker's claim or
// completion never drops what a newer build wrote, and every field the
// older build knows reads as that build wrote it. The test plays the older
// build with decodeJobAs and appendJobAs, which read and write only the
// elements that build knew, as its codec did.
//
// 1.2 appended Meta: the 1.1 decoder skips it with the same skipping rules
// (decoder.skip) that every build since 1.1 has, keeps its bytes as a field
// of a newer minor version, and writes them back with minor version 2.
// (Checked once by hand against the 1.1 codec itself, from git: it reads
// this file with Meta kept raw and writes it back byte for byte.) 1.3
// appended Timeout, which this build reads again once 1.2 moved the job on;
// 1.4 appended Priority, and 1.5 ConcurrencyKey, which an older worker so
// never drops. 1.6 appended two fields at once, Retention and Deadline:
// 1.5 skips both, keeps them raw, and writes them back with minor version
// 6, so this build reads them again once 1.5 moved the job on. (Checked
// once by hand against the 1.5 codec itself, from git: it reads this
// file, keeps both fields raw and writes it back byte for byte.) 1.7
// appended five at once, Snoozes, StartedAt, History, HistoryDropped and
// Progress: 1.6 keeps all five raw and writes them back with minor version
// 7. (Checked once by hand against the 1.6 codec itself, from git: it
// reads this file and writes it back byte for byte.)
func TestCodecGoldenReadByOlderMinor(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		golden func(*testing.T) []byte
		reader int                                       // the fields the older build knows
		added  int                                       // the fields the newer version appended
		known  func() *Job                               // the job as the older build wrote it
		check  func(t *testing.T, golden []byte, j *Job) // the checks of this version
	}{
		{"1.2 read by 1.1", goldenV12, v1Fields + 1, 1, fullJob, func(t *testing.T, golden []byte, j *Job) {
			const v11 = v1Fields + 1
			require.Nil(t, j.Meta, "1.1 knows no Meta")
			require.EqualValues(t, 2, j.future.minor)
			require.Equal(t, appendMeta(nil, fullJobMeta().Meta), j.future.raw, "kept raw, byte for byte")
			again := appendJobAs(nil, j, v11)
			require.Len(t, again, encodedSizeAs(j, v11))

			// A 1.1 worker moves the job on (completes it); this build still
			// reads the Meta that 1.2 wrote.
			j.State, j.LeaseOwner, j.LeaseUntil, j.Result, j.Rev = StateSucceeded, "", time.Time{}, []byte("done"), j.Rev+1
			var now Job
			require.NoError(t, Unmarshal(appendJobAs(nil, j, v11), &now))
			require.Equal(t, fullJobMeta().Meta, now.Meta)
			require.Equal(t, StateSucceeded, now.State)
			require.Zero(t, now.future.n, "no field is unknown to this build")

			// A 1.1 value read by this build as by 1.1: nothing left over.
			v11b, err := os.ReadFile(filepath.Join("testdata", "job-v1.1.msgpack"))
			require.NoError(t, err)
			var old Job
			require.NoError(t, decodeJobAs(newDecoder(v11b, false), &old, v11))
			require.Equal(t, *fullJob(), old)
			require.Equal(t, v11b, appendJobAs(nil, &old, v11))
		}},
		{"1.3 read by 1.2", goldenV13, v1Fields + 2, 1, fullJobMeta, func(t *testing.T, golden []byte, j *Job) {
			const v12 = v1Fields + 2
			require.Zero(t, j.Timeout, "1.2 knows no Timeout")
			require.EqualValues(t, 3, j.future.minor)
			require.Len(t, golden, encodedSizeAs(j, v12))

			j.State, j.Result, j.Rev = StateSucceeded, []byte("done"), j.Rev+1
			var now Job
			require.NoError(t, Unmarshal(appendJobAs(nil, j, v12), &now))
			require.Equal(t, fullJobTimeout().Timeout, now.Timeout)
		}},
		{"1.4 read by 1.3", goldenV14, v1Fields + 3, 1, fullJobTimeout, func(t *testing.T, golden []byte, j *Job) {
			require.Zero(t, j.Priority, "1.3 knows no Priority")
		}},
		{"1.5 read by 1.4", goldenV15, v1Fields + 4, 1, fullJobPriority, func(t *testing.T, golden []byte, j *Job) {
			require.Empty(t, j.ConcurrencyKey, "1.4 knows no ConcurrencyKey")
			require.EqualValues(t, 5, j.future.minor)
		}},
		{"1.6 read by 1.5", goldenV16, v1Fields + 5, 2, fullJobConcurrency, func(t *testing.T, golden []byte, j *Job) {
			const v15 = v1Fields + 5
			require.Zero(t, j.Retention, "1.5 knows no Retention")
			require.Zero(t, j.Deadline, "1.5 knows no Deadline")
			require.EqualValues(t, 6, j.future.minor)
			require.Len(t, golden, encodedSizeAs(j, v15))

			// A 1.5 worker completes the job; this build still reads what 1.6
			// wrote, and keeps the job for its own Retention.
			j.State, j.LeaseOwner, j.Result, j.Rev = StateSucceeded, "", []byte("done"), j.Rev+1
			var now Job
			require.NoError(t, Unmarshal(appendJobAs(nil, j, v15), &now))
			require.Equal(t, fullJobRetention().Retention, now.Retention)
			require.Equal(t, fullJobRetention().Deadline, now.Deadline)
			require.Zero(t, now.future.n, "no field is unknown to this build")
		}},
		{"1.7 read by 1.6", goldenV17, v1Fields + 7, 5, fullJobRetention, func(t *testing.T, golden []byte, j *Job) {
			const v16 = v1Fields + 7
			require.Zero(t, j.Snoozes, "1.6 knows no Snoozes")
			require.Nil(t, j.History, "1.6 knows no History")
			require.Nil(t, j.Progress, "1.6 knows no Progress")
			require.EqualValues(t, 7, j.future.minor)
			require.Len(t, golden, encodedSizeAs(j, v16))

			// A 1.6 worker fails the run and retries it; this build still
			// reads what 1.7 wrote: the snoozes, the history and the progress.
			j.State, j.LeaseOwner, j.LastError, j.Rev = StatePending, "", "boom", j.Rev+1
			var now Job
			require.NoError(t, Unmarshal(appendJobAs(nil, j, v16), &now))
			want := fullJobHistory()
			require.Equal(t, want.Snoozes, now.Snoozes)
			require.Equal(t, want.StartedAt, now.StartedAt)
			require.Equal(t, want.History, now.History)
			require.Equal(t, want.HistoryDropped, now.HistoryDropped)
			require.Equal(t, want.Progress, now.Progress)
			require.Equal(t, "boom", now.LastError)
			require.Zero(t, now.future.n, "no field is unknown to this build")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			golden := c.golden(t)
			var j Job
			require.NoError(t, decodeJobAs(newDecoder(bytes.Clone(golden), true), &j, c.reader))
			require.Equal(t, c.added, j.future.n, "the appended fields are ones the older build does not know")
			known := j
			known.future = futureFields{}
			require.Equal(t, *c.known(), known, "every field the older build knows reads as that build wrote it")
			require.Equal(t, golden, appendJobAs(nil, &j, c.reader), "written back by the older build, byte for byte")
			c.check(t, golden, &j)
		})
	}
}

// appendFields builds a value as a newer minor version would: the v1 array
// with extra elements appended and the array header widened to match.
func appendFields(t *testing.T, j *Job, minor uint64, extra ...any) []byte {
	t.Helper()
	b, err := Marshal(j)
	require.NoError(t, err)
	require.EqualValues(t, 0xdc, b[0], "v1 values start with an array16 header")
	body := b[3:]
	body[1] = byte(minor) // minor is the second element, a positive fixint
	out := msgpk.AppendArrayHdr(nil, knownFields+len(extra))
	out = append(out, body...)
	for _, e := range extra {
		eb, err := msgpack.Marshal(e)
		require.NoError(t, err)
		out = append(out, eb...)
	}
	return out
}

func TestCodecNewerMinorDecodes(t *testing.T) {
	t.Parallel()
	in := fullJob()
	b := appendFields(t, in, 9, "a new string field", int64(-5), map[string]any{"k": []any{1, "x", nil, 2.5}},
		[]byte{1, 2, 3}, true, nil, float32(1.5), time.Now())
	var out Job
	require.NoError(t, Unmarshal(b, &out))
	require.Equal(t, 8, out.future.n)
	require.EqualValues(t, 9, out.future.minor)
	out.future = futureFields{}
	require.Equal(t, *in, out, "the known fields read as ever")
	// Written back, the value is the same, byte for byte: the fields this
	// build does not know and the newer minor version are kept.
	require.NoError(t, Unmarshal(b, &out))
	again, err := Marshal(&out)
	require.NoError(t, err)
	require.Equal(t, b, again)
	require.Len(t, again, encodedSize(&out))
	var fromString Job
	require.NoError(t, unmarshalString(string(b), &fromString))
	require.Equal(t, out, fromString)
}

// futureGolden is a value as a future minor version (9) writes it: this
// build's fields, then two fields this build does not know. Checked in, it
// must keep its bytes through every transition an older worker makes. (It
// is written anew whenever a minor version defines the element where its
// first unknown field sat: no real writer puts a string where 1.2 put
// Meta, 1.3 Timeout, 1.4 Priority, 1.5 ConcurrencyKey, 1.6 Retention or
// 1.7 Snoozes.)
func futureGolden(t *testing.T) []byte {
	t.Helper()
	path := filepath.Join("testdata", "job-future-minor.msgpack")
	if *updateGolden {
		j := fullJobBatch()
		j.State, j.Attempt, j.LeaseOwner, j.LeaseUntil, j.LeaseToken = StatePending, 0, "", time.Time{}, 0
		b := appendFields(t, j, 9, "priority-class: gold", map[string]any{"trace": "00-4bf92f3577b34da6-01"})
		require.NoError(t, os.WriteFile(path, b, 0o644))
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

func TestCodecGoldenFutureMinor(t *testing.T) {
	t.Parallel()
	b := futureGolden(t)
	var j Job
	require.NoError(t, Unmarshal(b, &j))
	require.Equal(t, fullJob().ID, j.ID)
	require.Equal(t, fullJobMeta().Meta, j.Meta)
	require.Equal(t, fullJobTimeout().Timeout, j.Timeout)
	require.Equal(t, fullJobPriority().Priority, j.Priority)
	require.Equal(t, fullJobConcurrency().ConcurrencyKey, j.ConcurrencyKey)
	require.Equal(t, fullJobRetention().Retention, j.Retention)
	require.Equal(t, fullJobRetention().Deadline, j.Deadline)
	require.Equal(t, fullJobHistory().History, j.History)
	require.Equal(t, fullJobHistory().Progress, j.Progress)
	require.Equal(t, fullJobBatch().Batch, j.Batch)
	require.Equal(t, 2, j.future.n)
	again, err := Marshal(&j)
	require.NoError(t, err)
	require.Equal(t, b, again)
}

func TestCodecVersions(t *testing.T) {
	t.Parallel()
	b, err := Marshal(fullJob())
	require.NoError(t, err)
	b[3] = 2 // major version 2, right after the array16 header
	var out Job
	err = Unmarshal(b, &out)
	require.ErrorIs(t, err, ErrUnsupportedFormat)
	require.NotErrorIs(t, err, ErrCorrupt)
}

func TestCodecCorrupt(t *testing.T) {
	t.Parallel()
	good, err := Marshal(fullJob())
	require.NoError(t, err)
	set := func(i int, v byte) []byte {
		b := bytes.Clone(good)
		b[i] = v
		return b
	}
	cases := map[string]struct {
		in    []byte
		field string
	}{
		"empty":             {nil, "value"},
		"notArray":          {[]byte{0xa1, 'x'}, "value"},
		"noVersion":         {[]byte{0x91, 0x01}, "value"},
		"tooFewFields":      {[]byte{0x92, 0x01, 0x00}, "value"},
		"trailing":          {append(bytes.Clone(good), 0x00), "value"},
		"truncated":         {good[:len(good)-24], "UpdatedAt"},
		"truncatedToken":    {good[:len(good)-15], "LeaseToken"},
		"idNotString":       {set(5, 0x05), "ID"},
		"badState":          {stateAt(t, good, 9), "State"},
		"versionString":     {[]byte{0x92, 0xa1, 'x', 0x00}, "format major version"},
		"negativeAttempt":   {replaceField(t, 7, int64(-1)), "Attempt"},
		"badAppendedField":  {badAppended(t), "appended field 30"},
		"batchNotString":    {replaceField(t, 29, int64(5)), "Batch"},
		"batchBraced":       {replaceField(t, 29, "b{1}"), "Batch"},
		"badToken":          {replaceField(t, 17, "not a number"), "LeaseToken"},
		"metaNotMap":        {replaceField(t, 18, "not a map"), "Meta"},
		"metaNil":           {replaceField(t, 18, nil), "Meta"},
		"timeoutNotInt":     {replaceField(t, 19, "90s"), "Timeout"},
		"timeoutNegative":   {replaceField(t, 19, int64(-1)), "Timeout"},
		"timeoutTooLong":    {replaceField(t, 19, MaxTimeout.Milliseconds()+1), "Timeout"},
		"priorityTooHigh":   {replaceField(t, 20, uint64(MaxPriority+1)), "Priority"},
		"priorityNegative":  {replaceField(t, 20, int64(-1)), "Priority"},
		"ckNotString":       {replaceField(t, 21, uint64(5)), "ConcurrencyKey"},
		"ckTooLong":         {replaceField(t, 21, strings.Repeat("k", MaxConcurrencyKeyLen+1)), "ConcurrencyKey"},
		"retentionNotInt":   {replaceField(t, 22, "36h"), "Retention"},
		"retentionNeg":      {replaceField(t, 22, int64(-1)), "Retention"},
		"retentionTooLong":  {replaceField(t, 22, MaxRetention.Milliseconds()+1), "Retention"},
		"deadlineNotInt":    {replaceField(t, 23, "tomorrow"), "Deadline"},
		"deadlineFloat":     {replaceField(t, 23, 1.5), "Deadline"},
		"truncatedDeadline": {truncatedAfter(t, 23, uint64(1<<40), 2), "Deadline"},
		"snoozesNegative":   {replaceField(t, 24, int64(-1)), "Snoozes"},
		"snoozesTooMany":    {replaceField(t, 24, uint64(MaxAttemptsLimit)+1), "Snoozes"},
		"startedAtString":   {replaceField(t, 25, "now"), "StartedAt"},
		"historyNotArray":   {replaceField(t, 26, map[string]any{}), "History"},
		"historyTooLong":    {replaceField(t, 26, make([]any, MaxHistoryEntries+1)), "History"},
		"historyShortRec":   {replaceField(t, 26, []any{[]any{1, 2, 3, "w", 1}}), "History"},
		"historyBadOutcome": {replaceField(t, 26, []any{[]any{1, 2, 3, "w", 9, ""}}), "History"},
		"historyNegDur":     {replaceField(t, 26, []any{[]any{1, 2, -3, "w", 1, ""}}), "History Duration"},
		"historyLongError":  {replaceField(t, 26, []any{[]any{1, 2, 3, "w", 1, strings.Repeat("e", MaxHistoryErrorLen+1)}}), "History"},
		"historyTooMuch":    {replaceField(t, 26, []any{[]any{1, 2, 3, strings.Repeat("w", MaxHistoryBytes), 1, "e"}}), "History"},
		"droppedNegative":   {replaceField(t, 27, int64(-1)), "HistoryDropped"},
		"progressNotBin":    {replaceField(t, 28, "half"), "Progress"},
		"progressTooLarge":  {replaceField(t, 28, make([]byte, MaxProgressBytes+1)), "Progress"},
		"metaIntValue":      {replaceField(t, 18, map[string]any{"k": 1}), "Meta value"},
		"metaIntKey":        {replaceField(t, 18, map[int]string{1: "v"}), "Meta key"},
		"metaEmptyKey":      {replaceField(t, 18, map[string]string{"": "v"}), "Meta"},
		"metaDuplicateKey":  {metaRaw(t, 0x82, "k", "a", "k", "b"), "Meta"},
		"metaTooMany":       {replaceField(t, 18, func() map[string]string { m := bigMeta(); m["x"] = ""; return m }()), "Meta"},
		"metaTooLarge":      {replaceField(t, 18, func() map[string]string { m := bigMeta(); m["long"] += "x"; return m }()), "Meta"},
		"metaTruncated":     {metaRaw(t, 0x82, "k", "a", "j"), "Meta value"},
		"metaShort":         {metaRaw(t, 0x82, "k"), "Meta value"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var out Job
			err := Unmarshal(c.in, &out)
			require.ErrorIs(t, err, ErrCorrupt, "got %v", err)
			var ce *CorruptError
			require.True(t, errors.As(err, &ce))
			if c.field != "" {
				require.Equal(t, c.field, ce.Field, err.Error())
			}
			require.Equal(t, Job{}, out)
		})
	}
}

// stateAt rewrites the State byte of a fullJob encoding.
func stateAt(t *testing.T, good []byte, v byte) []byte {
	t.Helper()
	b := bytes.Clone(good)
	// The state follows the payload bin, which is unique enough to find.
	p := bytes.Index(b, fullJob().Payload) + len(fullJob().Payload)
	require.Equal(t, byte(StateActive), b[p])
	b[p] = v
	return b
}

// replaceField re-encodes a fullJob with element i (0-based in the array)
// replaced by v, using the reflective encoder for the odd value.
func replaceField(t *testing.T, i int, v any) []byte {
	t.Helper()
	elems := fullJobElems()
	elems[i] = v
	b, err := msgpack.Marshal(elems)
	require.NoError(t, err)
	return b
}

// fullJobElems are the elements of a fullJob value, for the reflective
// encoder.
func fullJobElems() []any {
	j := fullJob()
	return []any{uint64(1), uint64(0), j.ID, j.Queue, j.Type, j.Payload, uint64(j.State), j.Attempt, j.MaxAttempts,
		toMillis(j.RunAt), j.LeaseOwner, toMillis(j.LeaseUntil), j.LastError, j.Result,
		toMillis(j.CreatedAt), toMillis(j.UpdatedAt), j.Rev, j.LeaseToken, map[string]string{}, int64(0), uint64(0), "", int64(0), int64(0),
		uint64(0), int64(0), []any{}, uint64(0), []byte{}, ""}
}

// truncatedAfter is replaceField(t, i, v) cut short by cut bytes of
// element i, with every element after it gone.
func truncatedAfter(t *testing.T, i int, v any, cut int) []byte {
	t.Helper()
	full := replaceField(t, i, v)
	n := 0
	for _, e := range fullJobElems()[i+1:] {
		eb, err := msgpack.Marshal(e)
		require.NoError(t, err)
		n += len(eb)
	}
	return full[:len(full)-n-cut]
}

// metaRaw is a fullJob encoding whose Meta is the map header hdr followed
// by the given strings, as they come: duplicate keys, or too few.
func metaRaw(t testing.TB, hdr byte, strs ...string) []byte {
	t.Helper()
	b, err := Marshal(fullJob())
	require.NoError(t, err)
	tail := []byte{0x00, 0x00, 0xa0, 0x00, 0x00, 0x00, 0x00, 0x90, 0x00, 0xc4, 0x00, 0xa0}
	require.Equal(t, append([]byte{0x80}, tail...), b[len(b)-13:], "an empty Meta, then the zero Timeout and Priority, no ConcurrencyKey, the zero Retention, no Deadline, no snoozes, start, history or progress, no batch")
	b = append(b[:len(b)-13], hdr)
	for _, s := range strs {
		b = msgpk.AppendStr(b, s)
	}
	return append(b, tail...)
}

func badAppended(t *testing.T) []byte {
	b := appendFields(t, fullJob(), 1, "x")
	return append(b[:len(b)-2], 0xc1) // 0xc1 is never used by msgpack
}

// Hostile headers claim up to 4 GiB; decoding must refuse them without
// allocating anything near that.
func TestCodecHostileHeaders(t *testing.T) {
	good, err := Marshal(&Job{ID: "h", State: StatePending})
	require.NoError(t, err)
	prefix := good[:7] // array16 header, versions, "h"
	hostile := map[string][]byte{
		"array32":      binary.BigEndian.AppendUint32([]byte{0xdd}, 0xffffffff),
		"bin32Payload": binary.BigEndian.AppendUint32(append(append(bytes.Clone(prefix), 0xa0, 0xa0), 0xc6), 0xffffffff),
		"str32Queue":   binary.BigEndian.AppendUint32(append(bytes.Clone(prefix), 0xdb), 0xfffffff0),
		"appendedArray32": func() []byte {
			b := appendFields(t, &Job{State: StatePending}, 1, "x")
			return binary.BigEndian.AppendUint32(append(b[:len(b)-2], 0xdd), 0xffffffff)
		}(),
		"metaMap32": func() []byte {
			b := good[:len(good)-1] // the empty Meta
			return binary.BigEndian.AppendUint32(append(bytes.Clone(b), 0xdf), 0xffffffff)
		}(),
		"metaMap16": func() []byte {
			b := good[:len(good)-1]
			return append(binary.BigEndian.AppendUint16(append(bytes.Clone(b), 0xde), 0xffff), bytes.Repeat([]byte{0xa1, 'k'}, 200)...)
		}(),
		"appendedMap32": func() []byte {
			b := appendFields(t, &Job{State: StatePending}, 1, "x")
			return binary.BigEndian.AppendUint32(append(b[:len(b)-2], 0xdf), 0x7fffffff)
		}(),
	}
	for name, in := range hostile {
		var err error
		n := allocated(func() { var out Job; err = Unmarshal(in, &out) })
		require.ErrorIs(t, err, ErrCorrupt, name)
		require.Less(t, n, uint64(1<<20), "%s allocated too much", name)
	}
}

func FuzzUnmarshal(f *testing.F) {
	for _, j := range []*Job{fullJob(), fullJobMeta(), fullJobConcurrency(), fullJobRetention(), fullJobHistory(), bigHistoryJob(), {State: StatePending}, {ID: "ü", State: StateFailed, Payload: make([]byte, 300)},
		{State: StatePending, Meta: bigMeta()}} {
		b, err := Marshal(j)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add(metaRaw(f, 0x82, "k", "a", "k", "b"))
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var j, fromString, fromReply Job
		err := Unmarshal(data, &j)
		serr := unmarshalString(string(data), &fromString)
		if (err == nil) != (serr == nil) {
			t.Fatalf("Unmarshal: %v, unmarshalString: %v", err, serr)
		}
		rerr := unmarshalReply(string(data), &fromReply)
		if (err == nil) != (rerr == nil) {
			t.Fatalf("Unmarshal: %v, unmarshalReply: %v", err, rerr)
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnsupportedFormat) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("untyped error: %v", err)
			}
			return
		}
		require.Equal(t, j, fromString)
		require.Equal(t, j, fromReply)
		b, err := Marshal(&j)
		if err != nil {
			t.Fatalf("decoded job does not re-encode: %v", err)
		}
		var again Job
		if err := Unmarshal(b, &again); err != nil {
			t.Fatalf("re-encoded job does not decode: %v", err)
		}
		require.Equal(t, j, again)
	})
}

// FuzzMarshal builds jobs from arbitrary fields: whatever Marshal accepts,
// Unmarshal must read back as the same job (times at millisecond
// precision, in UTC), so a value that was written can always be read.
// meta is read as lines of key=value, so Meta gets any number of entries,
// empty keys and values, and sizes past the limits.
func FuzzMarshal(f *testing.F) {
	j := fullJob()
	tp := "traceparent=" + fullJobMeta().Meta["traceparent"] + "\ntracestate=" + fullJobMeta().Meta["tracestate"]
	r := fullJobRetention()
	f.Add(j.ID, j.Type, j.Payload, uint8(j.State), int64(j.Attempt), int64(j.MaxAttempts), toMillis(j.RunAt), j.LeaseToken, j.Rev, tp, int64(fullJobTimeout().Timeout), 7, "customer-42", int64(r.Retention), toMillis(r.Deadline))
	f.Add("", "", []byte(nil), uint8(0), int64(-1), int64(1<<40), int64(0), uint64(0), uint64(0), "", int64(-1), -1, strings.Repeat("k", MaxConcurrencyKeyLen+1), int64(-1), int64(-1))
	f.Add("m", "t", []byte(nil), uint8(1), int64(0), int64(1<<40), int64(0), uint64(0), uint64(0), "=v", int64(MaxTimeout)+1, 10, "", int64(MaxRetention)+1, int64(0)) // MaxAttempts past the decoder's limit
	f.Add("x", "t", []byte{}, uint8(1), int64(1<<31), int64(1<<31-1), int64(-1), uint64(1<<63), uint64(1<<64-1), "a=\nb=c=d\na=e", int64(MaxTimeout), 9, "{ü}", int64(MaxRetention), int64(-1<<62))
	f.Add("y", "t", []byte{}, uint8(3), int64(1), int64(2), int64(5), uint64(1), uint64(2), strings.Repeat("k=v\n", 70), int64(1500*time.Microsecond), 0, strings.Repeat("k", MaxConcurrencyKeyLen), int64(1500*time.Microsecond), int64(1<<62))
	f.Fuzz(func(t *testing.T, id, typ string, payload []byte, state uint8, attempt, maxAttempts, runAt int64, token, rev uint64, meta string, timeout int64, priority int, ck string, retention, deadline int64) {
		var m map[string]string
		if meta != "" {
			m = map[string]string{}
			for line := range strings.SplitSeq(meta, "\n") {
				k, v, _ := strings.Cut(line, "=")
				m[k] = v
			}
		}
		in := &Job{ID: id, Type: typ, Payload: payload, State: State(state), Attempt: int(attempt), MaxAttempts: int(maxAttempts),
			RunAt: fromMillis(runAt), LeaseUntil: fromMillis(runAt / 2), LeaseToken: token, Rev: rev, LastError: typ, Result: payload,
			Meta: m, Timeout: time.Duration(timeout), Priority: priority, ConcurrencyKey: ck,
			Retention: time.Duration(retention), Deadline: fromMillis(deadline)}
		b, err := Marshal(in)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("untyped error: %v", err)
			}
			return
		}
		require.Len(t, b, encodedSize(in))
		var out Job
		if err := Unmarshal(b, &out); err != nil {
			t.Fatalf("Marshal wrote what Unmarshal refuses: %v (job %+v)", err, in)
		}
		if len(in.Payload) == 0 {
			in.Payload, in.Result = nil, nil // an empty bin decodes to nil
		}
		if len(in.Meta) == 0 {
			in.Meta = nil // and an empty map too
		}
		require.Equal(t, *in, out)
	})
}

// A worker of this version claims, extends, fails, claims again, completes,
// and an operator updates a job that a newer minor version wrote: every
// write keeps the newer version's fields and its minor version.
func TestOlderWriterKeepsNewerFields(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	var golden Job
	require.NoError(t, Unmarshal(futureGolden(t), &golden))
	want := golden.future
	j := golden
	j.Queue, j.ID, j.RunAt = "q", "future", f.clock.Now()
	b, err := Marshal(&j)
	require.NoError(t, err)
	keys := f.q.Keys(j.ID)
	require.NoError(t, f.rdb.Set(f.ctx, keys.Job, b, 0).Err())
	require.NoError(t, f.rdb.ZAdd(f.ctx, keys.Ready, redis.Z{Score: float64(toMillis(j.RunAt)), Member: j.ID}).Err())

	kept := func(step string) {
		t.Helper()
		raw, err := f.rdb.Get(f.ctx, keys.Job).Bytes()
		require.NoError(t, err)
		var got Job
		require.NoError(t, Unmarshal(raw, &got), step)
		require.Equal(t, want, got.future, "%s kept the newer fields", step)
		require.EqualValues(t, 9, raw[4], "%s kept minor version 9", step) // after the array16 header and the major
	}
	kept("the setup")
	c, err := f.q.Claim(f.ctx, "old-worker")
	require.NoError(t, err)
	kept("Claim")
	c, err = f.q.Extend(f.ctx, c)
	require.NoError(t, err)
	kept("Extend")
	_, err = f.q.Fail(f.ctx, c, errors.New("once"))
	require.NoError(t, err)
	kept("Fail")
	_, err = f.q.Update(f.ctx, j.ID, func(j *Job) error { j.RunAt = f.clock.Now(); return nil })
	require.NoError(t, err)
	kept("Update")
	c, err = f.q.Claim(f.ctx, "old-worker")
	require.NoError(t, err)
	kept("Claim again")
	_, err = f.q.Complete(f.ctx, c, []byte("done"))
	require.NoError(t, err)
	kept("Complete")
}

// A job decoded from a Redis reply owns the reply's bytes instead of
// copying its byte fields (unmarshalReply). It must decode as Unmarshal
// does, re-encode byte for byte as a job Unmarshal decoded (a job read
// and written back loses nothing, fields of a newer minor included), and
// a caller that modifies its Payload or Result changes no other field.
func TestReplyDecodeRewritesByteForByte(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("testdata", "job-*.msgpack"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	values := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		values[filepath.Base(f)] = b
	}
	for name, j := range map[string]*Job{"full": fullJob(), "retention": fullJobRetention(), "history": fullJobHistory(), "batch": fullJobBatch(),
		"large": {ID: "big", State: StatePending, Payload: bytes.Repeat([]byte{0xab}, 70000), Result: []byte{1}}} {
		b, err := Marshal(j)
		require.NoError(t, err)
		values[name] = b
	}
	for name, b := range values {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var want, got Job
			require.NoError(t, Unmarshal(b, &want))
			reply := string(b) // a fresh buffer, as go-redis reads one
			require.NoError(t, unmarshalReply(reply, &got))
			require.Equal(t, want, got)
			wantBytes, err := Marshal(&want)
			require.NoError(t, err)
			gotBytes, err := Marshal(&got)
			require.NoError(t, err)
			require.Equal(t, wantBytes, gotBytes)
			if name == "job-v1.8.msgpack" || name == "job-future-minor.msgpack" {
				require.Equal(t, b, gotBytes, "a value of this build's format or newer is written back as it was read")
			}
			for i := range got.Payload {
				got.Payload[i] ^= 0xff
			}
			for i := range got.Result {
				got.Result[i] ^= 0xff
			}
			got.Payload, got.Result = want.Payload, want.Result
			require.Equal(t, want, got, "modifying the byte fields changed another field")
			require.Len(t, got.future.raw, len(want.future.raw))
		})
	}
}
