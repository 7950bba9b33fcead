package jobkey

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

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

func TestCodecRoundTrip(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte{0xab}, 300<<10) // forces bin32
	long := strings.Repeat("é", 40000)         // forces str32 (80,000 bytes)
	cases := map[string]*Job{
		"minimal":      {State: StatePending},
		"full":         fullJob(),
		"unicode":      {ID: "ジョブ-🚀", Queue: "κουέ", Type: "тип", LastError: "ошибка: 失败", State: StateFailed},
		"zeroTime":     {ID: "z", State: StateSucceeded, RunAt: time.Time{}, CreatedAt: time.Time{}},
		"negTime":      {ID: "n", State: StatePending, RunAt: ms(time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC))},
		"largePayload": {ID: "big", State: StatePending, Payload: big, Result: big[:70000]},
		"longStrings":  {ID: long[:300], Type: long[:1000], LastError: long, State: StateCanceled},
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
	b, err := Marshal(&Job{State: StatePending, Payload: []byte{}})
	require.NoError(t, err)
	var out Job
	require.NoError(t, Unmarshal(b, &out))
	require.Nil(t, out.Payload)
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
	} {
		_, err = Marshal(j)
		require.ErrorIs(t, err, ErrInvalid, "%+v", j)
	}
}

// The golden files are the wire formats this build has written. They are
// checked in and must decode to the same Job forever: a v1.0 value (from
// before LeaseToken) still decodes, with a zero token.
func TestCodecGoldenV1(t *testing.T) {
	t.Parallel()
	old, err := os.ReadFile(filepath.Join("testdata", "job-v1.0.msgpack"))
	require.NoError(t, err)
	var got Job
	require.NoError(t, Unmarshal(old, &got))
	want := fullJob()
	want.LeaseToken = 0
	require.Equal(t, *want, got)

	path := filepath.Join("testdata", "job-v1.1.msgpack")
	if *updateGolden {
		b, err := Marshal(fullJob())
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, b, 0o644))
	}
	golden, err := os.ReadFile(path)
	require.NoError(t, err)
	got = Job{}
	require.NoError(t, Unmarshal(golden, &got))
	require.Equal(t, *fullJob(), got)
	// The current encoder writes v1.1 byte for byte.
	b, err := Marshal(fullJob())
	require.NoError(t, err)
	require.Equal(t, golden, b)
	require.Len(t, old, len(b)-9, "1.1 appends one element to 1.0: the token, a uint64")
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
	out := appendArrayHdr(nil, knownFields+len(extra))
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
	b := appendFields(t, in, 3, "a new string field", int64(-5), map[string]any{"k": []any{1, "x", nil, 2.5}},
		[]byte{1, 2, 3}, true, nil, float32(1.5), time.Now())
	var out Job
	require.NoError(t, Unmarshal(b, &out))
	require.Equal(t, 8, out.future.n)
	require.EqualValues(t, 3, out.future.minor)
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

// futureGolden is a value as a future 1.3 writes it: the 1.1 fields, then
// two fields this build does not know. Checked in, it must keep its bytes
// through every transition an older worker makes.
func futureGolden(t *testing.T) []byte {
	t.Helper()
	path := filepath.Join("testdata", "job-v1.3-future.msgpack")
	if *updateGolden {
		j := fullJob()
		j.State, j.Attempt, j.LeaseOwner, j.LeaseUntil, j.LeaseToken = StatePending, 0, "", time.Time{}, 0
		b := appendFields(t, j, 3, "priority-class: gold", map[string]any{"trace": "00-4bf92f3577b34da6-01"})
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
		"empty":            {nil, "value"},
		"notArray":         {[]byte{0xa1, 'x'}, "value"},
		"noVersion":        {[]byte{0x91, 0x01}, "value"},
		"tooFewFields":     {[]byte{0x92, 0x01, 0x00}, "value"},
		"trailing":         {append(bytes.Clone(good), 0x00), "value"},
		"truncated":        {good[:len(good)-12], "UpdatedAt"},
		"truncatedToken":   {good[:len(good)-3], "LeaseToken"},
		"idNotString":      {set(5, 0x05), "ID"},
		"badState":         {stateAt(t, good, 9), "State"},
		"versionString":    {[]byte{0x92, 0xa1, 'x', 0x00}, "format major version"},
		"negativeAttempt":  {replaceField(t, 7, int64(-1)), "Attempt"},
		"badAppendedField": {badAppended(t), "appended field 18"},
		"badToken":         {replaceField(t, 17, "not a number"), "LeaseToken"},
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
	j := fullJob()
	elems := []any{uint64(1), uint64(0), j.ID, j.Queue, j.Type, j.Payload, uint64(j.State), j.Attempt, j.MaxAttempts,
		toMillis(j.RunAt), j.LeaseOwner, toMillis(j.LeaseUntil), j.LastError, j.Result,
		toMillis(j.CreatedAt), toMillis(j.UpdatedAt), j.Rev, j.LeaseToken}
	elems[i] = v
	b, err := msgpack.Marshal(elems)
	require.NoError(t, err)
	return b
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
		"appendedMap32": func() []byte {
			b := appendFields(t, &Job{State: StatePending}, 1, "x")
			return binary.BigEndian.AppendUint32(append(b[:len(b)-2], 0xdf), 0x7fffffff)
		}(),
	}
	for name, in := range hostile {
		var out Job
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		err := Unmarshal(in, &out)
		runtime.ReadMemStats(&after)
		require.ErrorIs(t, err, ErrCorrupt, name)
		require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "%s allocated too much", name)
	}
}

