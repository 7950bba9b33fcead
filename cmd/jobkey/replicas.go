package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redact"
)

// The commands that write wait for replicas as jobkey's Config.MinReplicas
// and Config.ReplicaTimeout say, set by the first of: the flags
// -min-replicas and -replica-timeout, the Redis URL's query parameters
// min_replicas and replica_timeout, and the environment's
// JOBKEY_MIN_REPLICAS and JOBKEY_REPLICA_TIMEOUT. Every command takes a URL
// that carries them: they are cut off before go-redis reads the URL, which
// would refuse them.
const (
	minReplicasParam    = "min_replicas"
	replicaTimeoutParam = "replica_timeout"
	minReplicasEnv      = "JOBKEY_MIN_REPLICAS"
	replicaTimeoutEnv   = "JOBKEY_REPLICA_TIMEOUT"
)

// replicaSetting is how the command's writes wait for replicas.
type replicaSetting struct {
	minReplicas int           // Config.MinReplicas; 0: no wait
	timeout     time.Duration // Config.ReplicaTimeout; 0: jobkey's default
}

// config returns a queue's Config under prefix, with shards, that waits as
// s says.
func (s replicaSetting) config(prefix string, shards int) *jobkey.Config {
	return &jobkey.Config{Prefix: prefix, Shards: shards, MinReplicas: s.minReplicas, ReplicaTimeout: s.timeout}
}

// replicaFlags are -min-replicas and -replica-timeout, of the commands that
// write, and the setting resolve made of them.
type replicaFlags struct {
	min     intFlag
	timeout durationFlag
	setting replicaSetting
}

func (f *replicaFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.min, "min-replicas", "writes wait until `N` replicas confirm them (jobkey's Config.MinReplicas); "+
		"one they do not confirm is reported as applied on the master only, and the command exits non-zero "+
		"(default: the URL's "+minReplicasParam+"=N, else $"+minReplicasEnv+", else 0: no wait)")
	fs.Var(&f.timeout, "replica-timeout", "how long a write waits for -min-replicas, a `duration` (Config.ReplicaTimeout, 1ms to 1m; "+
		"default: the URL's "+replicaTimeoutParam+"=D, else $"+replicaTimeoutEnv+", else 1s)")
}

// resolve returns (and keeps) the setting for the Redis URL u: each value
// from the flag, else u's query, else the environment.
func (f *replicaFlags) resolve(u string) (replicaSetting, error) {
	_, inURL, err := splitReplicaParams(u)
	if err != nil {
		return replicaSetting{}, err
	}
	n, timeout := f.min, f.timeout
	if !n.set {
		if n, err = fromEnv(inURL.min, minReplicasEnv, parseMinReplicas); err != nil {
			return replicaSetting{}, err
		}
	}
	if !timeout.set {
		if timeout, err = fromEnv(inURL.timeout, replicaTimeoutEnv, parseReplicaTimeout); err != nil {
			return replicaSetting{}, err
		}
	}
	f.setting = replicaSetting{minReplicas: n.n, timeout: timeout.d}
	return f.setting, nil
}

// fromEnv is v when it was set (by the URL), else the environment variable
// env parsed with parse, else unset.
func fromEnv[T interface{ isSet() bool }](v T, env string, parse func(string) (T, error)) (T, error) {
	if v.isSet() {
		return v, nil
	}
	s := os.Getenv(env)
	if s == "" {
		return v, nil
	}
	out, err := parse(s)
	if err != nil {
		return out, fmt.Errorf("$%s: %w", env, err)
	}
	return out, nil
}

// urlReplicas are the values of a Redis URL's min_replicas and
// replica_timeout.
type urlReplicas struct {
	min     intFlag
	timeout durationFlag
}

