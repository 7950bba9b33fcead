package redact

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

func TestURLHidesThePasswordParsedOrNot(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"redis://admin:S3cret@host:6379/0", "redis://admin:xxxxx@host:6379/0"},
		{"redis://admin:S3cret@host:port/", "redis://admin:xxxxx@host:port/"}, // does not parse
		{"rediss://:S3cret@host", "rediss://:xxxxx@host"},
		{"redis://admin:S3/cr@et@host/1", "redis://admin:xxxxx@host/1"}, // unescaped / and @
		{"redis://S3cret@host", "redis://xxxxx@host"},
		{"admin:S3cret@host:6379", "admin:xxxxx@host:6379"},
		{"redis://host:6379/0", "redis://host:6379/0"},
		{"unix://admin:S3cret@/tmp/redis.sock", "unix://admin:xxxxx@/tmp/redis.sock"},
		{"", ""},
		{"@", "@"},
		{"redis://@host", "redis://@host"},
	} {
		require.Equal(t, c.want, URL(c.in), c.in)
	}
}

// The errors that parsing a URL gives never carry its password, whole or
// in part, once redacted.
func TestErrorHidesThePasswordInParseErrors(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"redis://admin:S3cret@host:port/",
		"redis://admin:S3cret@ho st/",
		"redis://admin:S3%zcret@host/",
		"redis://admin:S3cret@host/notadb",
		"redsi://admin:S3cret@host/",
		"redis://admin:S3%21cret@host:port/",
	} {
		_, err := redis.ParseURL(u)
		require.Error(t, err, u)
		got := Error(fmt.Errorf("-redis %q: %w", u, err), u)
		for _, secret := range []string{"S3cret", "S3%zcret", "%zc", "S3!cret", "S3%21cret"} {
			require.NotContains(t, got.Error(), secret, u)
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			require.ErrorAs(t, got, &ue, "the cause is still there")
		}
	}
	ctxErr := Error(fmt.Errorf("redis://a:S3cret@h: %w", context.Canceled), "redis://a:S3cret@h")
	require.ErrorIs(t, ctxErr, context.Canceled)
	require.Equal(t, "redis://a:xxxxx@h: context canceled", ctxErr.Error())
	plain := errors.New("nothing secret")
	require.Same(t, plain, Error(plain, "redis://a:S3cret@h"))
	require.NoError(t, Error(nil, "redis://a:S3cret@h"))
}
