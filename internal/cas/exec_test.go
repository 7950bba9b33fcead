package cas

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redisclock"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/jobkey/jobkey/internal/resp"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// execPath runs one transaction through one of the engine's three ways to
// send an EXEC: MULTI to EXEC alone, a plain pipeline that ends in WAIT (MinReplicas), and a plain pipeline that carries the next
// flush's round trip 1 (the hand-over).
type execPath struct {
	name string
	run  func(t *testing.T, txn *Txn) (*Read, *Plan, error)
	rdb  *redis.Client
}

func execPaths(t *testing.T) []execPath {
	t.Helper()
	redistest.RequireReal(t)
	plain := redistest.Client(t, nil)
	pe := testEngine(t, plain, 3)

	rep := redistest.StartReplicated(t, 1)
	master := redistest.ClientFor(t, "redis://"+rep.Master.Addr, nil)
	we, err := New(master, Options{Attempts: 3, BaseBackoff: 200 * time.Microsecond, MaxBackoff: 5 * time.Millisecond,
		Clock: &redisclock.Clock{Local: time.Now}, MinReplicas: 1, ReplicaTimeout: 2 * time.Second, SyncKey: func(route string) string { return route + ":sync" }})
	require.NoError(t, err)

	ce := testEngine(t, plain, 3)
	carry := func(t *testing.T, txn *Txn) (*Read, *Plan, error) {
		ctx, release := WithConnCache(context.Background())
		defer release()
		offered := false
		s := &succession{start: func(h *handover) bool {
			offered = true
			require.True(t, h.offer(h.node, func(ctx context.Context, p redis.Pipeliner) { p.Ping(ctx) }))
			return true
		}}
		r, p, err := ce.Run(context.WithValue(ctx, successionKey{}, s), txn)
		require.True(t, offered, "the EXEC carried a successor's read")
		return r, p, err
	}
	return []execPath{
		{"tx-pipeline", func(t *testing.T, txn *Txn) (*Read, *Plan, error) { return pe.Run(context.Background(), txn) }, plain},
		{"wait", func(t *testing.T, txn *Txn) (*Read, *Plan, error) { return we.Run(context.Background(), txn) }, master},
		{"carrying", carry, plain},
	}
}

// A plan's writes land on their own keys whatever their order among the
// transaction's keys: out of order, to an auxiliary key, the same key twice
// (the last one stands), deletes, and writes with and without an expiry,
// with TTLs that differ between neighbours.
func TestWritesLandOnTheirKeysInAnyOrder(t *testing.T) {
	t.Parallel()
	for _, path := range execPaths(t) {
		t.Run(path.name, func(t *testing.T) {
			ctx := context.Background()
			rdb := path.rdb
			p := redistest.Prefix(t)
			k := []string{p + ":k0", p + ":k1", p + ":k2", p + ":k3", p + ":k4"}
			aux := p + ":aux"
			require.NoError(t, rdb.Set(ctx, k[3], "old", 0).Err())
			require.NoError(t, rdb.Set(ctx, k[2], "old", time.Hour).Err())
			require.NoError(t, rdb.Set(ctx, aux, "old", 0).Err())
			_, _, err := path.run(t, &Txn{Keys: k, Aux: []string{aux}, Decide: func(r *Read) (*Plan, error) {
				return &Plan{Writes: []Write{
					{Key: k[3], Del: true},
					{Key: k[0], Value: []byte("v0"), TTL: 5 * time.Second},
					{Key: aux, Value: []byte("va")},
					{Key: k[4], Value: []byte("v4")},
					{Key: k[1], Value: []byte("v1"), TTL: 5 * time.Second},
					{Key: k[2], Value: []byte("v2"), TTL: 7 * time.Second},
					{Key: k[0], Value: []byte("v0b"), TTL: 9 * time.Second},
				}, Steps: [][]any{{"incr", p + ":n"}}}, nil
			}})
			require.NoError(t, err)
			want := map[string]struct {
				val string
				ttl time.Duration // -1: none; 0: key gone
			}{
				k[0]: {"v0b", 9 * time.Second}, k[1]: {"v1", 5 * time.Second}, k[2]: {"v2", 7 * time.Second},
				k[3]: {"", 0}, k[4]: {"v4", -1}, aux: {"va", -1}, p + ":n": {"1", -1},
			}
			for key, w := range want {
				if w.ttl == 0 {
					require.Zero(t, rdb.Exists(ctx, key).Val(), key)
					continue
				}
				require.Equal(t, w.val, rdb.Get(ctx, key).Val(), key)
				ttl := rdb.PTTL(ctx, key).Val()
				if w.ttl < 0 {
					require.Equal(t, time.Duration(-1), ttl, key)
				} else {
					require.InDelta(t, w.ttl.Milliseconds(), ttl.Milliseconds(), 2000, key)
				}
			}
		})
	}
}

