package asynqcompat

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"time"
	"unsafe"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
)

// Route sends the tasks of one type, or of the types Match accepts, to a
// jobkey queue. Types no route takes go to asynq.
type Route struct {
	// Type is the task type routed, matched exactly. Ignored when Match is
	// set.
	Type string
	// Match, when set, decides instead of Type: it is called with each
	// task's type.
	Match func(typ string) bool
	// To is the jobkey queue the tasks go to. A nil To routes the tasks to
	// asynq (useful before a broader Match).
	To *jobkey.Queue
	// Queues maps the asynq queue names that call sites pass with
	// asynq.Queue(name) to the jobkey queue the route's tasks then go to.
	// "default", asynq's queue when none is given, goes to To unless
	// Queues names it.
	Queues map[string]*jobkey.Queue
}

func (r Route) matches(typ string) bool {
	if r.Match != nil {
		return r.Match(typ)
	}
	return r.Type == typ
}

// Client enqueues each task to jobkey or to asynq by its type, with the
// methods and the options of asynq.Client, so call sites keep their code
// and change one import. The first Route that matches a task's type wins;
// a type no route matches goes to the asynq client.
//
// For tasks routed to jobkey, asynq's options map as follows:
//
//   - ProcessAt(t) → EnqueueOpts.RunAt, ProcessIn(d) → EnqueueOpts.Delay
//     (the last of them wins, as in asynq);
//   - TaskID(id) → EnqueueOpts.ID; a taken ID is an error matching both
//     asynq.ErrTaskIDConflict and jobkey.ErrJobExists;
//   - MaxRetry(n) → EnqueueOpts.MaxAttempts n+1 (asynq counts retries after
//     the first run); without it MaxAttempts is DefaultMaxRetry+1, 26, as
//     asynq retries 25 times (the jobkey queue's Config.MaxAttempts does not
//     apply to routed tasks);
//   - Queue(name) picks the jobkey queue the route's Queues maps name to;
//     else "default" (asynq's queue when none is given) picks the route's
//     To; else name must be the name of a jobkey queue of the routes or
//     given to NewClient, which it then picks; any other name is refused;
//   - Timeout(d) → EnqueueOpts.Timeout d, kept to the millisecond (asynq
//     truncates it to whole seconds): Work ends each run's context after d
//     and the attempt fails and is retried, as in asynq. Timeout(0) is no
//     Timeout, as in asynq; a negative d, which asynq would take as a
//     deadline already past, and a d over jobkey.MaxTimeout (7 days) are
//     refused. Without a Timeout the job has none of its own and
//     WorkOpts.Timeout applies; asynq applies 30 minutes instead, so set
//     WorkOpts.Timeout to 30*time.Minute to keep that;
//   - Deadline(t) → EnqueueOpts.Deadline t, kept to the millisecond
//     (asynq truncates it to whole seconds): Work ends each run's context
//     at t, or at its Timeout if sooner, and the attempt fails and is
//     retried; a job claimed after t fails its attempt without running,
//     as in asynq. A zero t is none, as in asynq; a t before 1970 or after
//     9999 is refused. With a Deadline and no Timeout, asynq applies no
//     default timeout, and neither does the job;
//   - Retention(d) → EnqueueOpts.Retention d: the job is kept d after it
//     succeeds (or is canceled) instead of the queue's Config.Retention.
//     Under a second, which asynq truncates to 0 and keeps not at all, the
//     job is kept 1s, the least jobkey keeps; a d over jobkey.MaxRetention
//     is refused. A failed job keeps Config.FailedRetention, as asynq
//     keeps an archived task whatever its Retention.
//
// Unique, Group and any option this package does not know have no
// equivalent in jobkey: the enqueue is refused with an *OptionError, never
// carried out without them. A task with headers is refused too (jobkey
// jobs have none).
// Options given to asynq.NewTask count as asynq counts them: before those
// given to Enqueue.
//
// asynq's priorities are per queue (the server's Config.Queues weights and
// StrictPriority), not per task, and are not mapped. jobkey orders jobs by
// a per-job EnqueueOpts.Priority (0..9, higher first); a producer that
// wants it enqueues with the route's jobkey.Queue directly.
//
// Client is safe for concurrent use.
type Client struct {
	asynq  *asynq.Client
	routes []Route
	queues map[string]*jobkey.Queue
}

