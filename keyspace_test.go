package jobkey

import (
	"go/ast"
	"go/parser"
	"go/token"
	"hash/fnv"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// keyBuilders calls every key builder of the keyspace for shard s: each
// one's keys. A builder added to keyspace.go without an entry here fails
// TestEveryKeyBuilderIsEnumerated.
var keyBuilders = map[string]func(ks *keyspace, s int) []string{
	"jobKey":      func(ks *keyspace, s int) []string { return []string{ks.jobKey(s, "id-1")} },
	"periodicKey": func(ks *keyspace, s int) []string { return []string{ks.periodicKey(s, "nightly")} },
	"batchKey":    func(ks *keyspace, s int) []string { return []string{ks.batchKey(s, "b-1")} },
	"slotKey":     func(ks *keyspace, s int) []string { return []string{ks.slotKey(s, "cust-7")} },
	"pauseKey":    func(ks *keyspace, s int) []string { return []string{ks.pauseKey(s)} },
	"eventsKey":   func(ks *keyspace, s int) []string { return []string{ks.eventsKey(s)} },
	"streamKey":   func(ks *keyspace, s int) []string { return []string{ks.streamKey(s)} },
	// The key a confirm writes before its WAIT, beside the key it confirms.
	"syncKey": func(ks *keyspace, s int) []string { return []string{syncKey(ks.jobKey(s, "id-1"))} },
	"index": func(ks *keyspace, s int) []string {
		var out []string
		for _, name := range slices.Concat(readyIndexes, []string{idxLeased, idxSucceeded, idxFailed, idxCanceled, idxCorrupt, seenNewerFormat, seenLost, seenStuck}) {
			out = append(out, ks.index(s, name))
		}
		return out
	},
	"jobKeyOf": func(ks *keyspace, s int) []string {
		// The ID whose shard is s: its key is in s's slot.
		for n := 0; ; n++ {
			if id := "id-" + strconv.Itoa(n); ks.shardOf(id) == s {
				key, got := ks.jobKeyOf(id)
				if got != s {
					return nil
				}
				return []string{key}
			}
		}
	},
	// The queue's own keys live in the queue's slot, not a shard's.
	"metaKey":       func(ks *keyspace, _ int) []string { return []string{ks.metaKey()} },
	"wakeChannel":   func(ks *keyspace, _ int) []string { return []string{ks.wakeChannel()} },
	"cancelChannel": func(ks *keyspace, _ int) []string { return []string{ks.cancelChannel()} },
	"workersKey":    func(ks *keyspace, _ int) []string { return []string{ks.workersKey()} },
	"workerKey":     func(ks *keyspace, _ int) []string { return []string{ks.workerKey("host-1-abc")} },
}

// queueWide are the builders of keys of the whole queue, under its name's
// hash tag rather than a shard's.
var queueWide = []string{"metaKey", "wakeChannel", "cancelChannel", "workersKey", "workerKey"}

func TestEveryKeyBuilderIsEnumerated(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "keyspace.go", nil, 0)
	require.NoError(t, err)
	var builders []string
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Recv == nil || fd.Type.Results == nil {
			continue
		}
		star, ok := fd.Recv.List[0].Type.(*ast.StarExpr)
		if !ok || star.X.(*ast.Ident).Name != "keyspace" {
			continue
		}
		if r, ok := fd.Type.Results.List[0].Type.(*ast.Ident); ok && r.Name == "string" {
			builders = append(builders, fd.Name.Name)
		}
	}
	require.NotEmpty(t, builders)
	for _, b := range builders {
		require.Contains(t, keyBuilders, b, "keyspace.%s builds keys the keyspace tests do not check", b)
	}
}

// Every key a queue's keyspace builds carries the prefix and the queue's
// name in its hash tag, and falls in the cluster slot of its shard (or of
// the queue, for the queue-wide keys), whatever the shard count.
func TestEveryKeyCarriesItsShardsHashTag(t *testing.T) {
	t.Parallel()
	for _, shards := range []int{1, 3, 16} {
		ks := newKeyspace("pfx:a", "emails", shards)
		for s := range shards {
			shardSlot := hashSlot(ks.tags[s])
			require.Equal(t, int(crc16(shardTag("emails", s, shards)))%hashSlots, shardSlot)
			for name, build := range keyBuilders {
				keys := build(ks, s)
				require.NotEmpty(t, keys, name)
				for _, k := range keys {
					if slices.Contains(queueWide, name) {
						require.True(t, strings.HasPrefix(k, "pfx:a:"+hashTag("emails")+":"), "%s: %q", name, k)
						require.Equal(t, hashSlot("{emails}"), hashSlot(k), "%s: %q", name, k)
						continue
					}
					require.True(t, strings.HasPrefix(k, ks.tags[s]+":"), "%s: %q is not under shard %d's tag %q", name, k, s, ks.tags[s])
					require.True(t, strings.HasPrefix(k, "pfx:a:{emails/"), "%s: %q", name, k)
					require.Equal(t, shardSlot, hashSlot(k), "%s: %q is not in shard %d's slot", name, k, s)
				}
			}
		}
	}
}