// splitReplicaParams cuts min_replicas and replica_timeout off the query
// of the Redis URL u, and returns the rest of u and their values. A URL
// without them is returned as it is. Its errors never hold the password.
func splitReplicaParams(u string) (string, urlReplicas, error) {
	var p urlReplicas
	base, query, ok := strings.Cut(u, "?")
	if !ok {
		return u, p, nil
	}
	query, fragment, hasFragment := strings.Cut(query, "#")
	vals, err := url.ParseQuery(query)
	if err != nil || !vals.Has(minReplicasParam) && !vals.Has(replicaTimeoutParam) {
		return u, p, nil // go-redis judges the rest of the query
	}
	bad := func(param string, err error) error {
		return fmt.Errorf("-redis %s: %s: %w", redact.URL(u), param, err)
	}
	for _, param := range []string{minReplicasParam, replicaTimeoutParam} {
		if len(vals[param]) > 1 {
			return "", p, bad(param, errors.New("given twice: give it once"))
		}
	}
	if vals.Has(minReplicasParam) {
		if p.min, err = parseMinReplicas(vals.Get(minReplicasParam)); err != nil {
			return "", p, bad(minReplicasParam, err)
		}
	}
	if vals.Has(replicaTimeoutParam) {
		if p.timeout, err = parseReplicaTimeout(vals.Get(replicaTimeoutParam)); err != nil {
			return "", p, bad(replicaTimeoutParam, err)
		}
	}
	vals.Del(minReplicasParam)
	vals.Del(replicaTimeoutParam)
	rest := base
	if q := vals.Encode(); q != "" {
		rest += "?" + q
	}
	if hasFragment {
		rest += "#" + fragment
	}
	return rest, p, nil
}

// intFlag is a count that remembers whether it was given.
type intFlag struct {
	n   int
	set bool
}

func parseMinReplicas(s string) (intFlag, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return intFlag{}, fmt.Errorf("%q: want a count of replicas, 0 or more", s)
	}
	return intFlag{n: n, set: true}, nil
}

func (f *intFlag) Set(s string) (err error) {
	*f, err = parseMinReplicas(s)
	return err
}

// String is "" when the flag was not given, so that the usage prints no
// default of its own.
func (f *intFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	return strconv.Itoa(f.n)
}

func (f intFlag) isSet() bool { return f.set }

// durationFlag is a duration that remembers whether it was given.
type durationFlag struct {
	d   time.Duration
	set bool
}

func parseReplicaTimeout(s string) (durationFlag, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return durationFlag{}, fmt.Errorf("%q: want a duration such as 500ms or 2s", s)
	}
	return durationFlag{d: d, set: true}, nil
}

func (f *durationFlag) Set(s string) (err error) {
	*f, err = parseReplicaTimeout(s)
	return err
}

func (f *durationFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	return f.d.String()
}

func (f durationFlag) isSet() bool { return f.set }

// masterOnlyError is the error of a write the replicas did not confirm in
// time: what it did, applied on the master only, which a failover may
// still undo. It wraps the *jobkey.ReplicationError, so it matches
// jobkey.ErrNotReplicated.
type masterOnlyError struct {
	done string // what was done: `cancel: job "x" canceled`
	err  error
}

// masterOnly returns err, a write's error, as what the command says of
// it: a *masterOnlyError when the replicas did not confirm it, else err.
func masterOnly(done string, err error) error {
	if !errors.Is(err, jobkey.ErrNotReplicated) {
		return err
	}
	return &masterOnlyError{done: done, err: err}
}

func (e *masterOnlyError) Error() string {
	return e.done + " on the master only: " + notConfirmed(e.err)
}

func (e *masterOnlyError) Unwrap() error { return e.err }

// notConfirmed says why a write matching ErrNotReplicated is not safe: how
// many replicas confirmed it, and what may undo it.
func notConfirmed(err error) string {
	var re *jobkey.ReplicationError
	if !errors.As(err, &re) {
		return strings.TrimPrefix(err.Error(), "jobkey: ")
	}
	s := fmt.Sprintf("%d of %d replicas confirmed it within %v, so a failover now may undo it (jobkey stats shows how far behind they are)",
		re.Acked, re.Want, re.Timeout)
	if re.Err != nil {
		s += ": " + re.Err.Error()
	}
	return s
}
