package bench

import (
	"context"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey/internal/benchscenario"
	"github.com/redis/go-redis/v9"
)

// asynqFastCheck is TaskCheckInterval of "asynq-fast": how often an idle
// asynq worker looks for tasks (asynq's default is 1 s).
const asynqFastCheck = 10 * time.Millisecond

// NewWorkerDesign builds a worker design by name, on rdb under prefix;
// minReplicas is jobkey's Config.MinReplicas.
func NewWorkerDesign(name string, rdb redis.UniversalClient, prefix string, minReplicas int) (WorkerDesign, error) {
	switch name {
	case "asynq", "asynq-fast":
		d := newAsynq(rdb, prefix)
		if name == "asynq-fast" {
			d.check = asynqFastCheck
		}
		return d, nil
	}
	return benchscenario.NewWorkerDesign(name, rdb, prefix, minReplicas)
}

// Asynq is asynq v0.26's Client and Server on the same Redis, with
// asynq's defaults but for the queue's name, the concurrency and, for
// "asynq-fast", TaskCheckInterval.
type Asynq struct {
	rdb    redis.UniversalClient
	queue  string
	check  time.Duration
	client *asynq.Client
}

func newAsynq(rdb redis.UniversalClient, queue string) *Asynq {
	return &Asynq{rdb: rdb, queue: queue, client: asynq.NewClientFromRedisClient(rdb)}
}

// AsynqKeys is the prefix of the keys asynq keeps for the queue named
// queue: Cleanup(ctx, rdb, AsynqKeys(prefix)) deletes them.
func AsynqKeys(queue string) string { return "asynq:{" + queue + "}" }

// Name is the design's name.
func (d *Asynq) Name() string { return "asynq" }

func (d *Asynq) Enqueue(ctx context.Context, payload []byte) error {
	_, err := d.client.EnqueueContext(ctx, asynq.NewTask("bench", payload), asynq.Queue(d.queue))
	return err
}

func (d *Asynq) Work(ctx context.Context, slots int, handle func([]byte)) error {
	srv := asynq.NewServerFromRedisClient(d.rdb, asynq.Config{
		Concurrency: slots, Queues: map[string]int{d.queue: 1}, TaskCheckInterval: d.check,
		Logger: asynqQuiet{}, LogLevel: asynq.FatalLevel, ShutdownTimeout: time.Second,
	})
	err := srv.Start(asynq.HandlerFunc(func(_ context.Context, t *asynq.Task) error {
		handle(t.Payload())
		return nil
	}))
	if err != nil {
		return err
	}
	<-ctx.Done()
	srv.Shutdown()
	return nil
}

// Close closes asynq's client (not rdb) and deletes asynq's keys of the
// queue.
func (d *Asynq) Close() {
	_ = d.client.Close()
	benchscenario.Cleanup(context.Background(), d.rdb, AsynqKeys(d.queue))
}

type asynqQuiet struct{}

func (asynqQuiet) Debug(...any) {}
func (asynqQuiet) Info(...any)  {}
func (asynqQuiet) Warn(...any)  {}
func (asynqQuiet) Error(...any) {}
func (asynqQuiet) Fatal(...any) {}
