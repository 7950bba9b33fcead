// Package streamsnap reads streams as snapshots: a stream's XINFO STREAM
// and an XRANGE of it in one MULTI, so that what the info says of the
// stream (its first entry, its last, the last one deleted) holds for the
// entries read beside it. The event reader (eventsread.go) judges a
// cursor's gaps and rewinds from the two together.
package streamsnap

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Range names one stream and where its read starts ("-" for the first
// entry, or an entry ID, included).
type Range struct {
	Key, Start string
}

// Snapshot is what one stream's read found. InfoErr and Err are each
// command's own reply error (a missing stream answers XINFO with "no such
// key"; a key of another type answers WRONGTYPE).
type Snapshot struct {
	Info    *redis.XInfoStream
	InfoErr error
	Msgs    []redis.XMessage
	Err     error
}

// Read reads each range's stream, at most count entries, each stream in
// one MULTI. sameSlot says the streams share a Redis (one node, not a
// cluster): one MULTI then reads them all in one round trip; otherwise a
// MULTI per stream, all at once.
func Read(ctx context.Context, rdb redis.UniversalClient, sameSlot bool, ranges []Range, count int64) []Snapshot {
	infos := make([]*redis.XInfoStreamCmd, len(ranges))
	msgs := make([]*redis.XMessageSliceCmd, len(ranges))
	read := func(p redis.Pipeliner, i int) {
		infos[i] = p.XInfoStream(ctx, ranges[i].Key)
		msgs[i] = p.XRangeN(ctx, ranges[i].Key, ranges[i].Start, "+", count)
	}
	// Every command's own reply says how its stream went.
	if sameSlot {
		_, _ = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			for i := range ranges {
				read(p, i)
			}
			return nil
		})
	} else {
		var wg sync.WaitGroup
		for i := range ranges {
			wg.Go(func() {
				_, _ = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
					read(p, i)
					return nil
				})
			})
		}
		wg.Wait()
	}
	out := make([]Snapshot, len(ranges))
	for i := range ranges {
		out[i].Info, out[i].InfoErr = infos[i].Result()
		out[i].Msgs, out[i].Err = msgs[i].Result()
	}
	return out
}
