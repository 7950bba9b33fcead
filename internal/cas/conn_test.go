package cas

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Work that goes on in goroutines of its own gets connections of its own:
// a cache serves one goroutine at a time, and a redis.Conn is not safe
// for concurrent use.
func TestWithoutConnCacheGivesEachCallerItsOwnConnection(t *testing.T) {
	node := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialed: Conn is lazy
	defer node.Close()
	ctx, release := WithConnCache(context.Background())
	defer release()
	cached := get(ctx, node)
	if get(ctx, node) != cached {
		t.Fatal("the cache gives its one goroutine the same connection")
	}
	bare := WithoutConnCache(ctx)
	a, b := get(bare, node), get(bare, node)
	defer a.Close()
	defer b.Close()
	if a == cached || b == cached || a == b {
		t.Fatal("without the cache, each get is a connection of its own")
	}
	if WithoutConnCache(context.Background()) != context.Background() {
		t.Fatal("a ctx with no cache is returned as it is")
	}
}
