package jobkey

import (
	"fmt"
	"strconv"
)

// Index names: each shard keeps one sorted set per derived index.
const (
	idxReady     = "ready"     // pending jobs, scored by RunAt
	idxLeased    = "leased"    // active jobs, scored by lease deadline
	idxSucceeded = "succeeded" // finished jobs, scored by finish time
	idxFailed    = "failed"
	idxCanceled  = "canceled"
	// idxCorrupt lists IDs whose value cannot be read as a job (corrupt, or
	// another Redis type), scored by when a claimer found it. Claimers move
	// such hints here so nobody trips on them again; the value itself is
	// never touched. A value in a newer major format is not corrupt: its
	// hint stays where it is (seenNewer).
	idxCorrupt = "corrupt"
	// seenNewer is not an index of states: it logs the IDs of jobs written
	// in a newer major format that claimers of this build met and left
	// where they were, scored by when. Stats counts the recent ones.
	seenNewer = "newer"
	// seenVanished logs, likewise, the IDs whose ready or leased entry a
	// claimer found pointing at no value: a job deleted outside jobkey or
	// evicted by Redis.
	seenVanished = "vanished"
	// seenStuck lists the handlers Work reports stuck (stuck.go), one entry
	// per run ("<lease token>:<id>"), scored by when the report lapses
	// unless renewed. Stats counts those not lapsed.
	seenStuck = "stuck"
)

// readyIndex is the ready index of priority p: "ready" for priority 0 (the
// index every queue had before priorities), "ready.<p>" above it.
func readyIndex(p int) string {
	if p <= 0 {
		return idxReady
	}
	return idxReady + "." + strconv.Itoa(p)
}

// readyIndexes are the ready indexes of every priority, highest first.
var readyIndexes = func() []string {
	out := make([]string, 0, MaxPriority+1)
	for p := MaxPriority; p >= 0; p-- {
		out = append(out, readyIndex(p))
	}
	return out
}()

// keyspace builds every Redis key and channel of one queue. Key names come
// from here and nowhere else.
//
//	<prefix>:{<shard tag>}:job:<id>   the job value, the only truth
//	<prefix>:{<shard tag>}:<index>    derived sorted sets of job IDs
//	<prefix>:{<shard tag>}:ck:<key>   a concurrency key's value (concurrency.go)
//	<prefix>:{<shard tag>}:periodic:<name>  the latest tick of a periodic job enqueued (periodic.go)
//	<prefix>:{<queue>}:meta           the queue's shard count
//	<prefix>:{<queue>}:wake           pub/sub hint that work arrived
//	<prefix>:{<queue>}:cancel         pub/sub: a running job was canceled
//
// The shard tag is "<queue>/<shard>", with ".<k>" appended where needed to
// spread the shards' slots evenly (shardTag).
//
// The braces are a Redis Cluster hash tag: a job and its shard's indexes
// share a slot, so one MULTI/EXEC may write them all.
type keyspace struct {
	prefix string
	queue  string
	shards int
	tags   []string // "<prefix>:{<queue>/<shard>}" per shard
	// indexes holds every shard's index key names, built once: the hot
	// paths name several per job. Read-only after newKeyspace.
	indexes []map[string]string
}

// indexNames are the names whose keys newKeyspace builds ahead.
var indexNames = append([]string{idxLeased, idxSucceeded, idxFailed, idxCanceled, idxCorrupt,
	seenNewer, seenVanished, seenStuck}, readyIndexes...)

func newKeyspace(prefix, queue string, shards int) *keyspace {
	ks := &keyspace{prefix: prefix, queue: queue, shards: shards, tags: make([]string, shards),
		indexes: make([]map[string]string, shards)}
	for i := range shards {
		ks.tags[i] = prefix + ":{" + shardTag(queue, i, shards) + "}"
		ks.indexes[i] = make(map[string]string, len(indexNames))
		for _, name := range indexNames {
			ks.indexes[i][name] = ks.tags[i] + ":" + name
		}
	}
	return ks
}

// clusterSlots is the number of Redis Cluster hash slots.
const clusterSlots = 16384

