package jobkey

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// Args are typed job arguments. Kind names the job type; it becomes
// Job.Type and routes the job to its handler. With Args a team moves one
// job type at a time into a jobkey queue while the other types stay in the
// queue they already run.
type Args interface {
	Kind() string
}

// maxArgsDepth bounds the nesting of decoded arguments.
const maxArgsDepth = 64

// EnqueueArgs enqueues args as a job of type args.Kind(), its payload the
// msgpack encoding of args. With opts.UniqueBy, its ID is UniqueArgsID's:
// derived from the canonical encoding of the chosen fields of args.
func EnqueueArgs[T Args](ctx context.Context, q *Queue, args T, opts *EnqueueOpts) (*Job, error) {
	payload, err := msgpack.Marshal(args)
	if err != nil {
		return nil, fmt.Errorf("jobkey: encode %s args: %w", args.Kind(), err)
	}
	return q.enqueue(ctx, JobSpec{Type: args.Kind(), Payload: payload, Opts: opts, typed: true})
}

// ArgsSpec is one job of an EnqueueArgsMany batch: its arguments and its
// per-job options (nil: all defaults).
type ArgsSpec[T Args] struct {
	Args T
	Opts *EnqueueOpts
}

// EnqueueArgsMany enqueues a batch of typed jobs, as EnqueueMany does for
// bytes: each of type Args.Kind(), its payload the msgpack encoding of its
// Args, in two round trips per transaction of at most Config.MaxBatch jobs
// (one per shard on a cluster). Arguments that do not encode refuse the
// whole batch before anything is written, with an error that names the
// job's position; jobs[i] and a *BatchError say what became of each job as
// EnqueueMany's do.
func EnqueueArgsMany[T Args](ctx context.Context, q *Queue, batch []ArgsSpec[T]) ([]*Job, error) {
	specs := make([]JobSpec, len(batch))
	for i, b := range batch {
		payload, err := msgpack.Marshal(b.Args)
		if err != nil {
			return nil, fmt.Errorf("%w: job %d: encode %s args: %w", ErrInvalid, i, b.Args.Kind(), err)
		}
		specs[i] = JobSpec{Type: b.Args.Kind(), Payload: payload, Opts: b.Opts, typed: true}
	}
	return q.EnqueueMany(ctx, specs)
}

// DecodeArgs decodes a job's payload into T. It refuses a job of another
// type, and payloads that are not one well-formed msgpack value whose every
// length fits in the bytes present (ErrCorrupt), before the reflective
// decoder sees them: a hostile length header cannot make it allocate
// gigabytes. Nor can a payload of many tiny elements that each decode into
// something large: it refuses a payload whose array elements and map
// entries, counted and each charged the most one element of T can
// allocate, would exceed 64 MiB, so a T with a large element type accepts
// proportionally fewer elements. The estimate cannot see inside types that
// decode themselves (implementing msgpack.CustomDecoder or
// msgpack.Unmarshaler); their allocations are their own to bound.
//
// A well-formed payload that does not decode into T, such as a field whose
// type changed between deploys, is an *ArgsError that names the field.
func DecodeArgs[T Args](j *Job) (T, error) {
	var args T
	if j == nil {
		return args, fmt.Errorf("jobkey: decode args of nil job")
	}
	if j.Type != args.Kind() {
		return args, fmt.Errorf("jobkey: job %q is of type %q, not %q", j.ID, j.Type, args.Kind())
	}
	// The checks name the payload as the field of the job value they are in.
	where := fmt.Sprintf("args of %s job %q", args.Kind(), j.ID)
	d := newDecoder(j.Payload, false)
	if err := d.SkipDepth(where, 0, maxArgsDepth); err != nil {
		return args, err
	}
	if d.Off != len(d.B) {
		return args, corruptAt(d.Off, where, fmt.Sprintf("%d trailing bytes", len(d.B)-d.Off))
	}
	if cost := elemCost(reflect.TypeFor[T]()); d.Elems > argsDecodeBudget/cost {
		return args, corruptAt(0, where, fmt.Sprintf("%d elements at up to %d bytes each could make the decoder allocate %d bytes, over the %d-byte budget",
			d.Elems, cost, d.Elems*cost, argsDecodeBudget))
	}
	if err := msgpack.Unmarshal(j.Payload, &args); err != nil {
		return args, &ArgsError{ID: j.ID, Kind: args.Kind(), Type: reflect.TypeFor[T]().String(),
			Field: argsField[T](j.Payload), Err: err}
	}
	return args, nil
}

// argsField names the entry of a payload, a msgpack map with string keys
// already checked well-formed and within the decode budget, that does not
// decode into T on its own; "" when the payload is not such a map or no
// entry fails alone. Each entry is decoded once, so this costs about one
// more decode of the payload, and only when decoding it failed.
func argsField[T Args](payload []byte) string {
	d := msgpack.NewDecoder(bytes.NewReader(payload))
	n, err := d.DecodeMapLen()
	if err != nil {
		return ""
	}
	for range n {
		key, err := d.DecodeString()
		if err != nil {
			return ""
		}
		raw, err := d.DecodeRaw()
		if err != nil {
			return ""
		}
		k, err := msgpack.Marshal(key)
		if err != nil {
			return ""
		}
		var probe T
		if msgpack.Unmarshal(slices.Concat([]byte{0x81}, k, raw), &probe) != nil { // fixmap of one entry
			return key
		}
	}
	return ""
}

