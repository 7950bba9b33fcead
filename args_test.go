package jobkey

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

type resize struct {
	Image string
	Sizes []int
	Blob  []byte
	Parts []part
}

type part struct{ A, B string }

func (resize) Kind() string { return "resize" }

func TestArgsRoundTrip(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	in := resize{Image: "cat.png", Sizes: []int{64, 128}, Blob: []byte{1, 2}, Parts: []part{{"a", "b"}}}
	j, err := EnqueueArgs(f.ctx, f.q, in, nil)
	require.NoError(t, err)
	require.Equal(t, "resize", j.Type)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	out, err := DecodeArgs[resize](c)
	require.NoError(t, err)
	require.Equal(t, in, out)

	var seen resize
	h := HandleArgs(func(ctx context.Context, j *Job, a resize) ([]byte, error) { seen = a; return []byte("ok"), nil })
	res, err := Mux{"resize": h}.Work(f.ctx, c)
	require.NoError(t, err)
	require.Equal(t, "ok", string(res))
	require.Equal(t, in, seen)

	_, err = Mux{}.Work(f.ctx, c)
	require.ErrorIs(t, err, ErrSkipRetry)
	require.ErrorContains(t, err, `no handler for job type "resize"`)
}

// Not parallel: it measures the process's allocations, which parallel
// tests would add to (it failed once so, in four full runs).
func TestDecodeArgsRefusesHostilePayloads(t *testing.T) {
	good, err := msgpack.Marshal(resize{Image: "x"})
	require.NoError(t, err)
	hostile := map[string][]byte{
		"bin32 of 4 GiB":   binary.BigEndian.AppendUint32([]byte{0x81, 0xa4, 'B', 'l', 'o', 'b', 0xc6}, 0xffffffff),
		"array32 of parts": binary.BigEndian.AppendUint32([]byte{0x81, 0xa5, 'P', 'a', 'r', 't', 's', 0xdd}, 0xffffffff),
		"trailing":         append(bytes.Clone(good), 0x01),
		"truncated":        good[:len(good)-1],
		"deep":             bytes.Repeat([]byte{0x91}, 200),
	}
	for name, p := range hostile {
		var err error
		n := allocated(func() { _, err = DecodeArgs[resize](&Job{ID: "h", Type: "resize", Payload: p}) })
		require.ErrorIs(t, err, ErrCorrupt, name)
		require.Less(t, n, uint64(1<<20), name)
	}
	_, err = DecodeArgs[resize](&Job{Type: "other"})
	require.ErrorContains(t, err, `not "resize"`)
	_, err = HandleArgs(func(context.Context, *Job, resize) ([]byte, error) { return nil, nil }).
		Work(context.Background(), &Job{Type: "resize", Payload: []byte{0xc1}})
	require.True(t, errors.Is(err, ErrSkipRetry) && errors.Is(err, ErrCorrupt))
}

// big is the element of the amplification attacks: one nil or empty-map
// byte of payload decodes into 12 KiB.
type big struct{ A [1536]int64 }

type bigSlice struct{ Items []big }

func (bigSlice) Kind() string { return "bigs" }

type bigPtrs []*big

func (bigPtrs) Kind() string { return "bigptrs" }

type bigMap map[string]big

func (bigMap) Kind() string { return "bigmap" }

// allocated reports the fewest bytes f allocated over a few runs: other
// tests run in parallel, and the least disturbed run is closest to f's own.
func allocated(f func()) uint64 {
	least := uint64(math.MaxUint64)
	for range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	return least
}

// array32 is an array32 header of n elements followed by each of them.
func array32(n int, each ...byte) []byte {
	p := binary.BigEndian.AppendUint32([]byte{0xdd}, uint32(n))
	for range n {
		p = append(p, each...)
	}
	return p
}

