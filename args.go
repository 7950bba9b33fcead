package jobkey

import (
	"context"
	"fmt"

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
// msgpack encoding of args.
func EnqueueArgs[T Args](ctx context.Context, q *Queue, args T, opts *EnqueueOpts) (*Job, error) {
	payload, err := msgpack.Marshal(args)
	if err != nil {
		return nil, fmt.Errorf("jobkey: encode %s args: %w", args.Kind(), err)
	}
	return q.Enqueue(ctx, args.Kind(), payload, opts)
}

// DecodeArgs decodes a job's payload into T. It refuses a job of another
// type, and payloads that are not one well-formed msgpack value whose every
// length fits in the bytes present, before the reflective decoder sees
// them: a hostile length header cannot make it allocate gigabytes.
func DecodeArgs[T Args](j *Job) (T, error) {
	var args T
	if j == nil {
		return args, fmt.Errorf("jobkey: decode args of nil job")
	}
	if j.Type != args.Kind() {
		return args, fmt.Errorf("jobkey: job %q is of type %q, not %q", j.ID, j.Type, args.Kind())
	}
	d := decoder{b: j.Payload}
	if err := d.skipDepth("args", 0, maxArgsDepth); err != nil {
		return args, fmt.Errorf("jobkey: %s args of job %q: %w", args.Kind(), j.ID, err)
	}
	if d.off != len(d.b) {
		return args, fmt.Errorf("jobkey: %s args of job %q: %w", args.Kind(), j.ID,
			corruptAt(d.off, "args", fmt.Sprintf("%d trailing bytes", len(d.b)-d.off)))
	}
	if err := msgpack.Unmarshal(j.Payload, &args); err != nil {
		return args, fmt.Errorf("jobkey: %w: %s args of job %q: %v", ErrCorrupt, args.Kind(), j.ID, err)
	}
	return args, nil
}

// HandleArgs makes a Handler from a function of typed arguments. A payload
// that does not decode fails the job for good (ErrSkipRetry): retrying
// cannot fix it.
func HandleArgs[T Args](fn func(ctx context.Context, j *Job, args T) ([]byte, error)) Handler {
	return HandlerFunc(func(ctx context.Context, j *Job) ([]byte, error) {
		args, err := DecodeArgs[T](j)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSkipRetry, err)
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