// NewClient returns a Client that enqueues the types routes names to
// jobkey and every other type to ac. ac may be nil when every type is
// routed to jobkey; an unrouted task is then refused. extra lists further
// jobkey queues that asynq.Queue(name) may pick, besides the routes' own.
func NewClient(ac *asynq.Client, routes []Route, extra ...*jobkey.Queue) *Client {
	c := &Client{asynq: ac, routes: append([]Route(nil), routes...), queues: map[string]*jobkey.Queue{}}
	for i, r := range c.routes {
		c.routes[i].Queues = maps.Clone(r.Queues) // the caller's map may change later
		if r.To != nil {
			c.queues[r.To.Name()] = r.To
		}
	}
	for _, q := range extra {
		if q != nil {
			c.queues[q.Name()] = q
		}
	}
	return c
}

// Route returns the jobkey queue that tasks of type typ go to, or nil when
// they go to asynq.
func (c *Client) Route(typ string) *jobkey.Queue {
	return c.route(typ).To
}

func (c *Client) route(typ string) Route {
	for _, r := range c.routes {
		if r.matches(typ) {
			return r
		}
	}
	return Route{}
}

// Enqueue enqueues task as EnqueueContext does, with context.Background.
func (c *Client) Enqueue(task *asynq.Task, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	return c.EnqueueContext(context.Background(), task, opts...)
}

// EnqueueContext enqueues task to the jobkey queue its type is routed to,
// or else to asynq, as asynq.Client.EnqueueContext does. A routed task
// keeps the asynq queue name it was enqueued to ("default" without
// asynq.Queue) in Meta[MetaQueue]. For a task routed to jobkey it returns a
// TaskInfo with ID, Queue (that asynq name, as asynq returns it), Type, Payload, State
// (asynq.TaskStatePending or asynq.TaskStateScheduled), MaxRetry
// (MaxAttempts-1), Timeout and NextProcessAt filled from the stored job.
func (c *Client) EnqueueContext(ctx context.Context, task *asynq.Task, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	if task == nil {
		return nil, errors.New("asynqcompat: task cannot be nil")
	}
	r := c.route(task.Type())
	if r.To == nil {
		if c.asynq == nil {
			return nil, fmt.Errorf("asynqcompat: task type %q is routed to asynq, but the Client has no asynq client", task.Type())
		}
		return c.asynq.EnqueueContext(ctx, task, opts...)
	}
	all, err := taskOptions(task)
	if err != nil {
		return nil, err
	}
	all = append(all, opts...)
	eo, q, err := c.mapOptions(task.Type(), r, all)
	if err != nil {
		return nil, err
	}
	if len(task.Headers()) > 0 {
		return nil, &OptionError{Type: task.Type(), Option: "headers",
			Reason: "jobkey jobs have no headers; put them in the payload"}
	}
	j, err := q.Enqueue(ctx, task.Type(), task.Payload(), eo)
	if errors.Is(err, jobkey.ErrJobExists) {
		return nil, fmt.Errorf("%w: %w", asynq.ErrTaskIDConflict, err)
	}
	if err != nil {
		return nil, err
	}
	return TaskInfo(j), nil
}

