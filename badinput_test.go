package jobkey

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Unreadable values at job keys: Get reports them, Claim sets them aside
// without looping and without touching their bytes, the other jobs keep
// flowing, and Stats counts them.
func TestCorruptValuesAreSetAsideAndKept(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2})
	golden, err := os.ReadFile(filepath.Join("testdata", "job-v1.0.msgpack"))
	require.NoError(t, err)
	newer := bytes.Clone(golden)
	newer[3] = 2 // format major version 2
	bad := map[string][]byte{
		"truncated":   golden[:len(golden)/2],
		"array32":     binary.BigEndian.AppendUint32([]byte{0xdd}, 0xffffffff),
		"bin32":       append(bytes.Clone(golden[:7]), 0xa0, 0xa0, 0xc6, 0xff, 0xff, 0xff, 0xff),
		"garbage":     []byte("{\"json\": \"not msgpack\"}"),
		"empty":       {},
		"trailing":    append(bytes.Clone(golden), 0),
		"newerFormat": newer,
	}
	now := toMillis(f.clock.Now())
	for id, b := range bad {
		keys := f.q.Keys(id)
		require.NoError(t, f.rdb.Set(f.ctx, keys.Job, b, 0).Err())
		require.NoError(t, f.rdb.ZAdd(f.ctx, keys.Ready, redis.Z{Score: float64(now), Member: id}).Err())
	}
	listKeys := f.q.Keys("a-list") // a job key of another Redis type
	require.NoError(t, f.rdb.RPush(f.ctx, listKeys.Job, "x").Err())
	require.NoError(t, f.rdb.ZAdd(f.ctx, listKeys.Ready, redis.Z{Score: float64(now), Member: "a-list"}).Err())

	var good []string
	for i := range 5 {
		j, err := f.q.Enqueue(f.ctx, "t", nil, &EnqueueOpts{ID: fmt.Sprintf("good-%d", i)})
		require.NoError(t, err)
		good = append(good, j.ID)
	}

	for id := range bad {
		_, err := f.q.Get(f.ctx, id)
		if id == "newerFormat" {
			require.ErrorIs(t, err, ErrUnsupportedFormat, id)
		} else {
			require.ErrorIs(t, err, ErrCorrupt, id)
		}
	}
	_, err = f.q.Get(f.ctx, "a-list")
	require.ErrorIs(t, err, ErrWrongType)

	var claimed []string
	for {
		j, err := f.q.Claim(f.ctx, "w")
		if errors.Is(err, ErrNoJob) {
			break
		}
		require.NoError(t, err)
		claimed = append(claimed, j.ID)
		require.Less(t, len(claimed), 10, "claims must not loop")
	}
	sort.Strings(claimed)
	require.Equal(t, good, claimed, "the good jobs flowed")

	for id, b := range bad {
		got, err := f.rdb.Get(f.ctx, f.q.Keys(id).Job).Bytes()
		require.NoError(t, err)
		require.Equal(t, b, got, "%s: the bytes are kept untouched", id)
	}
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, len(bad), st.Corrupt, "the corrupt ones and the list, not the newer format")
	require.EqualValues(t, 1, st.Pending, "the newer-format job stays where newer workers will find it")
	require.EqualValues(t, 1, st.Newer, "and its sighting is counted")
	require.EqualValues(t, 5, st.Active)
	idx, _ := f.indexOf(t, "newerFormat")
	require.Equal(t, idxReady, idx)
}

// A huge EnqueueMany is cut into transactions of Config.MaxBatch jobs, so
// neither the client nor Redis ever holds one unbounded transaction.
func TestEnqueueManyIsChunked(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{MaxBatch: 500})
	batch := make([]NewJob, 10_000)
	for i := range batch {
		batch[i] = NewJob{Type: "t", Payload: []byte{byte(i)}}
	}
	before := f.q.Metrics()
	f.hook.Reset()
	jobs, err := f.q.EnqueueMany(f.ctx, batch)
	require.NoError(t, err)
	require.Len(t, jobs, len(batch))
	require.EqualValues(t, 20, f.q.Metrics().Txns-before.Txns, "10,000 jobs in transactions of 500")
	require.EqualValues(t, 40, f.hook.RTT.Load())
	st, err := f.q.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, len(batch), st.Pending)
}