func TestDecodeArgsRefusesElementAmplification(t *testing.T) {
	// Not parallel: it measures the process's allocations, which other
	// tests running at the same time would add to.
	keys := binary.BigEndian.AppendUint32([]byte{0xdf}, 1<<14) // map32 of 16384 distinct 2-byte keys
	for i := range 1 << 14 {
		keys = append(keys, 0xa2, byte(i>>8), byte(i), 0xc0)
	}
	attacks := []struct {
		name    string
		typ     string
		payload []byte
		decode  func(*Job) error
	}{
		{"nils into []big", "bigs", append([]byte{0x81, 0xa5, 'I', 't', 'e', 'm', 's'}, array32(1<<16, 0xc0)...),
			func(j *Job) error { _, err := DecodeArgs[bigSlice](j); return err }},
		{"empty maps into []*big", "bigptrs", array32(1<<16, 0x80),
			func(j *Job) error { _, err := DecodeArgs[bigPtrs](j); return err }},
		{"nil values into map[string]big", "bigmap", keys,
			func(j *Job) error { _, err := DecodeArgs[bigMap](j); return err }},
	}
	for _, a := range attacks {
		require.LessOrEqual(t, len(a.payload), 64<<10+16, a.name)
		j := &Job{ID: "h", Type: a.typ, Payload: a.payload}
		var err error
		n := allocated(func() { err = a.decode(j) })
		t.Logf("%s: %d-byte payload allocated %d bytes: %v", a.name, len(a.payload), n, err)
		require.ErrorIs(t, err, ErrCorrupt, a.name)
		require.ErrorContains(t, err, "over the 67108864-byte budget", a.name)
		require.Less(t, n, uint64(1<<20), a.name)
	}
}

func TestDecodeArgsElementCost(t *testing.T) {
	t.Parallel()
	size := int(reflect.TypeFor[big]().Size())
	require.Equal(t, 12<<10, size)
	require.Equal(t, size, elemCost(reflect.TypeFor[bigSlice]()))
	require.Equal(t, 8+size, elemCost(reflect.TypeFor[bigPtrs]()))
	require.Equal(t, 16+size+mapEntryOverhead, elemCost(reflect.TypeFor[bigMap]()))
	require.Equal(t, minElemCost, elemCost(reflect.TypeFor[[]int8]()))
	// any decodes to map[string]any: a 16-byte key, a 16-byte value, and
	// the value's own map header.
	require.Equal(t, 32+mapEntryOverhead+mapHeaderCost, elemCost(reflect.TypeFor[[]any]()))
	require.Equal(t, elemCost(reflect.TypeFor[bigSlice]()), elemCost(reflect.TypeFor[bigSlice]()), "cached")
}

type point struct {
	X, Y int
	Name string
}

type points struct{ P []point }

func (points) Kind() string { return "points" }

type int64s []int64

func (int64s) Kind() string { return "int64s" }

type nested map[string]map[string][]int

func (nested) Kind() string { return "nested" }

type anyArgs struct{ V any }

func (anyArgs) Kind() string { return "any" }

func roundTrip[T Args](t *testing.T, in T) {
	t.Helper()
	p, err := msgpack.Marshal(in)
	require.NoError(t, err)
	out, err := DecodeArgs[T](&Job{ID: "ok", Type: in.Kind(), Payload: p})
	require.NoError(t, err)
	require.Equal(t, in, out)
}

func TestDecodeArgsAcceptsLegitimatePayloads(t *testing.T) {
	t.Parallel()
	var ps points
	for i := range 5000 {
		ps.P = append(ps.P, point{i, -i, fmt.Sprint("p", i)})
	}
	roundTrip(t, ps)

	ints := make(int64s, 100_000)
	for i := range ints {
		ints[i] = int64(i) << 20
	}
	roundTrip(t, ints)

	roundTrip(t, nested{"a": {"x": {1, 2, 3}, "y": nil}, "b": {}})

	many := make([]any, 20_000)
	for i := range many {
		many[i] = map[string]any{"name": fmt.Sprint(i), "tags": []any{"a", "b"}, "ok": i%2 == 0}
	}
	roundTrip(t, anyArgs{V: map[string]any{"items": many, "s": "x"}})

	// A large element type still decodes a few whole elements; the budget
	// only limits how many.
	roundTrip(t, bigSlice{Items: []big{{}, {A: [1536]int64{1, 2, 3}}}})
}

