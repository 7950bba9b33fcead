package asynqcompat

import (
	"context"
	"reflect"
	"runtime/debug"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/redis/go-redis/v9"
)

// Meta keys that carry what asynq knew of a task across a move, so that a
// handler sees the counts and the queue asynq would show it.
const (
	// MetaRetried is the job's Meta key for the retries the task had spent
	// before it became a jobkey job (asynq's TaskInfo.Retried at the move),
	// in decimal. asynq.GetRetryCount then reports it plus Job.Attempt-1,
	// and GetMaxRetry it plus Job.MaxAttempts-1.
	MetaRetried = "asynq.retried"
	// MetaQueue is the job's Meta key for the asynq queue name the task was
	// enqueued to ("default" without asynq.Queue). Client sets it;
	// asynq.GetQueueName and TaskInfo report it instead of the jobkey
	// queue's name.
	MetaQueue = "asynq.queue"
)

// RetryCount is what asynq.GetRetryCount reports for job j: the retries
// before a move (Meta[MetaRetried]) plus the runs in jobkey before this one.
func RetryCount(j *jobkey.Job) int {
	return retriedBefore(j) + max(j.Attempt-1, 0)
}

// MaxRetry is what asynq.GetMaxRetry reports for job j: the retries before
// a move plus the retries jobkey allows after the first run.
func MaxRetry(j *jobkey.Job) int {
	return retriedBefore(j) + max(j.MaxAttempts-1, 0)
}

// QueueName is what asynq.GetQueueName reports for job j: the asynq queue
// the task was enqueued to (Meta[MetaQueue]), else the jobkey queue's name.
func QueueName(j *jobkey.Job) string {
	if q := j.Meta[MetaQueue]; q != "" {
		return q
	}
	return j.Queue
}

func retriedBefore(j *jobkey.Job) int {
	n, err := strconv.Atoi(j.Meta[MetaRetried])
	if err != nil || n < 0 || n > 1<<20 {
		return 0
	}
	return n
}

// asynqTaskVersion is the only asynq version whose unexported layout this
// file was checked against; with any other (or a replaced) asynq the
// adapter serves neither a ResultWriter nor asynq's context helpers rather
// than guess at a layout.
const asynqTaskVersion = "v0.26.0"

// internals holds what asynq keeps unexported and the adapter needs: the
// type of base.TaskMessage, the context key of asynq's internal/context
// package, and the fields of Task and ResultWriter.
type internals struct {
	ok       bool
	msgType  reflect.Type // base.TaskMessage
	ctxKey   any          // internal/context's metadataCtxKey
	taskW    int          // index of Task.w
	rwFields map[string]int
	broker   reflect.Type // base.Broker
}

var (
	internalsOnce sync.Once
	asynqInternal internals
)

//go:linkname asynqContextNew github.com/hibiken/asynq/internal/context.New
func asynqContextNew(base context.Context, msg unsafe.Pointer, deadline time.Time) (context.Context, context.CancelFunc)

func loadInternals() *internals {
	internalsOnce.Do(func() {
		defer func() {
			if recover() != nil {
				asynqInternal = internals{}
			}
		}()
		asynqInternal = probeInternals()
	})
	return &asynqInternal
}

// asynqVersionChecked reports whether the binary's asynq is the checked
// version. A binary that lists no asynq module (a test binary lists no
// dependencies) relies on the layout checks of probeInternals alone.
func asynqVersionChecked() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return true
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/hibiken/asynq" {
			return d.Replace == nil && d.Version == asynqTaskVersion
		}
	}
	return true
}

