package jobkey

import (
	"strconv"
	"strings"
)

// This file says where a job hashes: the hash tag of each shard of a
// queue, the shard of a job ID, and the Redis Cluster hash slot a key falls in.
// keyspace.go builds every key name from these; nothing else may choose a
// tag or a shard, or a job would be looked for in the wrong place.

// hashTag wraps s in braces: Redis Cluster hashes only what is between the
// first "{" and the "}" after it, so every key holding hashTag(s) shares
// one slot.
func hashTag(s string) string { return "{" + s + "}" }

// shardOfID maps an ID to its shard of n. It must never change for a
// queue's life, or existing jobs would be looked for in the wrong place.
func shardOfID(id string, n int) int {
	if n == 1 {
		return 0
	}
	return int(fnv32a(id) % uint32(n))
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

// hashSlot is the Redis Cluster hash slot of key, by the cluster's rule: the
// CRC16 of the hash tag when key has a non-empty one, else of the whole key.
func hashSlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key)) % hashSlots
}

// hashSlots is the number of Redis Cluster hash slots.
const hashSlots = 16384

// shardTag returns the hash tag of shard i of n. Tags are chosen so that
// shard i's hash slot falls in the middle half of the i-th of n equal parts of
// the hash slot range: "<queue>/<i>" when it already does, else the first
// "<queue>/<i>.<k>" that does. Masters own contiguous hash slot ranges, so the
// shards, and the jobs, spread over the masters as evenly as the hash slots do
// instead of where chance would put them; keeping to the middle of each
// part keeps a shard off the edge between two masters' ranges. The choice
// depends only on the queue name, i and n, so it never changes for a queue.
func shardTag(queue string, i, n int) string {
	if n == 1 {
		return queue + "/0"
	}
	part := hashSlots / n
	lo := i*hashSlots/n + part/4
	hi := lo + max(1, part/2)
	tag := queue + "/" + strconv.Itoa(i)
	for k := 1; ; k++ {
		if s := int(crc16(tag)) % hashSlots; s >= lo && s < hi {
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

// maxIDForTries bounds IDFor's search. Each suffix lands in the key's shard
// with a chance of one in the shard count, so the bound is never reached;
// it only keeps a hash that misbehaved from looping forever.
const maxIDForTries = 1 << 20

// suffixed reports whether id ends in "~<digits>", the form of the IDs
// IDFor makes by adding a suffix.
func suffixed(id string) bool {
	i := strings.LastIndexByte(id, '~')
	if i < 0 || i == len(id)-1 {
		return false
	}
	for _, c := range []byte(id[i+1:]) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