type node struct {
	Name     string
	Children []*node
	Parent   *node `msgpack:"-"`
	Index    map[string]*node
	Extra    any
}

func (*node) Kind() string { return "node" }

type selfPtr *selfPtr

func TestDecodeArgsRecursiveTypes(t *testing.T) {
	t.Parallel()
	// The dearest element is an Index entry: key, pointer, overhead, node.
	require.Equal(t, 16+8+mapEntryOverhead+int(reflect.TypeFor[node]().Size()), elemCost(reflect.TypeFor[*node]()))
	require.Positive(t, elemCost(reflect.TypeFor[struct{ P []selfPtr }]()))

	leaf := &node{Name: "leaf"}
	in := &node{Name: "root", Children: []*node{leaf, {Name: "mid", Children: []*node{{Name: "deep"}}}},
		Index: map[string]*node{"leaf": leaf}, Extra: "x"}
	p, err := msgpack.Marshal(in)
	require.NoError(t, err)
	out, err := DecodeArgs[*node](&Job{Type: "node", Payload: p})
	require.NoError(t, err)
	require.Equal(t, in, out)
}

// imageV1 and imageV2 are one job type's arguments in two deploys: Size
// was an int, and became a string.
type imageV1 struct {
	Image string
	Size  int
}

func (imageV1) Kind() string { return "image" }

type imageV2 struct {
	Image string
	Size  string
}

func (imageV2) Kind() string { return "image" }

// Well-formed arguments that do not decode into the handler's type are an
// *ArgsError naming the job type, the Go type and the field, not a corrupt
// value, and the message says "jobkey: " once.
func TestDecodeArgsNamesTheFieldThatDoesNotDecode(t *testing.T) {
	t.Parallel()
	payload, err := msgpack.Marshal(imageV1{Image: "cat.png", Size: 64})
	require.NoError(t, err)
	_, err = DecodeArgs[imageV2](&Job{ID: "x", Type: "image", Payload: payload})
	var ae *ArgsError
	require.ErrorAs(t, err, &ae)
	require.ErrorIs(t, err, ErrArgs)
	require.NotErrorIs(t, err, ErrCorrupt, "the value is well-formed")
	require.Equal(t, "x", ae.ID)
	require.Equal(t, "image", ae.Kind)
	require.Equal(t, "jobkey.imageV2", ae.Type)
	require.Equal(t, "Size", ae.Field)
	require.ErrorContains(t, err, `field "Size"`)
	require.Equal(t, 1, strings.Count(err.Error(), "jobkey: "), err.Error())

	// A handler of the older deploy decodes it.
	v1, err := DecodeArgs[imageV1](&Job{ID: "x", Type: "image", Payload: payload})
	require.NoError(t, err)
	require.Equal(t, 64, v1.Size)

	// Bytes that are not msgpack at all stay corrupt and fail for good, and
	// say "jobkey: " once too.
	_, err = HandleArgs(func(context.Context, *Job, resize) ([]byte, error) { return nil, nil }).
		Work(context.Background(), &Job{ID: "h", Type: "resize", Payload: []byte{0xc1}})
	require.True(t, errors.Is(err, ErrSkipRetry) && errors.Is(err, ErrCorrupt))
	require.Equal(t, 1, strings.Count(err.Error(), "jobkey: "), err.Error())
}

