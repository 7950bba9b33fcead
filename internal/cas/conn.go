package cas

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// connCache keeps the dedicated connections of one goroutine's run of
// transactions, such as a group-commit leader flushing batch after batch:
// wrapping a pooled connection anew (Client.Conn) for every attempt costs
// allocations and a trip through go-redis's pool on the hot path. It lives
// no longer than that run, so no connection stays out of the pool while
// the caller is idle. One goroutine uses a cache at a time.
type connCache struct {
	conns map[*redis.Client]*redis.Conn
}

type connCacheKey struct{}

// WithConnCache returns ctx carrying a new cache of connections for the
// transactions run under it, one goroutine at a time, and the func that
// releases its connections.
func WithConnCache(ctx context.Context) (context.Context, func()) {
	c := &connCache{}
	return context.WithValue(ctx, connCacheKey{}, c), c.release
}

// release closes the cache's connections, giving them back to the pool.
// The cache may be used again after.
func (c *connCache) release() {
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	clear(c.conns)
}

// WithoutConnCache returns ctx without its cache of connections, for work
// that goes on in goroutines of its own: a cache serves one goroutine at a
// time, and a redis.Conn is not safe for concurrent use.
func WithoutConnCache(ctx context.Context) context.Context {
	if cacheOf(ctx) == nil {
		return ctx
	}
	return context.WithValue(ctx, connCacheKey{}, (*connCache)(nil))
}

// cacheOf returns ctx's cache, or nil.
func cacheOf(ctx context.Context) *connCache {
	c, _ := ctx.Value(connCacheKey{}).(*connCache)
	return c
}

// get returns a dedicated connection to node: the cached one, when ctx
// carries a cache, else a new one.
func get(ctx context.Context, node *redis.Client) *redis.Conn {
	c := cacheOf(ctx)
	if c == nil {
		return node.Conn()
	}
	if conn, ok := c.conns[node]; ok {
		return conn
	}
	conn := node.Conn()
	if c.conns == nil {
		c.conns = map[*redis.Client]*redis.Conn{}
	}
	c.conns[node] = conn
	return conn
}

// put gives back a connection: kept in ctx's cache when healthy, closed
// otherwise (or when there is no cache).
func put(ctx context.Context, node *redis.Client, conn *redis.Conn, healthy bool) {
	c := cacheOf(ctx)
	if c != nil && healthy && c.conns[node] == conn {
		return
	}
	if c != nil && c.conns[node] == conn {
		delete(c.conns, node)
	}
	_ = conn.Close()
}

// forget takes conn out of ctx's cache without closing it: it is another
// flush's now.
func forget(ctx context.Context, node *redis.Client, conn *redis.Conn) {
	if c := cacheOf(ctx); c != nil && c.conns[node] == conn {
		delete(c.conns, node)
	}
}

// adopt puts conn, handed over by the flush before, in ctx's cache, so the
// flush's later transactions on node go on using it.
func adopt(ctx context.Context, node *redis.Client, conn *redis.Conn) {
	c := cacheOf(ctx)
	if c == nil {
		return
	}
	if _, ok := c.conns[node]; ok {
		return
	}
	if c.conns == nil {
		c.conns = map[*redis.Client]*redis.Conn{}
	}
	c.conns[node] = conn
}