// What the keyspace builds, the keyspace's parsers read back.
func TestKeyParsersReadWhatTheBuildersWrite(t *testing.T) {
	t.Parallel()
	ks := newKeyspace("pfx:a", "emails", 4)
	for _, id := range []string{"id-1", "a:b", "c-ff", "x~1"} {
		key, _ := ks.jobKeyOf(id)
		queue, got, ok := parseJobKey(key)
		require.True(t, ok, key)
		require.Equal(t, "emails", queue)
		require.Equal(t, id, got)
	}
	_, _, ok := parseJobKey(ks.index(0, idxReady))
	require.False(t, ok, "an index is not a job key")
	_, _, ok = parseJobKey("job:id-1")
	require.False(t, ok, "a key without a hash tag is not a job key")

	queue, ok := queueOfMetaKey("pfx:a", ks.metaKey())
	require.True(t, ok)
	require.Equal(t, "emails", queue)
	_, ok = queueOfMetaKey("pfx", ks.metaKey())
	require.False(t, ok, "another prefix's meta key")
	require.Equal(t, "pfx:a:{*}:meta", metaKeyPattern("pfx:a"))
}

// Only keyspace.go and jobhash.go write a hash tag: no other source file of
// the package holds a string with a brace, except the "{}" that validation
// looks for.
func TestNoKeyNameIsBuiltOutsideTheKeyspace(t *testing.T) {
	t.Parallel()
	files, err := os.ReadDir(".")
	require.NoError(t, err)
	for _, e := range files {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") || name == "keyspace.go" || name == "jobhash.go" {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			require.NoError(t, err)
			if s != "{}" && strings.ContainsAny(s, "{}") {
				t.Errorf("%s holds %q: key names are built in keyspace.go", name, lit.Value)
			}
			return true
		})
	}
}

// A job's shard must never change: the hash is hash/fnv's FNV-1a, byte for
// byte.
func FuzzShardHashIsFNV1a(f *testing.F) {
	for _, s := range []string{"", "a", "01JABCDEFGHJKMNPQRSTVWXYZ0", "job:é\x00\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h := fnv.New32a()
		_, _ = h.Write([]byte(s))
		require.Equal(t, h.Sum32(), fnv32a(s))
	})
}

// Index keys built ahead are the keys built on demand.
func TestIndexKeysBuiltAheadMatchTheKeyspace(t *testing.T) {
	t.Parallel()
	ks := newKeyspace("p", "q", 3)
	for shard := range 3 {
		for _, name := range append(indexNames, "other") {
			require.Equal(t, ks.tags[shard]+":"+name, ks.index(shard, name))
		}
	}
}

// The keys the hot paths name per transaction are built once, not per use:
// the indexes, and the shards' pause and priority flags.
func TestHotKeysAreNotBuiltPerUse(t *testing.T) {
	ks := newKeyspace("a-prefix-long-enough-to-need-the-heap", "q", 3)
	var keep []string // the keys escape, as they do into commands
	for _, name := range []string{idxLeased, idxSucceeded, readyIndex(0), readyIndex(MaxPriority), pauseFlag, prioFlag} {
		keep = slices.Grow(keep[:0], 100)
		require.Zero(t, testing.AllocsPerRun(10, func() { keep = append(keep, ks.index(2, name)) }), name)
	}
	require.Zero(t, testing.AllocsPerRun(10, func() { keep = append(keep, ks.pauseKey(1)) }))
}

// shardOfJobKey reads back the shard of every job key of the queue, and
// nothing else.
func TestShardOfJobKeyReadsWhatJobKeyBuilds(t *testing.T) {
	t.Parallel()
	ks := newKeyspace("pfx:a", "emails", 5)
	other := newKeyspace("pfx:a", "sms", 5)
	for s := range 5 {
		got, ok := ks.shardOfJobKey(ks.jobKey(s, "id-1"))
		require.True(t, ok)
		require.Equal(t, s, got)
		for _, k := range []string{other.jobKey(s, "id-1"), ks.pauseKey(s), ks.streamKey(s), ks.slotKey(s, "k"), "junk"} {
			_, ok := ks.shardOfJobKey(k)
			require.False(t, ok, k)
		}
	}
}
