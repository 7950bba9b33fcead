package cas

import (
	"context"
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
		{"keys", shortReply{name: "mget", arg: keys[0]}},
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
