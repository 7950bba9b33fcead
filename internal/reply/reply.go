// Package reply reads go-redis replies as every part of jobkey must: a
// pipeline that failed before any command was answered, Redis's own error
// replies (WRONGTYPE, MOVED, ASK, TRYAGAIN), and a GET as a value, a
// missing key or an error. Only Redis's own replies are looked at, never
// jobkey's messages, which may quote IDs.
package reply

import (
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Unanswered returns err when a pipeline failed without any command
// carrying an error. go-redis does that when it cannot set up the
// connection (a wrong password, a refused SELECT), and the commands' empty
// results must then not be read as answers.
func Unanswered(cmds []redis.Cmder, err error) error {
	if err == nil {
		return nil
	}
	for _, c := range cmds {
		if c.Err() != nil {
			return nil
		}
	}
	return err
}

// IsRedisErr reports an error that Redis replied with, as opposed to one
// of the network or of the context.
func IsRedisErr(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr)
}

// IsWrongType reports Redis's WRONGTYPE reply: the key holds another type.
func IsWrongType(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE")
}

// Redirected reports a reply of Redis itself saying that the hash slot
// lives, or is moving, elsewhere: MOVED, ASK or TRYAGAIN.
func Redirected(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	return strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ") || strings.HasPrefix(msg, "TRYAGAIN ")
}

// Raw is one key as a GET read it: its bytes, or that it is missing, or
// the error reading it gave (WRONGTYPE for a key of another type).
type Raw struct {
	S       string
	Missing bool
	Err     error
}

// FromGet turns a GET's reply into a Raw.
func FromGet(g *redis.StringCmd) Raw {
	s, err := g.Result()
	if errors.Is(err, redis.Nil) {
		return Raw{Missing: true}
	}
	return Raw{S: s, Err: err}
}