func FuzzUnmarshal(f *testing.F) {
	for _, j := range []*Job{fullJob(), {State: StatePending}, {ID: "ü", State: StateFailed, Payload: make([]byte, 300)}} {
		b, err := Marshal(j)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var j, fromString Job
		err := Unmarshal(data, &j)
		serr := unmarshalString(string(data), &fromString)
		if (err == nil) != (serr == nil) {
			t.Fatalf("Unmarshal: %v, unmarshalString: %v", err, serr)
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnsupportedFormat) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("untyped error: %v", err)
			}
			return
		}
		require.Equal(t, j, fromString)
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
func FuzzMarshal(f *testing.F) {
	j := fullJob()
	f.Add(j.ID, j.Type, j.Payload, uint8(j.State), int64(j.Attempt), int64(j.MaxAttempts), toMillis(j.RunAt), j.LeaseToken, j.Rev)
	f.Add("", "", []byte(nil), uint8(0), int64(-1), int64(1<<40), int64(0), uint64(0), uint64(0))
	f.Add("m", "t", []byte(nil), uint8(1), int64(0), int64(1<<40), int64(0), uint64(0), uint64(0)) // MaxAttempts past the decoder's limit
	f.Add("x", "t", []byte{}, uint8(1), int64(1<<31), int64(1<<31-1), int64(-1), uint64(1<<63), uint64(1<<64-1))
	f.Fuzz(func(t *testing.T, id, typ string, payload []byte, state uint8, attempt, maxAttempts, runAt int64, token, rev uint64) {
		in := &Job{ID: id, Type: typ, Payload: payload, State: State(state), Attempt: int(attempt), MaxAttempts: int(maxAttempts),
			RunAt: fromMillis(runAt), LeaseUntil: fromMillis(runAt / 2), LeaseToken: token, Rev: rev, LastError: typ, Result: payload}
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
		require.Equal(t, *in, out)
	})
}

func TestCRC16MatchesRedis(t *testing.T) {
	t.Parallel()
	// Reference values from the Redis Cluster specification and CLUSTER KEYSLOT.
	require.EqualValues(t, 0x31C3, crc16("123456789"))
	require.Equal(t, 12182, int(crc16("foo"))%clusterSlots)
	require.Equal(t, 5061, int(crc16("bar"))%clusterSlots)
}

func TestShardTagsSpreadOverTheSlotRange(t *testing.T) {
	t.Parallel()
	for _, n := range []int{2, 3, 16, 100, 1024} {
		part := clusterSlots / n
		for i := range n {
			slot := int(crc16(shardTag("emails", i, n))) % clusterSlots
			require.GreaterOrEqual(t, slot, i*clusterSlots/n+part/4, "n=%d i=%d", n, i)
			require.Less(t, slot, i*clusterSlots/n+part/4+max(1, part/2), "n=%d i=%d", n, i)
		}
	}
	require.Equal(t, "emails/0", shardTag("emails", 0, 1))
}

// A worker of this version claims, extends, fails, claims again, completes,
// and an operator updates a job that a newer minor version wrote: every
// write keeps the newer version's fields and its minor version (issue 10,
// item 1).
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
		require.EqualValues(t, 3, raw[4], "%s kept minor version 3", step) // after the array16 header and the major
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