// A job whose arguments a worker cannot decode, as in a rolling deploy
// that changed a field's type, is retried under backoff with its payload
// untouched, and a worker that decodes it runs it.
func TestArgsThatDoNotDecodeAreRetried(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Backoff: func(int) time.Duration { return 50 * time.Millisecond }})
	ctx := context.Background()
	j, err := EnqueueArgs(ctx, q, imageV1{Image: "cat.png", Size: 64}, &EnqueueOpts{ID: "img"})
	require.NoError(t, err)
	payload := bytes.Clone(j.Payload)

	// The newer deploy cannot decode it.
	recorded := make(chan *Job, 1)
	newer, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- q.Work(newer, Mux{"image": HandleArgs(func(context.Context, *Job, imageV2) ([]byte, error) {
			return nil, errors.New("ran with arguments it could not decode")
		})}, &WorkOpts{Concurrency: 1, PollInterval: 10 * time.Millisecond, Logger: quietLog(),
			OnRecorded: func(j *Job, err error) {
				if err == nil {
					select {
					case recorded <- j:
					default:
					}
				}
			}})
	}()
	var failed *Job
	select {
	case failed = <-recorded:
	case <-time.After(10 * time.Second):
		t.Fatal("no outcome recorded")
	}
	stop()
	require.NoError(t, <-done)
	require.Equal(t, StatePending, failed.State, "retried under backoff, not failed for good: %s", failed.LastError)
	require.Equal(t, 1, failed.Attempt)
	require.Contains(t, failed.LastError, `field "Size"`)
	require.NotContains(t, failed.LastError, "corrupt")
	require.Equal(t, 1, strings.Count(failed.LastError, "jobkey: "), failed.LastError)
	stored, err := q.Get(ctx, "img")
	require.NoError(t, err)
	require.Equal(t, payload, stored.Payload, "the payload is untouched")

	// The older deploy runs it.
	ran := make(chan imageV1, 1)
	older, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		done <- q.Work(older, Mux{"image": HandleArgs(func(_ context.Context, _ *Job, a imageV1) ([]byte, error) {
			ran <- a
			return nil, nil
		})}, &WorkOpts{Concurrency: 1, PollInterval: 10 * time.Millisecond, Logger: quietLog()})
	}()
	select {
	case a := <-ran:
		require.Equal(t, imageV1{Image: "cat.png", Size: 64}, a)
	case <-time.After(10 * time.Second):
		t.Fatal("the older deploy never ran it")
	}
	stop()
	require.NoError(t, <-done)
}

// A typed batch is one EnqueueMany: every job of its Kind, each payload
// the msgpack of its arguments, decoded back by DecodeArgs; a taken ID is
// told per job, as EnqueueMany tells it.
func TestEnqueueArgsManyEnqueuesEachJobAsEnqueueArgsWould(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	batch := []ArgsSpec[resize]{
		{Args: resize{Image: "a.png", Sizes: []int{1}}},
		{Args: resize{Image: "b.png"}, Opts: &EnqueueOpts{ID: "b", Priority: 3}},
	}
	jobs, err := EnqueueArgsMany(f.ctx, f.q, batch)
	require.NoError(t, err)
	require.Len(t, jobs, 2)
	for i, j := range jobs {
		require.Equal(t, "resize", j.Type)
		got, err := f.q.Get(f.ctx, j.ID)
		require.NoError(t, err)
		args, err := DecodeArgs[resize](got)
		require.NoError(t, err)
		require.Equal(t, batch[i].Args, args)
	}
	require.Equal(t, "b", jobs[1].ID)
	require.Equal(t, 3, jobs[1].Priority)

	again, err := EnqueueArgsMany(f.ctx, f.q, []ArgsSpec[resize]{{Args: resize{Image: "c.png"}}, {Args: resize{Image: "b2.png"}, Opts: &EnqueueOpts{ID: "b"}}})
	var be *BatchError
	require.ErrorAs(t, err, &be)
	require.NoError(t, be.Errs[0])
	require.ErrorIs(t, be.Errs[1], ErrJobExists)
	require.Equal(t, "b", again[1].ID, "the stored job, as EnqueueMany returns it")

	_, err = EnqueueArgsMany(f.ctx, f.q, []ArgsSpec[badArgs]{{Args: badArgs{}}})
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, "job 0")
}

// badArgs cannot be encoded: msgpack refuses a channel.
type badArgs struct{ C chan int }

func (badArgs) Kind() string { return "bad" }
