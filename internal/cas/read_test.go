package cas

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// shortReply drops the last value of the reply to the first command named
// name (with first argument arg, when set) in every pipeline: a reply array
// shorter than the command's keys, as a broken proxy or server might send.
type shortReply struct{ name, arg string }

func (h shortReply) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h shortReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h shortReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if c.Name() != h.name || h.arg != "" && (len(c.Args()) < 2 || c.Args()[1] != h.arg) {
				continue
			}
			switch c := c.(type) {
			case *redis.Cmd:
				if v, ok := c.Val().([]any); ok && len(v) > 0 {
					c.SetVal(v[:len(v)-1])
				}
			case *redis.SliceCmd:
				if v := c.Val(); len(v) > 0 {
					c.SetVal(v[:len(v)-1])
				}
			}
			break
		}
		return err
	}
}

// A reply array of round trip 1 with fewer values than the keys it reads
// fails the attempt with an error: the decision never sees a read with a
// key's value, or a guard's, missing.
func TestAShortReplyToRoundTripOneIsAnError(t *testing.T) {
	t.Parallel()
	redistest.RequireReal(t)
	p := redistest.Prefix(t)
	keys := []string{p + ":k0", p + ":k1"}
	guards := []string{p + ":g0", p + ":g1"}
	for _, tc := range []struct {
		name string
		hook shortReply
	}{
		{"guards", shortReply{name: "mget", arg: guards[0]}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := redistest.Client(t, nil)
			rdb.AddHook(tc.hook)
			e := testEngine(t, rdb, 3)
			decided := false
			_, _, err := e.Run(context.Background(), &Txn{Keys: keys, Guards: guards, Decide: func(r *Read) (*Plan, error) {
				decided = true
				require.Len(t, r.Values, len(keys))
				require.Len(t, r.Guarded, len(guards))
				return nil, nil
			}})
			require.Error(t, err)
			require.ErrorContains(t, err, "for 2 keys")
			require.False(t, decided)
		})
	}
}

// MGET's raw reply with fewer values than its keys is an error, and so is
// one whose bytes are not what go-redis says it wrote: the decision never
// sees a read with a key's value missing.
func TestAShortMGETReplyIsAnError(t *testing.T) {
	e := &Engine{}
	for _, tc := range []struct {
		name, raw string
		written   int
		want      string
	}{
		{"one value short", "*1\r\n$1\r\na\r\n", 11, "1 values for 2 keys"},
		{"cut mid-value", "*2\r\n$1\r\na\r\n$5\r\nab", 17, "malformed"},
		{"fewer bytes than written", "*2\r\n$1\r\na\r\n$-1\r\n", 99, "99 read"},
		{"an error reply", "-MOVED 1 127.0.0.1:7000\r\n", 25, "MOVED"},
		{"not an array", ":2\r\n", 4, "not an array"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := redis.NewRawWriteToCmd(context.Background(), nil, "mget", "a", "b")
			cmd.SetVal(int64(tc.written))
			_, err := e.mgetValues(cmd, &sink{b: []byte(tc.raw)}, 2)
			require.ErrorContains(t, err, tc.want)
		})
	}
	cmd := redis.NewRawWriteToCmd(context.Background(), nil, "mget", "a", "b")
	raw := "*2\r\n$1\r\na\r\n$-1\r\n"
	cmd.SetVal(int64(len(raw)))
	vals, err := e.mgetValues(cmd, &sink{b: []byte(raw)}, 2)
	require.NoError(t, err)
	require.Equal(t, "a", vals[0].S)
	require.True(t, vals[1].Missing)
}

// The buffer made ahead of an MGET reply is sized from the replies before
// it, within a bound: a huge value read once does not make a later read of
// many small (or missing) keys allocate per key as if each were huge.
func TestAReadAfterAHugeValueMakesNoHugeBuffer(t *testing.T) {
	redistest.RequireReal(t)
	rdb := redistest.Client(t, nil)
	e := testEngine(t, rdb, 1)
	ctx := context.Background()
	p := redistest.Prefix(t)
	require.NoError(t, rdb.Set(ctx, p+":big", strings.Repeat("x", 1<<20), 0).Err())
	wide := make([]string, 1000)
	for i := range wide {
		wide[i] = fmt.Sprintf("%s:w%d", p, i)
	}
	read := func(keys []string) uint64 {
		var a, b runtime.MemStats
		runtime.ReadMemStats(&a)
		_, _, err := e.Run(ctx, &Txn{Keys: keys, Decide: func(*Read) (*Plan, error) { return nil, nil }})
		require.NoError(t, err)
		runtime.ReadMemStats(&b)
		return b.TotalAlloc - a.TotalAlloc
	}
	read(wide)
	before := read(wide)
	read([]string{p + ":big", p + ":x"})
	after := read(wide)
	t.Logf("a 1000-key read: %d KiB; after a 2-key read of a 1 MiB value: %d KiB", before>>10, after>>10)
	require.Less(t, after, before+256<<10)
}
