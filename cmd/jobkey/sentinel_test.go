package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/jobkey/jobkey"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

func TestParseSentinelURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url                string
		addrs              []string
		user, pass, master string
		db                 int
		tls                bool
	}{
		{url: "redis+sentinel://h1:26379/mymaster", addrs: []string{"h1:26379"}, master: "mymaster"},
		{url: "redis+sentinel://:s3cret@h1:26379,h2:26380/m/2", addrs: []string{"h1:26379", "h2:26380"}, pass: "s3cret", master: "m", db: 2},
		{url: "redis+sentinel://ada:s3cret@[::1]:26379/m", addrs: []string{"[::1]:26379"}, user: "ada", pass: "s3cret", master: "m"},
		{url: "rediss+sentinel://s3cret@h1:1/m", addrs: []string{"h1:1"}, pass: "s3cret", master: "m", tls: true},
	} {
		o, err := parseSentinelURL(tc.url)
		require.NoError(t, err, tc.url)
		require.Equal(t, tc.addrs, o.SentinelAddrs, tc.url)
		require.Equal(t, tc.user, o.Username, tc.url)
		require.Equal(t, tc.pass, o.Password, tc.url)
		require.Equal(t, tc.master, o.MasterName, tc.url)
		require.Equal(t, tc.db, o.DB, tc.url)
		require.Equal(t, tc.tls, o.TLSConfig != nil, tc.url)
	}
	for _, bad := range []string{
		"redis+sentinel://:s3cret@h1:26379",    // no master name
		"redis+sentinel://:s3cret@h1:26379/",   // empty master name
		"redis+sentinel://:s3cret@h1/m",        // no port
		"redis+sentinel://:s3cret@h1:99999/m",  // bad port
		"redis+sentinel://:s3cret@h1:1,:2/m",   // no host
		"redis+sentinel://:s3cret@h1:1/m/x",    // bad db
		"redis+sentinel://:s3cret@h1:1/m?db=1", // a query
	} {
		_, err := parseSentinelURL(bad)
		require.Error(t, err, bad)
		require.NotContains(t, err.Error(), "s3cret", "the password is never printed")
		require.Contains(t, err.Error(), "xxxxx", bad)
	}
}

// A Sentinel that cannot be reached is said in one line, without the
// password.
func TestConnectSentinelUnreachableHidesThePassword(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"stats", "-redis", "redis+sentinel://:s3cret@127.0.0.1:1/m", "-queue", "q"}, &out, &errOut)
	require.ErrorContains(t, err, "cannot reach master \"m\" through the Sentinels 127.0.0.1:1")
	require.NotContains(t, err.Error()+out.String()+errOut.String(), "s3cret")
}

// jobkey stats, given a Sentinel URL, reads the queue on the master the
// Sentinels name and shows its replica and how far behind it is; the UI
// serves the same queue.
func TestStatsAndUIThroughSentinel(t *testing.T) {
	t.Parallel()
	s := redistest.StartSentinel(t, 1)
	ctx := context.Background()
	rdb := s.Client(t, nil)
	prefix := redistest.Prefix(t)
	q, err := jobkey.NewQueue(rdb, "mail", &jobkey.Config{Prefix: prefix})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "t", nil, &jobkey.EnqueueOpts{ID: "j1"})
	require.NoError(t, err)

	var out, errOut bytes.Buffer
	require.NoError(t, run(ctx, []string{"stats", "-redis", s.URL(), "-queue", "mail", "-prefix", prefix}, &out, &errOut), errOut.String())
	require.Contains(t, out.String(), "| mail | 1 | 1 | 0 |")
	require.Contains(t, out.String(), fmt.Sprintf("| 1 | %s | online |", s.Replicas[0].Addr))

	base, stop := startUI(t, "-redis", s.URL(), "-prefix", prefix)
	resp, body := get(t, base+"queue?name=mail&state=pending")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, "j1")
	require.NoError(t, stop())
}

// On a cluster with replicas, jobkey stats shows each master's replica.
func TestStatsShowsEachClusterMastersReplica(t *testing.T) {
	t.Parallel()
	cl := redistest.StartClusterWithReplicas(t, 3, 1)
	ctx := context.Background()
	rdb := cl.Client(t, nil)
	prefix := redistest.Prefix(t)
	q, err := jobkey.NewQueue(rdb, "mail", &jobkey.Config{Prefix: prefix})
	require.NoError(t, err)
	_, err = q.Enqueue(ctx, "t", nil, nil)
	require.NoError(t, err)

	var out, errOut bytes.Buffer
	require.NoError(t, run(ctx, []string{"stats", "-redis", "redis://" + cl.Nodes[0].Addr, "-queue", "mail", "-prefix", prefix}, &out, &errOut), errOut.String())
	for _, m := range cl.Masters() {
		r := cl.ReplicaOf(m)
		require.NotNil(t, r)
		require.Contains(t, out.String(), fmt.Sprintf("| %s | 1 | %s | online |", m.Addr, r.Addr))
	}
}

