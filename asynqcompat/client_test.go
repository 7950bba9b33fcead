package asynqcompat

import (
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
	"github.com/stretchr/testify/require"
)

func TestClientRoutesPerType(t *testing.T) {
	e := newEnv(t)
	emails := e.queue(t, "emails", nil)
	other := e.queue(t, "bulk", nil)
	ac := asynq.NewClientFromRedisClient(e.rdb)
	ins := asynq.NewInspectorFromRedisClient(e.rdb)
	c := NewClient(ac, []Route{
		{Type: "email:welcome", To: emails},
		{Match: func(typ string) bool { return typ == "email:digest" }, To: emails},
	}, other)
	require.Equal(t, emails, c.Route("email:welcome"))
	require.Nil(t, c.Route("image:resize"))

	// Routed to jobkey, with every mappable option.
	at := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	info, err := c.EnqueueContext(e.ctx, asynq.NewTask("email:welcome", []byte("ada"), asynq.MaxRetry(3)),
		asynq.TaskID("w-1"), asynq.ProcessAt(at), asynq.Queue("emails"))
	require.NoError(t, err)
	require.Equal(t, "w-1", info.ID)
	require.Equal(t, "emails", info.Queue)
	require.Equal(t, asynq.TaskStateScheduled, info.State)
	require.Equal(t, 3, info.MaxRetry)
	require.True(t, info.NextProcessAt.Equal(at), "%v != %v", info.NextProcessAt, at)
	j, err := emails.Get(e.ctx, "w-1")
	require.NoError(t, err)
	require.Equal(t, "email:welcome", j.Type)
	require.Equal(t, "ada", string(j.Payload))
	require.Equal(t, 4, j.MaxAttempts, "MaxRetry(3) is 3 retries after the first run")
	require.True(t, j.RunAt.Equal(at))

	// ProcessIn, and Queue picking another jobkey queue; the last of
	// ProcessAt/ProcessIn wins, as in asynq.
	info, err = c.Enqueue(asynq.NewTask("email:digest", []byte("x")), asynq.ProcessAt(at), asynq.ProcessIn(0), asynq.Queue("bulk"))
	require.NoError(t, err)
	require.Equal(t, "bulk", info.Queue)
	require.Equal(t, asynq.TaskStatePending, info.State)
	j, err = other.Get(e.ctx, info.ID)
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), j.RunAt, 5*time.Second)

	// A taken TaskID reads as asynq's conflict and as jobkey's.
	_, err = c.Enqueue(asynq.NewTask("email:welcome", []byte("ada")), asynq.TaskID("w-1"))
	require.ErrorIs(t, err, asynq.ErrTaskIDConflict)
	require.ErrorIs(t, err, jobkey.ErrJobExists)

	// Not routed: asynq, untouched by the mapping (Timeout is fine there).
	info, err = c.Enqueue(asynq.NewTask("image:resize", []byte("i")), asynq.TaskID("r-1"), asynq.Timeout(time.Minute))
	require.NoError(t, err)
	require.Equal(t, "default", info.Queue)
	got, err := ins.GetTaskInfo("default", "r-1")
	require.NoError(t, err)
	require.Equal(t, "image:resize", got.Type)
	_, err = emails.Get(e.ctx, "r-1")
	require.ErrorIs(t, err, jobkey.ErrNotFound)
}

// Options with no jobkey equivalent are refused, whether given to Enqueue
// or to NewTask, and nothing is enqueued.
func TestClientRefusesUnmappedOptions(t *testing.T) {
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	c := NewClient(nil, []Route{{Type: "email:welcome", To: q}})
	for _, o := range []asynq.Option{
		asynq.Timeout(-time.Second), asynq.Timeout(jobkey.MaxTimeout + time.Second),
		asynq.Deadline(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)), asynq.Deadline(time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC)),
		asynq.Unique(time.Hour), asynq.Retention(jobkey.MaxRetention + time.Second), asynq.Group("g"), asynq.Queue("nope"), strangeOption{},
	} {
		_, err := c.EnqueueContext(e.ctx, asynq.NewTask("email:welcome", []byte("p")), asynq.TaskID("x"), o)
		var oe *OptionError
		require.ErrorAs(t, err, &oe, o.String())
		require.ErrorIs(t, err, ErrUnsupportedOption)
		require.Equal(t, o.String(), oe.Option)
		require.Equal(t, "email:welcome", oe.Type)

		_, err = c.EnqueueContext(e.ctx, asynq.NewTask("email:welcome", []byte("p"), o), asynq.TaskID("x"))
		require.ErrorIs(t, err, ErrUnsupportedOption, "given to NewTask: %s", o)
	}
	_, err := c.Enqueue(asynq.NewTaskWithHeaders("email:welcome", []byte("p"), map[string]string{"k": "v"}), asynq.TaskID("x"))
	require.ErrorIs(t, err, ErrUnsupportedOption)
	_, err = q.Get(e.ctx, "x")
	require.ErrorIs(t, err, jobkey.ErrNotFound, "nothing was enqueued")

	// A type routed to asynq without an asynq client.
	_, err = c.Enqueue(asynq.NewTask("image:resize", nil))
	require.Error(t, err)

	// Options given to NewTask that do map are honoured, and Enqueue's come
	// after them.
	info, err := c.Enqueue(asynq.NewTask("email:welcome", []byte("p"), asynq.MaxRetry(1), asynq.TaskID("a")), asynq.TaskID("b"))
	require.NoError(t, err)
	require.Equal(t, "b", info.ID)
	j, err := q.Get(e.ctx, "b")
	require.NoError(t, err)
	require.Equal(t, 2, j.MaxAttempts)
	require.False(t, errors.Is(err, ErrUnsupportedOption))
}

