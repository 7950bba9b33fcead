package jobkey

import (
	"fmt"
	"strconv"
	"strings"
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
	// hint stays where it is (seenNewerFormat).
	idxCorrupt = "corrupt"
	// seenNewerFormat is not an index of states: it logs the IDs of jobs
	// written in a newer major format that claimers of this build met and
	// left where they were, scored by when. Stats counts the recent ones.
	seenNewerFormat = "newer"
	// seenLost logs, likewise, the IDs whose ready or leased entry (a
	// hint) a claimer found pointing at no value: a job deleted outside
	// jobkey or evicted by Redis (Stats.Vanished). The key's name stays
	// "vanished", as stored by every release.
	seenLost = "vanished"
	// seenStuck lists the handlers Work reports stuck (stuck.go), one entry
	// per run ("<lease token>:<id>"), scored by when the report lapses
	// unless renewed. Stats counts those not lapsed.
	seenStuck = "stuck"
	// idxBatches lists the shard's batches by ID, scored by when each was
	// made (batch.go): a hint for listing, as the job indexes are.
	idxBatches = "batches"
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
//	<prefix>:{<shard tag>}:ck:<key>   a concurrency key's value (concurrencykey.go)
//	<prefix>:{<shard tag>}:batch:<id> a batch's counts and callback (batch.go)
//	<prefix>:{<shard tag>}:paused     exists while the shard is paused (pause.go)
//	<prefix>:{<shard tag>}:events-on  exists while the shard's transitions write events (events.go)
//	<prefix>:{<shard tag>}:events     the shard's event stream (events.go)
//	<prefix>:{<shard tag>}:periodic:<name>  the latest tick of a periodic job enqueued; in the name's shard, also the record that the schedule exists (periodicmarker.go)
//	<prefix>:{<queue>}:meta           the queue's shard count
//	<prefix>:{<queue>}:wake           pub/sub hint that work arrived
//	<prefix>:{<queue>}:cancel         pub/sub: a running job was canceled
//	<prefix>:{<queue>}:workers        the Works that report themselves, by when each report lapses (workers.go)
//	<prefix>:{<queue>}:worker:<name>  one Work's report, with a TTL
//
// The shard tag is "<queue>/<shard>", with ".<k>" appended where needed to
// spread the shards' hash slots evenly (shardTag).
//
// The braces are a Redis Cluster hash tag: a job and its shard's indexes
// share a hash slot, so one MULTI/EXEC may write them all.
type keyspace struct {
	prefix string
	queue  string
	shards int
	tags   []string // "<prefix>:{<queue>/<shard>}" per shard
	// indexes holds every shard's index key names, built once: the hot
	// paths name several per job. Read-only after newKeyspace.
	indexes []map[string]string
	// shardOfTag maps tags back to their shard (shardOfJobKey).
	shardOfTag map[string]int
}

// indexNames are the names whose keys newKeyspace builds ahead.
// The shards' pause and priority flags are among them: the hot paths name
// those too.
var indexNames = append([]string{idxLeased, idxSucceeded, idxFailed, idxCanceled, idxCorrupt,
	seenNewerFormat, seenLost, seenStuck, pauseFlag, prioFlag, eventsFlag}, readyIndexes...)

func newKeyspace(prefix, queue string, shards int) *keyspace {
	ks := &keyspace{prefix: prefix, queue: queue, shards: shards, tags: make([]string, shards),
		indexes: make([]map[string]string, shards), shardOfTag: make(map[string]int, shards)}
	for i := range shards {
		ks.tags[i] = prefix + ":" + hashTag(shardTag(queue, i, shards))
		ks.shardOfTag[ks.tags[i]] = i
		ks.indexes[i] = make(map[string]string, len(indexNames))
		for _, name := range indexNames {
			ks.indexes[i][name] = ks.tags[i] + ":" + name
		}
	}
	return ks
}

// shardOf is the shard of id in this queue (jobhash.go).
func (ks *keyspace) shardOf(id string) int { return shardOfID(id, ks.shards) }

func (ks *keyspace) jobKey(shard int, id string) string { return ks.tags[shard] + ":job:" + id }

// periodicKey is the marker of periodic job name in shard: the latest tick
// whose job was enqueued (Queue.markerShard says which shard). The one in
// the name's shard also records that Redis has seen the schedule
// (Queue.registerSchedule).
func (ks *keyspace) periodicKey(shard int, name string) string {
	return ks.tags[shard] + ":periodic:" + name
}

// batchKey is the value of batch id in shard: its counts and its
// callback (batch.go). Its jobs, and its callback, live in the same shard.
func (ks *keyspace) batchKey(shard int, id string) string { return ks.tags[shard] + ":batch:" + id }

func (ks *keyspace) index(shard int, name string) string {
	if k, ok := ks.indexes[shard][name]; ok {
		return k
	}
	return ks.tags[shard] + ":" + name
}

func (ks *keyspace) wakeChannel() string { return ks.prefix + ":" + hashTag(ks.queue) + ":wake" }

func (ks *keyspace) metaKey() string { return ks.prefix + ":" + hashTag(ks.queue) + ":meta" }

func (ks *keyspace) cancelChannel() string { return ks.prefix + ":" + hashTag(ks.queue) + ":cancel" }

// workersKey lists the Works of the queue that report themselves
// (workers.go), each scored by when its report lapses unless renewed.
func (ks *keyspace) workersKey() string { return ks.prefix + ":" + hashTag(ks.queue) + ":workers" }

// workerKey is the report of Work name: a small value with a TTL.
func (ks *keyspace) workerKey(name string) string {
	return ks.prefix + ":" + hashTag(ks.queue) + ":worker:" + name
}

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
	Events    string // the shard's event stream (Queue.EnableEvents)
}