func TestParseReplication(t *testing.T) {
	t.Parallel()
	info := "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n" +
		"slave0:ip=127.0.0.1,port=7001,state=online,offset=900,lag=0\r\n" +
		"slave1:ip=127.0.0.1,port=7002,state=wait_bgsave,offset=0,lag=3\r\n" +
		"master_failover_state:no-failover\r\nmaster_repl_offset:1000\r\n"
	m := parseReplication("127.0.0.1:7000", info)
	require.Equal(t, masterReplication{Addr: "127.0.0.1:7000", Offset: 1000, Replicas: []replicaState{
		{Addr: "127.0.0.1:7001", State: "online", Behind: 100},
		{Addr: "127.0.0.1:7002", State: "wait_bgsave", Behind: 1000, Lag: 3},
	}}, m)
	var out bytes.Buffer
	printReplication(&out, []masterReplication{m, {Addr: "127.0.0.1:7010"}})
	require.Contains(t, out.String(), "| 127.0.0.1:7000 | 1 | 127.0.0.1:7001 | online | 100 | 0 |")
	require.Contains(t, out.String(), "| 127.0.0.1:7010 | 0 | none |")
}

// A password is percent-decoded, as redis:// URLs read it, so a password
// holding "@", ":" or "/" can be written; a bad escape is refused without
// echoing the password.
func TestParseSentinelURLDecodesThePassword(t *testing.T) {
	t.Parallel()
	o, err := parseSentinelURL("redis+sentinel://ad%40a:p%40ss%3Aw%2Fd@h1:1,[::1]:2/m")
	require.NoError(t, err)
	require.Equal(t, "ad@a", o.Username)
	require.Equal(t, "p@ss:w/d", o.Password)
	require.Equal(t, []string{"h1:1", "[::1]:2"}, o.SentinelAddrs)

	o, err = parseSentinelURL("redis+sentinel://:p@ss@h1:1/m")
	require.NoError(t, err, "a raw @ in the password is read up to the last @")
	require.Equal(t, "p@ss", o.Password)

	_, err = parseSentinelURL("redis+sentinel://:s3cret%zz@h1:1/m")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cret")
}

// No URL, however mangled, panics the parser or shows its password.
func TestParseSentinelURLHostileNeverPanicsNorShowsThePassword(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"redis+sentinel://", "rediss+sentinel://", "redis+sentinel://@", "redis+sentinel://:s3cret@",
		"redis+sentinel://:s3cret@/", "redis+sentinel://:s3cret@//", "redis+sentinel://:s3cret@,/m",
		"redis+sentinel://:s3cret@h:1,,h:2/m", "redis+sentinel://:s3cret@h:-1/m", "redis+sentinel://:s3cret@h:65536/m",
		"redis+sentinel://:s3cret@h:/m", "redis+sentinel://:s3cret@:1/m", "redis+sentinel://:s3cret@::1:1/m",
		"redis+sentinel://:s3cret@[::1/m", "redis+sentinel://:s3cret@[]:1/m", "redis+sentinel://:s3cret@h:1/m/-1",
		"redis+sentinel://:s3cret@h:1/m/99999999999999999999", "redis+sentinel://:s3cret@h:1/m#frag",
		"redis+sentinel://:s3cret@h:1/m/1/2", "redis+sentinel://:s3%cret@h:1/m",
		"redis+sentinel://:s3cret@h:1 /m", "redis+sentinel://:s3cret@h:1\n/m",
		"redis+sentinel://:s3cret@" + strings.Repeat("h:1,", 1000) + "h:/m",
	} {
		require.NotPanics(t, func() {
			_, err := parseSentinelURL(u)
			if err != nil {
				require.NotContains(t, err.Error(), "s3cret", u)
			}
		}, u)
	}
}

// A replica on an IPv6 address is shown as host:port a client can dial,
// and malformed lines never panic.
func TestParseReplicationIPv6AndMalformed(t *testing.T) {
	t.Parallel()
	m := parseReplication("[::1]:7000", "master_repl_offset:10\r\nslave0:ip=::1,port=7001,state=online,offset=4,lag=1\r\n")
	require.Equal(t, []replicaState{{Addr: "[::1]:7001", State: "online", Behind: 6, Lag: 1}}, m.Replicas)
	for _, info := range []string{
		"", "\r\n", ":", "slave0:", "slave0", "slave0:,,,", "slave0:=,=", "slave0:offset=x,lag=y",
		"master_repl_offset:-9223372036854775808\nslave0:offset=9223372036854775807",
		"master_repl_offset:9223372036854775807\nslave0:offset=-9223372036854775808",
		"slave0:ip=a,port=1\nslave0:ip=b,port=2", strings.Repeat("slave9:x\n", 1000),
	} {
		require.NotPanics(t, func() {
			var out bytes.Buffer
			printReplication(&out, []masterReplication{parseReplication("", info)})
		}, info)
	}
}
