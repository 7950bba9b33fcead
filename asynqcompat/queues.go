package asynqcompat

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"

	"github.com/hibiken/asynq"
	"github.com/jobkey/jobkey"
)

// WorkQueues maps an asynq server's queue options onto jobkey.WorkQueues:
// each name of cfg.Queues (asynq's default, {"default": 1}, when empty)
// becomes the jobkey queue queues maps it to, with its weight;
// StrictPriority, Concurrency (asynq's default, the number of CPUs, when
// 0) and ShutdownTimeout carry over, and RetryDelayFunc and IsFailure,
// when either is set, become WorkOpts.RetryPolicy (RetryPolicy; with
// neither, each queue's Config.Backoff decides). The queues come heaviest first, then
// by name. A name with no jobkey queue, or a weight below 1, is refused.
//
//	qs, opts, err := asynqcompat.WorkQueues(asynqCfg, map[string]*jobkey.Queue{"critical": crit, "default": def, "low": low})
//	err = jobkey.WorkQueues(ctx, handler, qs, opts)
func WorkQueues(cfg asynq.Config, queues map[string]*jobkey.Queue) ([]jobkey.WeightedQueue, *jobkey.WorkQueuesOpts, error) {
	weights := cfg.Queues
	if len(weights) == 0 {
		weights = map[string]int{"default": 1}
	}
	names := make([]string, 0, len(weights))
	for name := range weights {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(weights[b], weights[a]), cmp.Compare(a, b)) })
	out := make([]jobkey.WeightedQueue, 0, len(names))
	for _, name := range names {
		q := queues[name]
		if q == nil {
			return nil, nil, fmt.Errorf("%w: asynqcompat: no jobkey queue for asynq queue %q", jobkey.ErrInvalid, name)
		}
		if w := weights[name]; w < 1 || w > jobkey.MaxQueueWeight {
			return nil, nil, fmt.Errorf("%w: asynqcompat: asynq queue %q has weight %d, want 1..%d", jobkey.ErrInvalid, name, w, jobkey.MaxQueueWeight)
		}
		out = append(out, jobkey.WeightedQueue{Queue: q, Weight: weights[name]})
	}
	opts := &jobkey.WorkQueuesOpts{StrictPriority: cfg.StrictPriority}
	opts.Concurrency = cmp.Or(cfg.Concurrency, runtime.NumCPU())
	opts.ShutdownGrace = cfg.ShutdownTimeout
	if cfg.RetryDelayFunc != nil || cfg.IsFailure != nil {
		opts.RetryPolicy = RetryPolicy(cfg.RetryDelayFunc, cfg.IsFailure)
	}
	return out, opts, nil
}