// pauseFlag is the name, under each shard's hash tag, of the key whose
// existence pauses the shard: "<prefix>:{<queue>/<shard>}:paused". It lives
// in the shard's hash slot, so a claim's compare-and-set watches it beside the
// jobs it takes, and a Pause that lands before the claim's EXEC aborts it.
const pauseFlag = "paused"

// pauseKey is shard s's pause flag (pause.go).
func (ks *keyspace) pauseKey(s int) string { return ks.index(s, pauseFlag) }

// eventsFlag names, under each shard's hash tag, the key whose existence
// makes every transition of the shard's jobs append an event to the
// shard's stream, eventsStream, in its own EXEC (events.go). Like the
// pause flag, it lives in the shard's hash slot, so every job transaction
// watches it beside its jobs.
const (
	eventsFlag   = "events-on"
	eventsStream = "events"
)

// eventsKey is shard s's events flag; streamKey its event stream.
func (ks *keyspace) eventsKey(s int) string { return ks.index(s, eventsFlag) }
func (ks *keyspace) streamKey(s int) string { return ks.tags[s] + ":" + eventsStream }

// shardOfJobKey returns the shard of a job key of this queue, or false
// when key is not one.
func (ks *keyspace) shardOfJobKey(key string) (int, bool) {
	end := strings.LastIndexByte(key, '}')
	if end < 0 || !strings.HasPrefix(key[end+1:], ":job:") {
		return 0, false
	}
	s, ok := ks.shardOfTag[key[:end+1]]
	return s, ok
}

// slotKey is the key of concurrency key name's value (concurrencykey.go) in shard: the shard
// of the job, so that the two share a hash slot.
func (ks *keyspace) slotKey(shard int, name string) string { return ks.tags[shard] + ":ck:" + name }

// ownsKey reports whether key is in the keyspace of jobkey's queues under
// the prefix ("<prefix>:{..."): a caller's key there could be a job, an
// index or a flag of some queue, which only jobkey may write (tx.go).
func (ks *keyspace) ownsKey(key string) bool { return strings.HasPrefix(key, ks.prefix+":{") }

// slotKeyPattern is a SCAN pattern that matches the concurrency values of
// every shard of ks's queue (ConcurrencyKeys).
func slotKeyPattern(ks *keyspace) string {
	return globEscape(ks.prefix) + ":{" + globEscape(ks.queue) + "/*}:ck:*"
}

// slotKeyName returns the concurrency key whose value key is, or false
// when key is not the value of one of ks's keys in its own shard.
func slotKeyName(ks *keyspace, key string) (string, bool) {
	i := strings.Index(key, "}:ck:")
	if i < 0 {
		return "", false
	}
	name := key[i+len("}:ck:"):]
	return name, name != "" && ks.slotKey(ks.shardOf(name), name) == key
}

// metaKeyPattern is a SCAN pattern that matches the meta key of every
// queue under prefix (Queues).
func metaKeyPattern(prefix string) string { return globEscape(prefix) + ":{*}:meta" }

// queueOfMetaKey returns the queue whose meta key under prefix key is, or
// false when key is not one.
func queueOfMetaKey(prefix, key string) (string, bool) {
	name, okPrefix := strings.CutPrefix(key, prefix+":{")
	name, ok := strings.CutSuffix(name, "}:meta")
	return name, okPrefix && ok && validName("queue name", name, false) == nil
}

// parseJobKey returns the queue and the ID of a job key, or false when key
// is not a job key. A job key is a hash tag ending in "}", then ":job:" and
// the ID; IDs cannot hold braces, so what follows the last "}" is exactly
// that. The tag is "<queue>/<shard>..."; queue names hold neither braces
// nor slashes (validName).
func parseJobKey(key string) (queue, id string, ok bool) {
	end := strings.LastIndex(key, "}")
	if end < 0 {
		return "", "", false
	}
	if id, ok = strings.CutPrefix(key[end+1:], ":job:"); !ok {
		return "", "", false
	}
	tag := key[strings.LastIndex(key[:end], "{")+1 : end]
	queue, _, _ = strings.Cut(tag, "/")
	return queue, id, true
}

// syncKey is the key a confirm writes: in route's hash slot, beside the
// queue's keys (so the ACL lines that let a role write its keys cover it),
// and never read.
func syncKey(route string) string {
	if i := strings.IndexByte(route, '}'); i >= 0 {
		return route[:i+1] + ":sync"
	}
	return route + ":sync"
}

// prioFlag names, under each shard's hash tag, a string key that says the
// shard has had a job of a priority above 0: it is set in the EXEC that
// first puts such a job in its ready index, and never cleared.
const prioFlag = "prio"

// globEscape quotes the characters SCAN MATCH treats as patterns.
func globEscape(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
	return r.Replace(s)
}