type strangeOption struct{}

func (strangeOption) String() string         { return "Strange()" }
func (strangeOption) Type() asynq.OptionType { return asynq.OptionType(99) }
func (strangeOption) Value() any             { return nil }

// A routed task reports the asynq queue it was enqueued to, as asynq does:
// "default" without asynq.Queue, whatever the jobkey queue is named.
func TestClientTaskInfoQueueIsTheAsynqQueue(t *testing.T) {
	e := newEnv(t)
	emails := e.queue(t, "emails", nil)
	c := NewClient(nil, []Route{{Type: "email:welcome", To: emails}})
	info, err := c.Enqueue(asynq.NewTask("email:welcome", []byte("ada")), asynq.TaskID("a"))
	require.NoError(t, err)
	require.Equal(t, "default", info.Queue)
	j, err := emails.Get(e.ctx, "a")
	require.NoError(t, err)
	require.Equal(t, "emails", j.Queue)
	require.Equal(t, "default", TaskInfo(j).Queue)
	require.Equal(t, "default", QueueName(j), "what asynq.GetQueueName reports to the handler")
}

// Call sites that pass asynq queue names keep their code: "default" goes
// to the route's queue, as it is asynq's queue when none is given, and
// Route.Queues maps other asynq names to jobkey queues.
func TestClientMapsAsynqQueueNames(t *testing.T) {
	e := newEnv(t)
	emails := e.queue(t, "emails", nil)
	urgent := e.queue(t, "emails-urgent", nil)
	c := NewClient(nil, []Route{{Type: "email:welcome", To: emails,
		Queues: map[string]*jobkey.Queue{"critical": urgent}}})
	info, err := c.Enqueue(asynq.NewTask("email:welcome", nil), asynq.Queue("default"), asynq.TaskID("d"))
	require.NoError(t, err)
	require.Equal(t, "default", info.Queue)
	_, err = emails.Get(e.ctx, "d")
	require.NoError(t, err)

	info, err = c.Enqueue(asynq.NewTask("email:welcome", nil, asynq.Queue("critical")), asynq.TaskID("c"))
	require.NoError(t, err)
	require.Equal(t, "critical", info.Queue)
	j, err := urgent.Get(e.ctx, "c")
	require.NoError(t, err)
	require.Equal(t, "critical", QueueName(j))

	// A name neither mapped nor a jobkey queue's is still refused.
	_, err = c.Enqueue(asynq.NewTask("email:welcome", nil), asynq.Queue("low"), asynq.TaskID("l"))
	require.ErrorIs(t, err, ErrUnsupportedOption)
}

// asynq.Deadline(t) and asynq.Retention(d) become the job's Deadline and
// Retention, given to Enqueue or to NewTask, the last one winning, a zero
// Deadline none, and a Retention under a second the second jobkey keeps at
// least; the TaskInfo returned reports both.
func TestClientMapsDeadlineAndRetention(t *testing.T) {
	e := newEnv(t)
	q := e.queue(t, "emails", nil)
	c := NewClient(nil, []Route{{Type: moveType, To: q}})
	at := time.Date(2030, 1, 2, 3, 4, 5, 678e6, time.UTC)
	for _, tc := range []struct {
		id        string
		task      []asynq.Option
		opts      []asynq.Option
		deadline  time.Time
		retention time.Duration
	}{
		{id: "none"},
		{id: "deadline", opts: []asynq.Option{asynq.Deadline(at)}, deadline: at},
		{id: "on-task", task: []asynq.Option{asynq.Deadline(at), asynq.Retention(time.Hour)}, deadline: at, retention: time.Hour},
		{id: "last-wins", task: []asynq.Option{asynq.Retention(time.Hour)}, opts: []asynq.Option{asynq.Retention(2 * time.Hour), asynq.Deadline(at), asynq.Deadline(time.Time{})}, retention: 2 * time.Hour},
		{id: "sub-second", opts: []asynq.Option{asynq.Retention(300 * time.Millisecond)}, retention: time.Second},
		{id: "max", opts: []asynq.Option{asynq.Retention(jobkey.MaxRetention)}, retention: jobkey.MaxRetention},
	} {
		info, err := c.EnqueueContext(e.ctx, asynq.NewTask(moveType, []byte(tc.id), tc.task...), append(tc.opts, asynq.TaskID(tc.id))...)
		require.NoError(t, err, tc.id)
		require.Equal(t, tc.deadline, info.Deadline, tc.id)
		require.Equal(t, tc.retention, info.Retention, tc.id)
		j, err := q.Get(e.ctx, tc.id)
		require.NoError(t, err, tc.id)
		require.Equal(t, tc.deadline, j.Deadline, "%s: the stored job's Deadline", tc.id)
		require.Equal(t, tc.retention, j.Retention, "%s: the stored job's Retention", tc.id)
	}
}