// TaskInfo describes a jobkey job as an asynq.TaskInfo: ID, Queue (the
// asynq queue the task was enqueued to, see QueueName), Type, Payload,
// State, MaxRetry (see MaxRetry), Retried (the retries spent before a move,
// plus Attempt, less the attempt running while active), LastErr, Timeout (the job's own; 0 when
// it has none), Deadline and Retention (the job's own; zero when it has
// none), NextProcessAt (RunAt while pending), CompletedAt and
// Result. A pending job due later is
// TaskStateScheduled, one due now TaskStatePending; a failed job is
// TaskStateArchived, a canceled one too.
func TaskInfo(j *jobkey.Job) *asynq.TaskInfo {
	if j == nil {
		return nil
	}
	ti := &asynq.TaskInfo{ID: j.ID, Queue: QueueName(j), Type: j.Type, Payload: j.Payload,
		MaxRetry: MaxRetry(j), Retried: retriedBefore(j) + j.Attempt, LastErr: j.LastError, Timeout: j.Timeout, Result: j.Result,
		Deadline: j.Deadline, Retention: j.Retention}
	switch j.State {
	case jobkey.StatePending:
		ti.NextProcessAt = j.RunAt
		ti.State = asynq.TaskStatePending
		if j.RunAt.After(j.UpdatedAt) {
			ti.State = asynq.TaskStateScheduled
		}
	case jobkey.StateActive:
		ti.State = asynq.TaskStateActive
		ti.Retried = RetryCount(j)
	case jobkey.StateSucceeded:
		ti.State = asynq.TaskStateCompleted
		ti.CompletedAt = j.UpdatedAt
	default:
		ti.State = asynq.TaskStateArchived
	}
	return ti
}

// OptionError reports an asynq option that has no equivalent for a task
// routed to jobkey, or a value jobkey cannot take. Nothing was enqueued.
type OptionError struct {
	Type   string // the task's type
	Option string // the option, as asynq prints it, e.g. `Timeout(1m0s)`
	Reason string // why it cannot be served
}

// Error says which option of which task type, and why.
func (e *OptionError) Error() string {
	return fmt.Sprintf("asynqcompat: task type %q routed to jobkey: option %s: %s; nothing was enqueued", e.Type, e.Option, e.Reason)
}

// Is makes errors.Is(err, ErrUnsupportedOption) hold.
func (e *OptionError) Is(target error) bool { return target == ErrUnsupportedOption }

// ErrUnsupportedOption is matched by every *OptionError.
var ErrUnsupportedOption = errors.New("asynqcompat: asynq option not supported by jobkey")

