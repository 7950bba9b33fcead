package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// masterReplication is what INFO replication says of one master: its
// replicas and how far behind each is.
type masterReplication struct {
	Addr     string
	Offset   int64 // master_repl_offset
	Replicas []replicaState
}

// replicaState is one slaveN line of INFO replication.
type replicaState struct {
	Addr   string
	State  string // online, wait_bgsave, send_bulk...
	Behind int64  // bytes of the replication stream not acknowledged yet
	Lag    int64  // seconds since its last acknowledgement
}

// replication reads INFO replication of every master rdb writes to: the
// one Redis (or the master a Sentinel names), or each master of a cluster.
func replication(ctx context.Context, rdb redis.UniversalClient) ([]masterReplication, error) {
	one := func(ctx context.Context, c *redis.Client) (masterReplication, error) {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return masterReplication{}, err
		}
		return parseReplication(c.Options().Addr, info), nil
	}
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		var mu sync.Mutex
		var out []masterReplication
		err := c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			r, err := one(ctx, m)
			if err != nil {
				return err
			}
			mu.Lock()
			out = append(out, r)
			mu.Unlock()
			return nil
		})
		sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
		return out, err
	case *redis.Client:
		r, err := one(ctx, c)
		if err != nil {
			return nil, err
		}
		return []masterReplication{r}, nil
	}
	return nil, fmt.Errorf("replication: unsupported client %T", rdb)
}

// parseReplication reads an INFO replication reply. A FailoverClient's
// options name no address; the reply's own fields do not either, so addr
// may be empty.
func parseReplication(addr, info string) masterReplication {
	m := masterReplication{Addr: addr}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if k == "master_repl_offset" {
			m.Offset, _ = strconv.ParseInt(v, 10, 64)
		}
		if !strings.HasPrefix(k, "slave") || strings.Contains(k, "_") {
			continue
		}
		var r replicaState
		var ip, port string
		for _, f := range strings.Split(v, ",") {
			fk, fv, _ := strings.Cut(f, "=")
			switch fk {
			case "ip":
				ip = fv
			case "port":
				port = fv
			case "state":
				r.State = fv
			case "offset":
				r.Behind, _ = strconv.ParseInt(fv, 10, 64) // made relative below
			case "lag":
				r.Lag, _ = strconv.ParseInt(fv, 10, 64)
			}
		}
		r.Addr = net.JoinHostPort(ip, port) // [::1]:7001 for an IPv6 replica
		m.Replicas = append(m.Replicas, r)
	}
	for i := range m.Replicas {
		m.Replicas[i].Behind = max(0, m.Offset-m.Replicas[i].Behind)
	}
	return m
}

// printReplication writes the replication table of jobkey stats.
func printReplication(w io.Writer, ms []masterReplication) {
	fmt.Fprintf(w, "\n| master | replicas connected | replica | state | bytes behind | lag (s) |\n|---|---|---|---|---|---|\n")
	for _, m := range ms {
		online := 0
		for _, r := range m.Replicas {
			if r.State == "online" {
				online++
			}
		}
		if len(m.Replicas) == 0 {
			fmt.Fprintf(w, "| %s | 0 | none | | | |\n", m.Addr)
			continue
		}
		for _, r := range m.Replicas {
			fmt.Fprintf(w, "| %s | %d | %s | %s | %d | %d |\n", m.Addr, online, r.Addr, r.State, r.Behind, r.Lag)
		}
	}
}
