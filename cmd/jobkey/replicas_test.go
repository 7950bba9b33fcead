package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A Redis URL carries min_replicas and replica_timeout for jobkey; go-redis,
// which refuses a query parameter it does not know, never sees them.
func TestSplitReplicaParams(t *testing.T) {
	for _, c := range []struct {
		in, rest string
		min      int
		timeout  time.Duration
	}{
		{"redis://h:6379/0", "redis://h:6379/0", 0, 0},
		{"redis://:" + secret + "@h:6379/0?min_replicas=2", "redis://:" + secret + "@h:6379/0", 2, 0},
		{"rediss://h:6379?replica_timeout=1500ms&dial_timeout=3s&min_replicas=1", "rediss://h:6379?dial_timeout=3s", 1, 1500 * time.Millisecond},
		{"redis+sentinel://s1:26379,s2:26379/mymaster?min_replicas=1", "redis+sentinel://s1:26379,s2:26379/mymaster", 1, 0},
		{"redis://h:6379?dial_timeout=3s", "redis://h:6379?dial_timeout=3s", 0, 0},
	} {
		rest, p, err := splitReplicaParams(c.in)
		require.NoError(t, err, c.in)
		require.Equal(t, c.rest, rest, c.in)
		require.Equal(t, c.min, p.min.n, c.in)
		require.Equal(t, c.min > 0, p.min.set, c.in)
		require.Equal(t, c.timeout, p.timeout.d, c.in)
	}
	for _, bad := range []string{
		"redis://:" + secret + "@h:6379?min_replicas=x",
		"redis://:" + secret + "@h:6379?min_replicas=-1",
		"redis://:" + secret + "@h:6379?replica_timeout=soon",
		"redis://:" + secret + "@h:6379?min_replicas=1&min_replicas=2",
	} {
		_, _, err := splitReplicaParams(bad)
		require.Error(t, err, bad)
		requireNoSecret(t, bad, err)
	}
}

// Each value comes from the flag, else the URL, else the environment.
func TestReplicaSettingPrecedence(t *testing.T) {
	resolve := func(args []string, url string) replicaSetting {
		t.Helper()
		var rf replicaFlags
		fs := newFlagSet(&rf)
		require.NoError(t, parseFlags(fs, args))
		s, err := rf.resolve(url)
		require.NoError(t, err)
		return s
	}
	t.Setenv(minReplicasEnv, "")
	t.Setenv(replicaTimeoutEnv, "")
	require.Equal(t, replicaSetting{}, resolve(nil, "redis://h"), "no wait by default")
	t.Setenv(minReplicasEnv, "1")
	t.Setenv(replicaTimeoutEnv, "3s")
	require.Equal(t, replicaSetting{1, 3 * time.Second}, resolve(nil, "redis://h"))
	require.Equal(t, replicaSetting{2, 3 * time.Second}, resolve(nil, "redis://h?min_replicas=2"))
	require.Equal(t, replicaSetting{0, 500 * time.Millisecond}, resolve([]string{"-min-replicas", "0", "-replica-timeout", "500ms"}, "redis://h?min_replicas=2"))
	t.Setenv(minReplicasEnv, "many")
	var rf replicaFlags
	require.NoError(t, parseFlags(newFlagSet(&rf), nil))
	_, err := rf.resolve("redis://h")
	require.ErrorContains(t, err, "$JOBKEY_MIN_REPLICAS")
}

// Every command that writes takes -min-replicas and -replica-timeout;
// those that only read do not.
func TestWritingCommandsTakeTheReplicaFlags(t *testing.T) {
	writes := map[string]bool{"verify": true, "ui": true, "retry": true, "cancel": true, "delete": true,
		"pause": true, "resume": true, "limit": true, "migrate-asynq": true, "migrate-to-asynq": true, "events": true}
	for cmd, args := range commandArgs {
		if cmd == "bench" {
			continue // its own -min-replicas, for the benchmark's queues
		}
		var out, errOut bytes.Buffer
		all := append([]string{cmd, "-redis", "redis://127.0.0.1:1", "-replica-timeout", "soon"}, args...)
		err := run(context.Background(), all, &out, &errOut)
		require.Error(t, err, cmd)
		if writes[cmd] {
			require.Contains(t, err.Error(), `"soon": want a duration`, cmd)
		} else {
			require.Contains(t, err.Error(), "flag provided but not defined: -replica-timeout", cmd)
		}
	}
}

// newFlagSet is a flag set with rf's flags only.
func newFlagSet(rf *replicaFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	rf.register(fs)
	return fs
}

// The migrations open their jobkey queue with the setting, read as the
// other commands read it.
func TestMigrationsTakeTheReplicaSetting(t *testing.T) {
	t.Setenv(minReplicasEnv, "")
	t.Setenv(replicaTimeoutEnv, "")
	for _, c := range []struct {
		args []string
		want replicaSetting
	}{
		{[]string{"-redis", "redis://h", "-min-replicas", "2", "-replica-timeout", "3s"}, replicaSetting{2, 3 * time.Second}},
		{[]string{"-redis", "redis://h?min_replicas=1"}, replicaSetting{1, 0}},
		{[]string{"-redis", "redis://h"}, replicaSetting{}},
	} {
		var m migrateFlags
		require.NoError(t, m.parse("migrate-asynq", append(c.args, "-type", "t", "-to", "q"), io.Discard, "from-queue", "to", ""), c.args)
		require.Equal(t, c.want, m.replicas.setting, c.args)
		cfg := m.replicas.setting.config("p", 0)
		require.Equal(t, c.want.minReplicas, cfg.MinReplicas, c.args)
		require.Equal(t, c.want.timeout, cfg.ReplicaTimeout, c.args)
	}
}