// A step that fails in EXEC is reported with every command, each write by
// its own key, whichever way the EXEC went; an aborted EXEC the same.
func TestAStepErrorNamesEveryWriteByItsKeyOnEveryPath(t *testing.T) {
	t.Parallel()
	for _, path := range execPaths(t) {
		t.Run(path.name, func(t *testing.T) {
			ctx := context.Background()
			rdb := path.rdb
			p := redistest.Prefix(t)
			k := []string{p + ":k0", p + ":k1", p + ":k2"}
			require.NoError(t, rdb.Set(ctx, p+":str", "a string", 0).Err())
			plan := func(step []any) func(*Read) (*Plan, error) {
				return func(*Read) (*Plan, error) {
					return &Plan{Writes: []Write{
						{Key: k[2], Value: []byte("v2")},
						{Key: k[0], Del: true},
						{Key: k[1], Value: []byte("v1"), TTL: time.Minute},
					}, Steps: [][]any{step}}, nil
				}
			}
			_, _, err := path.run(t, &Txn{Keys: k, Decide: plan([]any{"sadd", p + ":str", "m"})})
			var se *StepError
			require.ErrorAs(t, err, &se)
			require.False(t, se.Aborted)
			got := make([]string, len(se.Steps))
			for i, s := range se.Steps {
				got[i] = s.Cmd
			}
			require.Equal(t, []string{"set " + k[2], "del " + k[0], "set " + k[1], "sadd " + p + ":str"}, got)
			require.NoError(t, se.Steps[0].Err)
			require.ErrorContains(t, se.Steps[3].Err, "WRONGTYPE")
			require.Equal(t, "v2", rdb.Get(ctx, k[2]).Val(), "the steps around the failed one applied")

			require.NoError(t, rdb.Set(ctx, k[0], "kept", 0).Err())
			_, _, err = path.run(t, &Txn{Keys: k, Decide: plan([]any{"zadd", p + ":z"})}) // wrong arity
			require.ErrorAs(t, err, &se)
			require.True(t, se.Aborted)
			require.Len(t, se.Steps, 4)
			require.Equal(t, "del "+k[0], se.Steps[1].Cmd)
			require.ErrorContains(t, se.Steps[3].Err, "wrong number")
			require.Equal(t, "kept", rdb.Get(ctx, k[0]).Val(), "an aborted EXEC applied nothing")
		})
	}
}

// A watched key changed between the read and EXEC is a conflict, retried,
// whichever way the EXEC went.
func TestARivalWriteBeforeEXECIsRetriedOnEveryPath(t *testing.T) {
	t.Parallel()
	for _, path := range execPaths(t) {
		t.Run(path.name, func(t *testing.T) {
			ctx := context.Background()
			rdb := path.rdb
			p := redistest.Prefix(t)
			k := []string{p + ":k0", p + ":k1"}
			n := 0
			_, _, err := path.run(t, &Txn{Keys: k, Decide: func(r *Read) (*Plan, error) {
				n++
				if n == 1 {
					require.NoError(t, rdb.Set(ctx, k[1], "rival", 0).Err())
				}
				return &Plan{Writes: []Write{{Key: k[1], Value: []byte("mine " + r.Values[1].S)}}}, nil
			}})
			require.NoError(t, err)
			require.Equal(t, 2, n, "one conflict, one retry")
			require.Equal(t, "mine rival", rdb.Get(ctx, k[1]).Val())
		})
	}
}

