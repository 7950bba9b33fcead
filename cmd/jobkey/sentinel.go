package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jobkey/jobkey/internal/redact"
	"github.com/redis/go-redis/v9"
)

// Sentinel URLs name the Sentinels and the master they watch:
//
//	redis+sentinel://[[user]:password@]host:port[,host:port...]/mastername[/db]
//
// The user and password are percent-decoded, as in redis:// URLs.
// rediss+sentinel:// is the same over TLS. The password is the master's
// (and its replicas'); the Sentinels are asked without one.
const (
	sentinelScheme    = "redis+sentinel://"
	sentinelTLSScheme = "rediss+sentinel://"
)

// isSentinelURL reports a redis+sentinel:// or rediss+sentinel:// URL.
func isSentinelURL(u string) bool {
	return strings.HasPrefix(u, sentinelScheme) || strings.HasPrefix(u, sentinelTLSScheme)
}

// parseSentinelURL turns a Sentinel URL into a FailoverClient's options.
// Its errors never hold the password.
func parseSentinelURL(u string) (*redis.FailoverOptions, error) {
	bad := func(why string) error {
		return fmt.Errorf("-redis %s: not a Sentinel URL (redis+sentinel://[:password@]host:port[,host:port]/mastername[/db]): %s",
			redact.URL(u), why)
	}
	o := &redis.FailoverOptions{}
	rest, ok := strings.CutPrefix(u, sentinelScheme)
	if !ok {
		rest = strings.TrimPrefix(u, sentinelTLSScheme)
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		user, pass, hasPass := strings.Cut(rest[:at], ":")
		if !hasPass {
			user, pass = "", user // a lone word is the password, as redis:// reads it
		}
		// Percent-decoded, as redis:// reads them, so that a password can
		// hold "@", ":" or "/". The error names neither.
		var err error
		if o.Username, err = url.PathUnescape(user); err != nil {
			return nil, bad("the user name has a bad %-escape")
		}
		if o.Password, err = url.PathUnescape(pass); err != nil {
			return nil, bad("the password has a bad %-escape")
		}
		rest = rest[at+1:]
	}
	if q := strings.IndexAny(rest, "?#"); q >= 0 {
		return nil, bad("it takes no query")
	}
	hosts, path, _ := strings.Cut(rest, "/")
	for _, h := range strings.Split(hosts, ",") {
		host, port, err := net.SplitHostPort(h)
		if err != nil || host == "" {
			return nil, bad(fmt.Sprintf("%q is not host:port", h))
		}
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return nil, bad(fmt.Sprintf("%q has no valid port", h))
		}
		o.SentinelAddrs = append(o.SentinelAddrs, h)
	}
	name, db, hasDB := strings.Cut(path, "/")
	if name == "" {
		return nil, bad("the master's name is missing")
	}
	o.MasterName = name
	if hasDB {
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 {
			return nil, bad(fmt.Sprintf("%q is not a database number", db))
		}
		o.DB = n
	}
	return o, nil
}

// connectSentinel opens the master a Sentinel URL names, and fails at
// once, in one line, when it cannot be reached.
func connectSentinel(ctx context.Context, u string) (redis.UniversalClient, error) {
	o, err := parseSentinelURL(u)
	if err != nil {
		return nil, err
	}
	o.DialTimeout, o.MaxRetries = 2*time.Second, 1
	c := redis.NewFailoverClient(o)
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		var answered redis.Error
		if errors.As(err, &answered) {
			return nil, fmt.Errorf("connect to Redis through the Sentinels %s: %w", strings.Join(o.SentinelAddrs, ","), redact.Error(err, u))
		}
		return nil, fmt.Errorf("cannot reach master %q through the Sentinels %s: %w", o.MasterName, strings.Join(o.SentinelAddrs, ","), redact.Error(err, u))
	}
	return c, nil
}