// mapOptions turns asynq options into jobkey's, picking the queue.
func (c *Client) mapOptions(typ string, r Route, opts []asynq.Option) (*jobkey.EnqueueOpts, *jobkey.Queue, error) {
	eo := &jobkey.EnqueueOpts{}
	q := r.To
	asynqQueue := "default" // asynq's, without Queue
	bad := func(o asynq.Option, reason string) error {
		return &OptionError{Type: typ, Option: o.String(), Reason: reason}
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		v := o.Value()
		switch o.Type() {
		case asynq.ProcessAtOpt:
			t, ok := v.(time.Time)
			if !ok {
				return nil, nil, bad(o, fmt.Sprintf("value of type %T, want time.Time", v))
			}
			eo.RunAt, eo.Delay = t, 0
		case asynq.ProcessInOpt:
			d, ok := v.(time.Duration)
			if !ok {
				return nil, nil, bad(o, fmt.Sprintf("value of type %T, want time.Duration", v))
			}
			eo.RunAt, eo.Delay = time.Time{}, max(d, 0)
		case asynq.TaskIDOpt:
			id, ok := v.(string)
			if !ok {
				return nil, nil, bad(o, fmt.Sprintf("value of type %T, want string", v))
			}
			eo.ID = id
		case asynq.MaxRetryOpt:
			n, ok := v.(int)
			if !ok {
				return nil, nil, bad(o, fmt.Sprintf("value of type %T, want int", v))
			}
			if n < 0 {
				n = 0
			}
			if n >= jobkey.MaxAttemptsLimit {
				return nil, nil, bad(o, fmt.Sprintf("more than jobkey's %d attempts", jobkey.MaxAttemptsLimit))
			}
			eo.MaxAttempts = n + 1
		case asynq.QueueOpt:
			name, ok := v.(string)
			if !ok {
				return nil, nil, bad(o, fmt.Sprintf("value of type %T, want string", v))
			}
			asynqQueue = name
			picked, ok := r.Queues[name]
			switch {
			case ok && picked != nil:
			case name == "default":
				picked = r.To
			default:
				if picked, ok = c.queues[name]; !ok {
					return nil, nil, bad(o, fmt.Sprintf("the route maps no asynq queue %q in Route.Queues, and no jobkey queue of that name was given to NewClient (the route's is %q)", name, r.To.Name()))
				}
			}
			q = picked
		case asynq.TimeoutOpt:
			d, ok := v.(time.Duration)
			switch {
			case !ok:
				return nil, nil, bad(o, fmt.Sprintf("value of type %T, want time.Duration", v))
			case d < 0:
				return nil, nil, bad(o, "a negative timeout: asynq would take it as a deadline already past and fail every run at once")
			case d > jobkey.MaxTimeout:
				return nil, nil, bad(o, fmt.Sprintf("over jobkey's MaxTimeout, %v", jobkey.MaxTimeout))
			}
			eo.Timeout = d // 0: none, as in asynq (the last Timeout wins)
		case asynq.DeadlineOpt:
			t, ok := v.(time.Time)
			switch {
			case !ok:
				return nil, nil, bad(o, fmt.Sprintf("value of type %T, want time.Time", v))
			case t.IsZero():
				eo.Deadline = time.Time{} // none, as in asynq
			case t.Year() < 1970 || t.Year() > 9999 || t.Unix() == 0:
				return nil, nil, bad(o, "outside what jobkey stores: after the Unix epoch, within 9999")
			default:
				eo.Deadline = t
			}
		case asynq.UniqueOpt:
			return nil, nil, bad(o, "jobkey has no uniqueness lock with a TTL; use jobkey.EnqueueOpts.UniqueBy and IfExists (unique until the job finishes) on a jobkey.Queue, or TaskID for idempotent enqueues")
		case asynq.RetentionOpt:
			d, ok := v.(time.Duration)
			switch {
			case !ok:
				return nil, nil, bad(o, fmt.Sprintf("value of type %T, want time.Duration", v))
			case d > jobkey.MaxRetention:
				return nil, nil, bad(o, fmt.Sprintf("over jobkey's MaxRetention, %v", jobkey.MaxRetention))
			}
			// Under a second asynq keeps nothing; jobkey keeps a job 1s at least.
			eo.Retention = max(d, time.Second)
		case asynq.GroupOpt:
			return nil, nil, bad(o, "jobkey has no task aggregation")
		default:
			return nil, nil, bad(o, "unknown option type")
		}
	}
	if eo.MaxAttempts == 0 {
		eo.MaxAttempts = DefaultMaxRetry + 1 // asynq.Client's default
	}
	eo.Meta = map[string]string{MetaQueue: asynqQueue}
	return eo, q, nil
}

// taskOptions reads the options given to asynq.NewTask, which asynq keeps
// in an unexported field and applies before Enqueue's. Reading them is the
// only way to honour them, or refuse them, instead of dropping them
// unseen; the layout is checked, and a layout this package does not know is
// an error, never a guess.
func taskOptions(task *asynq.Task) ([]asynq.Option, error) {
	v := reflect.ValueOf(task).Elem()
	f := v.FieldByName("opts")
	if !f.IsValid() || f.Type() != reflect.TypeFor[[]asynq.Option]() || !f.CanAddr() {
		return nil, errors.New("asynqcompat: this asynq version's Task does not keep its options where asynqcompat reads them; cannot tell whether options were given to NewTask")
	}
	opts := *(*[]asynq.Option)(unsafe.Pointer(f.UnsafeAddr()))
	return append([]asynq.Option(nil), opts...), nil
}