func probeInternals() internals {
	var in internals
	if !asynqVersionChecked() {
		return in
	}
	// asynq's broker (an *rdb.RDB) names base.TaskMessage in the signature
	// of its exported Enqueue method.
	bf, ok := fieldOf(reflect.ValueOf(asynq.NewClientFromRedisClient(capture{})).Elem(), "broker")
	if !ok || bf.Kind() != reflect.Interface || bf.IsNil() {
		return in
	}
	in.broker = bf.Type()
	enq := bf.Elem().MethodByName("Enqueue")
	if !enq.IsValid() || enq.Type().NumIn() != 2 || enq.Type().In(1).Kind() != reflect.Pointer {
		return in
	}
	in.msgType = enq.Type().In(1).Elem()
	for name, kind := range map[string]reflect.Kind{"ID": reflect.String, "Queue": reflect.String, "Retry": reflect.Int, "Retried": reflect.Int} {
		if f, ok := in.msgType.FieldByName(name); !ok || f.Type.Kind() != kind {
			return in
		}
	}
	tt := reflect.TypeFor[asynq.Task]()
	w, ok := tt.FieldByName("w")
	if !ok || w.Type != reflect.TypeFor[*asynq.ResultWriter]() {
		return in
	}
	in.taskW = w.Index[0]
	in.rwFields = map[string]int{}
	rwt := reflect.TypeFor[asynq.ResultWriter]()
	for name, want := range map[string]reflect.Type{"id": reflect.TypeFor[string](), "qname": reflect.TypeFor[string](),
		"broker": in.broker, "ctx": reflect.TypeFor[context.Context]()} {
		f, ok := rwt.FieldByName(name)
		if !ok || f.Type != want {
			return in
		}
		in.rwFields[name] = f.Index[0]
	}
	// The context key: asynq.GetTaskID asks a context for it.
	var probe keyProbe
	asynq.GetTaskID(&probe)
	if probe.key == nil {
		return in
	}
	in.ctxKey = probe.key
	in.ok = true
	// Check the whole path once: the helpers must read back what was fed.
	ctx := in.withMetadata(context.Background(), "probe-id", "probe-q", 7, 3)
	id, ok1 := asynq.GetTaskID(ctx)
	n, ok2 := asynq.GetRetryCount(ctx)
	m, ok3 := asynq.GetMaxRetry(ctx)
	q, ok4 := asynq.GetQueueName(ctx)
	in.ok = ok1 && ok2 && ok3 && ok4 && id == "probe-id" && n == 3 && m == 7 && q == "probe-q"
	return in
}

// withMetadata returns ctx carrying the task metadata asynq's context
// helpers read, built by asynq's own internal/context.New.
func (in *internals) withMetadata(ctx context.Context, id, queue string, maxRetry, retried int) context.Context {
	msg := reflect.New(in.msgType)
	msg.Elem().FieldByName("ID").SetString(id)
	msg.Elem().FieldByName("Queue").SetString(queue)
	msg.Elem().FieldByName("Retry").SetInt(int64(maxRetry))
	msg.Elem().FieldByName("Retried").SetInt(int64(retried))
	// Only the value is taken from New's context: the run's own context
	// keeps its deadline and cancellation.
	meta, cancel := asynqContextNew(context.Background(), msg.UnsafePointer(), time.Now().Add(time.Hour))
	cancel()
	return context.WithValue(ctx, in.ctxKey, meta.Value(in.ctxKey))
}

// newTask builds the *asynq.Task a handler gets: type and payload, and a
// ResultWriter whose Write stores into box, as asynq's server builds it.
func (in *internals) newTask(ctx context.Context, j *jobkey.Job, box *resultBox) *asynq.Task {
	task := asynq.NewTask(j.Type, j.Payload)
	if !in.ok {
		return task
	}
	bf, _ := fieldOf(reflect.ValueOf(asynq.NewClientFromRedisClient(capture{box: box})).Elem(), "broker")
	rw := &asynq.ResultWriter{}
	rv := reflect.ValueOf(rw).Elem()
	settable(rv.Field(in.rwFields["id"])).SetString(j.ID)
	settable(rv.Field(in.rwFields["qname"])).SetString(QueueName(j))
	settable(rv.Field(in.rwFields["broker"])).Set(bf)
	settable(rv.Field(in.rwFields["ctx"])).Set(reflect.ValueOf(&ctx).Elem())
	settable(reflect.ValueOf(task).Elem().Field(in.taskW)).Set(reflect.ValueOf(rw))
	return task
}

func fieldOf(v reflect.Value, name string) (reflect.Value, bool) {
	f := v.FieldByName(name)
	if !f.IsValid() || !f.CanAddr() {
		return reflect.Value{}, false
	}
	return settable(f), true
}

// settable makes an unexported field readable and settable.
func settable(f reflect.Value) reflect.Value {
	return reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()
}

// keyProbe records the key a context is asked for.
type keyProbe struct {
	context.Context
	key any
}

func (p *keyProbe) Value(key any) any {
	p.key = key
	return nil
}

// capture is the Redis client under the broker of an adapted task's
// ResultWriter: asynq's ResultWriter.Write ends in one HSET of the task's
// "result" field, which capture keeps as the job's result instead. Nothing
// else of the client is ever called (the embedded interface is nil).
type capture struct {
	redis.UniversalClient
	box *resultBox
}

func (c capture) HSet(ctx context.Context, key string, values ...any) *redis.IntCmd {
	cmd := redis.NewIntCmd(ctx)
	if c.box == nil || len(values) != 2 || values[0] != "result" {
		cmd.SetErr(errUnexpectedWrite)
		return cmd
	}
	data, ok := values[1].([]byte)
	if !ok {
		cmd.SetErr(errUnexpectedWrite)
		return cmd
	}
	c.box.set(data)
	cmd.SetVal(1)
	return cmd
}