// pipelineHook runs h in place of each pipeline that holds an EXEC.
type pipelineHook func(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error

func (h pipelineHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h pipelineHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h pipelineHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "exec" }) {
			return next(ctx, cmds)
		}
		return h(ctx, cmds, next)
	}
}

// writeAndStep writes "new" to k[0] and runs step in the same EXEC.
func writeAndStep(k []string, step []any) *Txn {
	return &Txn{Keys: k, Decide: func(*Read) (*Plan, error) {
		return &Plan{Writes: []Write{{Key: k[0], Value: []byte("new")}}, Steps: [][]any{step}}, nil
	}}
}

// An error of Redis's own type that go-redis returns for an EXEC pipeline
// before any reply (a re-dial whose set-up Redis refused: go-redis marks no
// command with it) is an unknown outcome, never a StepError that says EXEC
// ran and its steps applied.
func TestAnErrorBeforeAnyReplyOfEXECIsAnUnknownOutcome(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t, nil)
	rdb.AddHook(pipelineHook(func(context.Context, []redis.Cmder, redis.ProcessPipelineHook) error {
		return resp.Error("ERR max number of clients reached")
	}))
	e := testEngine(t, rdb, 1)
	p := redistest.Prefix(t)
	k := []string{p + ":a", p + ":b"}
	_, _, err := e.Run(context.Background(), writeAndStep(k, []any{"incr", p + ":n"}))
	require.ErrorIs(t, err, ErrOutcomeUnknown)
	var se *StepError
	require.False(t, errors.As(err, &se), "a StepError says EXEC ran: %v", err)
	require.Zero(t, rdb.Exists(context.Background(), k[0], p+":n").Val())
}

// A MULTI that Redis refuses (an ACL without it) is a StepError: Redis ran
// each command as it came, so the ones it did not refuse applied (Aborted
// false), and when it refused every one, nothing was written (Aborted).
// The WATCH is released either way: the next transaction on the
// connection is not aborted by it.
func TestARefusedMULTIIsAStepErrorThatSaysWhatApplied(t *testing.T) {
	t.Parallel()
	admin := redistest.Client(t, nil)
	ctx := context.Background()
	p := redistest.Prefix(t)
	for _, tc := range []struct {
		name, deny string
		applied    bool
	}{
		{"steps run", "-multi", true},
		{"steps refused", "-multi -@write", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user := strings.NewReplacer(":", "_", " ", "_").Replace(p + tc.name)
			args := append([]any{"acl", "setuser", user, "on", ">pw", "~*", "&*", "+@all"}, anySlice(strings.Fields(tc.deny))...)
			require.NoError(t, admin.Do(ctx, args...).Err())
			t.Cleanup(func() { admin.Do(context.Background(), "acl", "deluser", user) })
			rdb := redistest.Client(t, func(o *redis.Options) { o.Username, o.Password = user, "pw" })
			e := testEngine(t, rdb, 1)
			k := []string{p + tc.name + ":a", p + tc.name + ":b"}
			_, _, err := e.Run(ctx, writeAndStep(k, []any{"sadd", p + tc.name + ":s", "m"}))
			var se *StepError
			require.ErrorAs(t, err, &se)
			require.Equal(t, !tc.applied, se.Aborted)
			written := admin.Exists(ctx, k[0]).Val() == 1
			require.Equal(t, tc.applied, written)
		})
	}
}

func anySlice(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}
