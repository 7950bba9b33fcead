package reply

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// redisErr is an error reply of Redis, as go-redis types them.
type redisErr string

func (e redisErr) Error() string { return string(e) }
func (redisErr) RedisError()     {}

var _ redis.Error = redisErr("")

// Only Redis's own MOVED, ASK and TRYAGAIN replies are redirections,
// never a message that quotes them, as jobkey's may quote a caller's ID.
func TestOnlyRedisOwnRepliesAreRedirections(t *testing.T) {
	t.Parallel()
	require.False(t, Redirected(errors.New("TRYAGAIN not a redis reply")))
	require.False(t, Redirected(fmt.Errorf("jobkey: job %q: %w", "MOVED 1 x", errors.New("not found"))))
	require.True(t, Redirected(fmt.Errorf("wrapped: %w", redisErr("TRYAGAIN Multiple keys request during rehashing of slot"))))
	require.True(t, Redirected(redisErr("MOVED 3999 127.0.0.1:6381")))
	require.True(t, Redirected(redisErr("ASK 3999 127.0.0.1:6381")))
	require.False(t, Redirected(redisErr("ERR something about TRYAGAIN")))
	require.False(t, Redirected(nil))
}

func TestWrongTypeAndRedisErrorsAreTold(t *testing.T) {
	t.Parallel()
	require.True(t, IsWrongType(redisErr("WRONGTYPE Operation against a key holding the wrong kind of value")))
	require.False(t, IsWrongType(redisErr("ERR no")))
	require.False(t, IsWrongType(nil))
	require.True(t, IsRedisErr(fmt.Errorf("x: %w", redisErr("ERR no"))))
	require.False(t, IsRedisErr(errors.New("i/o timeout")))
}

// A pipeline that failed before any command was answered (a connection
// that could not be set up) reports its error; one whose commands carry
// their own errors does not.
func TestAPipelineThatNoCommandAnsweredIsUnanswered(t *testing.T) {
	t.Parallel()
	broken := errors.New("WRONGPASS")
	get := redis.NewStringCmd(context.Background(), "get", "k")
	require.ErrorIs(t, Unanswered([]redis.Cmder{get}, broken), broken)
	get.SetErr(redis.Nil)
	require.NoError(t, Unanswered([]redis.Cmder{get}, redis.Nil))
	require.NoError(t, Unanswered(nil, nil))
}