// shardTag returns the hash tag of shard i of n. Tags are chosen so that
// shard i's slot falls in the middle half of the i-th of n equal parts of
// the slot range: "<queue>/<i>" when it already does, else the first
// "<queue>/<i>.<k>" that does. Masters own contiguous slot ranges, so the
// shards, and the jobs, spread over the masters as evenly as the slots do
// instead of where chance would put them; keeping to the middle of each
// part keeps a shard off the edge between two masters' ranges. The choice
// depends only on the queue name, i and n, so it never changes for a queue.
func shardTag(queue string, i, n int) string {
	if n == 1 {
		return queue + "/0"
	}
	part := clusterSlots / n
	lo := i*clusterSlots/n + part/4
	hi := lo + max(1, part/2)
	tag := queue + "/" + strconv.Itoa(i)
	for k := 1; ; k++ {
		if s := int(crc16(tag)) % clusterSlots; s >= lo && s < hi {
			return tag
		}
		tag = queue + "/" + strconv.Itoa(i) + "." + strconv.Itoa(k)
	}
}

// crc16 is the CRC16-CCITT (XMODEM) Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// shardOf maps an ID to its shard. It must never change for a queue's
// life, or existing jobs would be looked for in the wrong place.
func (ks *keyspace) shardOf(id string) int {
	if ks.shards == 1 {
		return 0
	}
	return int(fnv32a(id) % uint32(ks.shards))
}

// fnv32a is the 32-bit FNV-1a hash of s (hash/fnv's New32a), without its
// allocations.
func fnv32a(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

func (ks *keyspace) jobKey(shard int, id string) string { return ks.tags[shard] + ":job:" + id }

// periodicKey is the marker of periodic job name in shard: the latest tick
// whose job was enqueued (Queue.markerShard says which shard).
func (ks *keyspace) periodicKey(shard int, name string) string {
	return ks.tags[shard] + ":periodic:" + name
}

func (ks *keyspace) index(shard int, name string) string {
	if k, ok := ks.indexes[shard][name]; ok {
		return k
	}
	return ks.tags[shard] + ":" + name
}

func (ks *keyspace) wakeChannel() string { return ks.prefix + ":{" + ks.queue + "}:wake" }

func (ks *keyspace) metaKey() string { return ks.prefix + ":{" + ks.queue + "}:meta" }

func (ks *keyspace) cancelChannel() string { return ks.prefix + ":{" + ks.queue + "}:cancel" }

// jobKeyOf returns the key of id, with its shard.
func (ks *keyspace) jobKeyOf(id string) (string, int) {
	s := ks.shardOf(id)
	return ks.jobKey(s, id), s
}

// validName checks a queue name or key prefix: printable, no braces (they
// would break the hash tag), no colon in a queue name, bounded.
func validName(kind, s string, allowColon bool) error {
	if s == "" {
		return fmt.Errorf("%w: %s is empty", ErrInvalid, kind)
	}
	if len(s) > 128 {
		return fmt.Errorf("%w: %s is %d bytes, limit 128", ErrInvalid, kind, len(s))
	}
	for _, r := range s {
		switch {
		case r == '{' || r == '}':
			return fmt.Errorf("%w: %s %q contains %q, which would break the cluster hash tag", ErrInvalid, kind, s, r)
		case r == ':' && !allowColon, r == '/' && !allowColon:
			return fmt.Errorf("%w: %s %q contains %q", ErrInvalid, kind, s, r)
		case r <= ' ' || r == 0x7f:
			return fmt.Errorf("%w: %s %q contains a space or control character", ErrInvalid, kind, s)
		}
	}
	return nil
}

// JobKeys names the Redis keys that concern one job: its value and the
// indexes of its shard. They are for inspection with redis-cli and for
// tools; write them only through jobkey.
type JobKeys struct {
	Job       string // the job value
	Ready     string // pending jobs by RunAt
	Leased    string // active jobs by lease deadline
	Succeeded string // succeeded jobs by finish time
	Failed    string // failed jobs by finish time
	Canceled  string // canceled jobs by finish time
	Corrupt   string // jobs whose value could not be read
}

// Keys returns the keys of the job with the given ID and of its shard.
func (q *Queue) Keys(id string) JobKeys {
	key, s := q.ks.jobKeyOf(id)
	return JobKeys{
		Job: key, Ready: q.ks.index(s, idxReady), Leased: q.ks.index(s, idxLeased),
		Succeeded: q.ks.index(s, idxSucceeded), Failed: q.ks.index(s, idxFailed), Canceled: q.ks.index(s, idxCanceled),
		Corrupt: q.ks.index(s, idxCorrupt),
	}
}
