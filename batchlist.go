package jobkey

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// Batches returns up to limit of the queue's batches, the newest first (by
// when they were made), read from each shard's list of batches: one round
// trip per shard for the IDs, one for the values. A batch whose value has
// expired (Config.Retention after it fired) is not listed. A value that
// cannot be read is not listed either, and the error, beside the batches
// that could be, names its key (a *CorruptError, or a *WrongTypeError);
// the value is kept as it is. limit is 1..1000.
func (q *Queue) Batches(ctx context.Context, limit int) ([]*Batch, error) {
	if limit < 1 || limit > verifyPage {
		return nil, fmt.Errorf("%w: Batches of %d, want 1..%d", ErrInvalid, limit, verifyPage)
	}
	if err := q.check(ctx, false); err != nil {
		return nil, err
	}
	var out []*Batch
	var errs []error
	for s := range q.ks.shards {
		ids, err := q.rdb.ZRevRange(ctx, q.ks.index(s, idxBatches), 0, int64(limit-1)).Result()
		if err != nil {
			return out, fmt.Errorf("jobkey: list batches of shard %d: %w", s, err)
		}
		keys := make([]string, len(ids))
		for i, id := range ids {
			keys[i] = q.ks.batchKey(s, id)
		}
		raws, err := q.getRaw(ctx, keys)
		if err != nil {
			return out, err
		}
		for i, raw := range raws {
			if raw.Missing {
				continue
			}
			b, err := readBatch(keys[i], raw)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			out = append(out, b)
		}
	}
	slices.SortFunc(out, func(a, b *Batch) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return compareStrings(b.ID, a.ID)
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, errors.Join(errs...)
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