// HandleArgs makes a Handler from a function of typed arguments. Arguments
// that do not decode into T (an *ArgsError) fail the attempt, retried under
// Config.Backoff: during a rolling deploy, a worker of the other deploy may
// decode them. A payload that is not well-formed msgpack fails the job for
// good (ErrSkipRetry): retrying cannot fix it.
func HandleArgs[T Args](fn func(ctx context.Context, j *Job, args T) ([]byte, error)) Handler {
	return HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		args, err := DecodeArgs[T](j)
		var ae *ArgsError
		switch {
		case errors.As(err, &ae):
			return nil, err
		case err != nil:
			return nil, skipRetry(err)
		}
		return fn(ctx, j, args)
	})
}

// Mux routes jobs to handlers by Job.Type. A job of a type with no handler
// fails for good with an error naming the type.
type Mux map[string]Handler

// Work runs the handler registered for j.Type.
func (m Mux) Work(ctx context.Context, j *Job) ([]byte, error) {
	h, ok := m[j.Type]
	if !ok {
		return nil, fmt.Errorf("%w: no handler for job type %q", ErrSkipRetry, j.Type)
	}
	return h.Work(ctx, j)
}

// argsDecodeBudget caps what DecodeArgs lets msgpack's reflective decoder
// allocate for one payload, estimated as its element count times elemCost.
// The length checks bound bytes, not what they become: a one-byte nil in a
// []Big is a whole Big, so without this a 1 MiB payload could ask for
// gigabytes. 64 MiB holds a payload at the default 1 MiB limit decoded into
// any, []any, map[string]any or types of small elements. The estimate counts
// each element once; the decoder's transient copies (it builds a slice and
// then appends it, and decodes a map value before storing a copy of it) made
// the real figure 3 times the estimate for the []Big and map[string]Big
// attacks, so the worst payload costs a few hundred MiB, not gigabytes.
const argsDecodeBudget = 64 << 20

const (
	// minElemCost is charged even for an element that allocates nothing of
	// its own, such as a struct field decoded in place, so that no element
	// counts as free.
	minElemCost = 16
	// mapEntryOverhead is what a map entry costs beyond its key and value: a
	// control byte, and the free slots a table keeps below its 7/8 load
	// factor. 16 bytes covers both for word-sized entries; the slack of
	// larger ones is left to the budget's margin.
	mapEntryOverhead = 16
	// mapHeaderCost is the runtime's map header (internal/runtime/maps.Map,
	// 48 bytes on 64-bit), allocated for every decoded map, even an empty
	// one. A value decoded into an interface allocates no more: an empty
	// map[string]any, or a box of at most a time.Time (24 bytes), or a
	// string header (16) whose bytes the payload's length bounds.
	mapHeaderCost = 48
)

var (
	elemCosts    sync.Map // reflect.Type → int
	anyMapType   = reflect.TypeFor[map[string]any]()
	anySliceType = reflect.TypeFor[[]any]()
)

// elemCost estimates the most one array element or map entry of a payload
// can make msgpack allocate when decoding into t: the largest, over every type
// reachable from t, of an element's slot in its slice or map plus what
// decoding its value allocates. String and bin bytes are not counted: the
// payload's length bounds them.
func elemCost(t reflect.Type) int {
	if c, ok := elemCosts.Load(t); ok {
		return c.(int)
	}
	w := costWalk{seen: map[reflect.Type]bool{}, max: minElemCost}
	w.walk(t)
	c := min(w.max, argsDecodeBudget)
	elemCosts.Store(t, c)
	return c
}

type costWalk struct {
	seen map[reflect.Type]bool // recursive types are walked once
	max  int
}

// elem charges one element whose slot costs slot bytes and whose value
// decodes into t.
func (w *costWalk) elem(slot int, t reflect.Type) {
	w.max = max(w.max, slot+valueCost(t))
	w.walk(t)
}

func (w *costWalk) walk(t reflect.Type) {
	if w.seen[t] {
		return
	}
	w.seen[t] = true
	switch t.Kind() {
	case reflect.Pointer:
		w.walk(t.Elem())
	case reflect.Slice:
		w.elem(sizeOf(t.Elem()), t.Elem())
	case reflect.Array: // elements decode in place
		w.elem(0, t.Elem())
	case reflect.Map:
		w.elem(sizeOf(t.Key())+sizeOf(t.Elem())+mapEntryOverhead+valueCost(t.Key()), t.Elem())
		w.walk(t.Key())
	case reflect.Struct: // each field is an element of the encoded map or array
		for i := range t.NumField() {
			w.elem(0, t.Field(i).Type)
		}
	case reflect.Interface:
		w.walk(anyMapType)
		w.walk(anySliceType)
	}
}

// valueCost is what decoding one value into t allocates beyond t's own
// slot: the targets of a chain of pointers, then a map's header or an
// interface's dynamic value. Its elements are charged on their own.
func valueCost(t reflect.Type) int {
	c := 0
	// A pointer type can point to itself; a chain deeper than any payload
	// can nest is charged as if it ended there.
	for i := 0; t.Kind() == reflect.Pointer && i <= maxArgsDepth; i++ {
		t = t.Elem()
		c += sizeOf(t)
	}
	switch t.Kind() {
	case reflect.Map, reflect.Interface:
		c += mapHeaderCost
	}
	return min(c, argsDecodeBudget)
}

// sizeOf is t.Size() capped at the budget, so that sums of sizes cannot
// overflow.
func sizeOf(t reflect.Type) int { return int(min(t.Size(), argsDecodeBudget)) }
