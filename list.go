package jobkey

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// Listing limits: List returns DefaultListLimit jobs per page unless told,
// and at most MaxListLimit.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// ListOpts select a page of jobs for List.
type ListOpts struct {
	// State is the state to list: pending, active, succeeded, failed or
	// canceled. Required unless Corrupt is set.
	State State
	// Corrupt lists the jobs that claimers set aside because their value
	// could not be read (Stats.Corrupt), newest first, instead of a state.
	Corrupt bool
	// Type keeps only jobs of this type ("": every type). A value that
	// cannot be read has no type to judge, and is always listed.
	Type string
	// Limit is how many jobs a page holds at most (default
	// DefaultListLimit, at most MaxListLimit).
	Limit int
	// Cursor is JobPage.Next of the page before ("": the first page).
	Cursor string
}

// JobPage is one page of a listing.
type JobPage struct {
	// Jobs are the jobs of the page, in the listing's order.
	Jobs []*Job
	// Unreadable lists the entries of the page whose value cannot be read:
	// corrupt, written in a newer major format, or of another Redis type.
	// They never fail the page; their bytes are left as they are.
	Unreadable []UnreadableJob
	// Next is the cursor of the next page, "" on the last one. It points
	// after the last entry the page read, listed or not, so the next page
	// goes on from there.
	Next string
	// ScanStopped says the page holds fewer than Limit jobs and still has a
	// next page because it read as many entries as one page may (10 times
	// Limit, at least 1,000) and most were left out: of another Type, or
	// moved to another state while it read them. The listing goes on from
	// Next: this is not the last page, and later ones may hold more.
	ScanStopped bool
	// Scanned is how many index entries the page read, listed or not.
	Scanned int
}

// UnreadableJob is a listed job whose value cannot be read.
type UnreadableJob struct {
	ID  string
	Err error // a *CorruptError, ErrUnsupportedFormat or a *WrongTypeError
}

// listScan and listScanMin bound how many index entries one page reads,
// listed or not (jobs of other types, entries of jobs that changed state):
// listScan times Limit, and at least listScanMin. A page with a rare type
// so costs bounded work; JobPage.ScanStopped says it stopped there, and
// the caller goes on from Next. One read takes at most MaxListLimit
// entries, as many as a page lists.
const (
	listScan    = 10
	listScanMin = 1000
)

// List returns a page of the queue's jobs in one state, merged across
// shards: pending jobs by RunAt, oldest first; active jobs by lease
// deadline, soonest first; succeeded, failed and canceled jobs newest
// first. Pages follow a keyset cursor (the last entry's score and ID), so a
// job that stays where it is while someone pages through is listed exactly
// once, whatever else comes and goes. A job whose position changes between
// pages (a retried job, a renewed lease) may be listed again or not at all.
//
// Each page costs two round trips per node (the index entries, then the
// values), and more only when entries were left out by Type or had moved.
//
// When some shards cannot be read (their cluster node is down, or an index
// holds the wrong type), List returns the page of the others with a
// *ShardsError naming the missing shards, as Stats does.
func (q *Queue) List(ctx context.Context, o ListOpts) (*JobPage, error) {
	return q.list(ctx, o, false)
}

// list is List, in the opposite order when reverse is set (the bulk
// actions walk pending jobs newest first: see bulk).
func (q *Queue) list(ctx context.Context, o ListOpts, reverse bool) (*JobPage, error) {
	idx, desc, limit, err := q.listArgs(o)
	if err != nil {
		return nil, err
	}
	tag := idx // names the listing in its cursors
	if reverse {
		desc = !desc
		tag += "~" // a cursor of one order is refused by the other
	}
	cur, err := parseCursor(o.Cursor, tag)
	if err != nil {
		return nil, err
	}
	if err := q.check(ctx, false); err != nil {
		return nil, err
	}
	page := &JobPage{}
	bound := max(listScan*limit, listScanMin)
	var missing error // shards left out, reported with the page
	for {
		room := limit - len(page.Jobs) - len(page.Unreadable)
		// The first read takes what the page lacks; once entries were left
		// out, each read takes as many as were read so far (within the
		// bound), so a rare type costs a few round trips, not one per room.
		want := min(max(room, min(page.Scanned, MaxListLimit)), bound-page.Scanned)
		entries, more, err := q.listEntries(ctx, idx, desc, cur, want)
		var se *ShardsError
		switch {
		case errors.As(err, &se):
			missing = err
		case err != nil:
			return nil, err
		}
		used, err := q.listValues(ctx, o, entries, room, page)
		if err != nil {
			return nil, err
		}
		// The cursor goes after the last entry read, listed or not: one
		// after the last listed job would read the left-out entries again,
		// and never get past a long run of them.
		page.Scanned += used
		if used > 0 {
			cur = &entries[used-1]
		}
		more = more || used < len(entries)
		full := len(page.Jobs)+len(page.Unreadable) >= limit
		switch {
		case !more:
			return page, missing
		case full || page.Scanned >= bound:
			page.Next, page.ScanStopped = cur.cursor(tag), !full
			return page, missing
		}
	}
}

// listArgs checks ListOpts and returns the index to walk and its order.
func (q *Queue) listArgs(o ListOpts) (idx string, desc bool, limit int, err error) {
	limit = cmp.Or(o.Limit, DefaultListLimit)
	switch {
	case limit < 1 || limit > MaxListLimit:
		return "", false, 0, fmt.Errorf("%w: List limit %d, want 1..%d", ErrInvalid, o.Limit, MaxListLimit)
	case len(o.Type) > MaxTypeLen:
		return "", false, 0, fmt.Errorf("%w: List type is %d bytes, limit %d", ErrInvalid, len(o.Type), MaxTypeLen)
	case o.Corrupt:
		return idxCorrupt, true, limit, nil
	case !o.State.Valid():
		return "", false, 0, fmt.Errorf("%w: List of %s: want pending, active, succeeded, failed or canceled", ErrInvalid, o.State)
	}
	return derive(&Job{State: o.State}).index, o.State.Finished(), limit, nil
}

// listEntry is an index entry: a job's shard, ID and score.
type listEntry struct {
	shard int
	id    string
	score int64
}

// after says whether e comes after c in the listing's order: by score, and
// by ID within a score, as Redis orders a sorted set.
func (e listEntry) after(c *listEntry, desc bool) bool {
	if c == nil {
		return true
	}
	o := cmp.Or(cmp.Compare(e.score, c.score), strings.Compare(e.id, c.id))
	if desc {
		return o < 0
	}
	return o > 0
}

// cursor encodes e as the cursor of the page that follows it.
func (e *listEntry) cursor(tag string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(tag + ":" + strconv.FormatInt(e.score, 10) + ":" + e.id))
}

// parseCursor decodes a cursor made by cursor for the same index.
func parseCursor(s, tag string) (*listEntry, error) {
	if s == "" {
		return nil, nil
	}
	bad := fmt.Errorf("%w: List cursor %q is not a cursor of this listing", ErrInvalid, s)
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, bad
	}
	parts := strings.SplitN(string(b), ":", 3)
	if len(parts) != 3 || parts[0] != tag {
		return nil, bad
	}
	score, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || validID(parts[2]) != nil {
		return nil, bad
	}
	return &listEntry{score: score, id: parts[2]}, nil
}

// listTies is how many entries that share the cursor's score one read
// takes: a page reads the whole run of ties after its cursor in one
// command, so no offset is involved and nothing that comes or goes before
// the cursor can shift it. A longer run (more than listTies entries of one
// shard in one millisecond) is read on by offset, where concurrent changes
// within that millisecond can make an entry come twice or not at all.
const listTies = 10000

// listEntries returns the first want entries of index idx after cur over
// every shard, merged in the listing's order; more says whether entries
// may follow. Each shard reads its first want entries after cur, so the
// merged first want are among them. Shards that cannot be read are left
// out and named in a *ShardsError; when none can be read, that is the
// error.
func (q *Queue) listEntries(ctx context.Context, idx string, desc bool, cur *listEntry, want int) ([]listEntry, bool, error) {
	failed := &ShardsError{Of: q.ks.shards}
	var merged []listEntry
	more := false
	// Pending jobs sit in the ready index of their priority: a listing of
	// them merges every priority's, by RunAt.
	idxs := []string{idx}
	if idx == idxReady {
		idxs = readyIndexes
	}
	type read struct {
		shard      int
		idx        string
		ties, rest *redis.ZSliceCmd
	}
	var reads []read
	all, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for s := range q.ks.shards {
			for _, ix := range idxs {
				key := q.ks.index(s, ix)
				r := read{shard: s, idx: ix}
				if cur == nil {
					r.rest = p.ZRangeArgsWithScores(ctx, listRange(key, desc, "", want, 0))
				} else {
					bound := strconv.FormatInt(cur.score, 10)
					r.ties = p.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: key, Start: bound, Stop: bound,
						ByScore: true, Rev: desc, Count: listTies})
					r.rest = p.ZRangeArgsWithScores(ctx, listRange(key, desc, "("+bound, want, 0))
				}
				reads = append(reads, r)
			}
		}
		return nil
	})
	if err := reply.Unanswered(all, err); err != nil {
		return nil, false, fmt.Errorf("jobkey: list %q: %w", q.name, err)
	}
	for _, r := range reads {
		if slices.Contains(failed.Shards, r.shard) {
			continue
		}
		got, full, err := q.shardEntries(ctx, r.shard, r.idx, desc, cur, want, r.ties, r.rest)
		if err != nil {
			failed.add(r.shard, err)
			continue
		}
		merged = append(merged, got...)
		more = more || full
	}
	if len(failed.Shards) == q.ks.shards {
		return nil, false, failed.Errs[0]
	}
	slices.SortFunc(merged, func(a, b listEntry) int {
		o := cmp.Or(cmp.Compare(a.score, b.score), strings.Compare(a.id, b.id))
		if desc {
			return -o
		}
		return o
	})
	if len(merged) > want {
		merged, more = merged[:want], true
	}
	return merged, more, failed.orNil()
}

// listRange is the ZRANGE of index key in the listing's order from from
// ("": the start; "(<score>": past a score), want entries after offset.
func listRange(key string, desc bool, from string, want int, offset int64) redis.ZRangeArgs {
	lo, hi := cmp.Or(from, "-inf"), "+inf"
	if desc {
		// With REV, Start is the top of the range.
		lo, hi = cmp.Or(from, "+inf"), "-inf"
	}
	return redis.ZRangeArgs{Key: key, Start: lo, Stop: hi, ByScore: true, Rev: desc, Offset: offset, Count: int64(want)}
}

// listMaxTieReads bounds the reads of one run of ties past listTies.
const listMaxTieReads = 100

// shardEntries turns one shard's reads into its first want entries after
// cur: the ties that follow cur's ID, then the entries past its score.
// full says more may follow.
func (q *Queue) shardEntries(ctx context.Context, s int, idx string, desc bool, cur *listEntry, want int,
	ties, rest *redis.ZSliceCmd) ([]listEntry, bool, error) {
	key := q.ks.index(s, idx)
	var got []listEntry
	if ties != nil {
		zs, err := ties.Result()
		for n := 1; err == nil; n++ {
			for _, z := range zs {
				if e := toEntry(s, z); e.after(cur, desc) {
					got = append(got, e)
				}
			}
			if len(zs) < listTies || len(got) >= want {
				break
			}
			if n == listMaxTieReads {
				return nil, false, fmt.Errorf("jobkey: list %q: more than %d entries of %s share one millisecond", q.name, listTies*n, key)
			}
			bound := strconv.FormatInt(cur.score, 10)
			zs, err = q.rdb.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: key, Start: bound, Stop: bound,
				ByScore: true, Rev: desc, Offset: int64(n * listTies), Count: listTies}).Result()
		}
		if err != nil {
			return nil, false, readErr(key, err)
		}
	}
	zs, err := rest.Result()
	if err != nil {
		return nil, false, readErr(key, err)
	}
	for _, z := range zs {
		got = append(got, toEntry(s, z))
	}
	if len(got) > want {
		return got[:want], true, nil
	}
	return got, len(zs) == want, nil
}

func toEntry(shard int, z redis.Z) listEntry {
	id, _ := z.Member.(string)
	return listEntry{shard: shard, id: id, score: int64(z.Score)}
}

// listValues reads the values of entries, one MGET per shard, and adds
// them to page in order until room of them are added: the jobs still in
// the listed state and of the wanted type, and the values that cannot be
// read. Entries whose job has gone (its retention ran out) or moved on are
// left out. used is how many entries it went through.
func (q *Queue) listValues(ctx context.Context, o ListOpts, entries []listEntry, room int, page *JobPage) (used int, err error) {
	if len(entries) == 0 {
		return 0, nil
	}
	byShard := map[int][]int{}
	for i, e := range entries {
		byShard[e.shard] = append(byShard[e.shard], i)
	}
	keys := make([]string, len(entries))
	for i, e := range entries {
		keys[i] = q.ks.jobKey(e.shard, e.id)
	}
	gets := map[int]*redis.SliceCmd{}
	all, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for s, pos := range byShard {
			ks := make([]string, len(pos))
			for k, i := range pos {
				ks[k] = keys[i]
			}
			gets[s] = p.MGet(ctx, ks...)
		}
		return nil
	})
	if err := reply.Unanswered(all, err); err != nil {
		return 0, fmt.Errorf("jobkey: list %q: %w", q.name, err)
	}
	raw := make([]any, len(entries))
	for s, pos := range byShard {
		vals, err := gets[s].Result()
		if err != nil {
			return 0, fmt.Errorf("jobkey: list %q: read values of shard %d: %w", q.name, s, err)
		}
		for k, i := range pos {
			if k < len(vals) {
				raw[i] = vals[k]
			}
		}
	}
	types, err := q.typesOfNil(ctx, keys, raw)
	if err != nil {
		return 0, err
	}
	added := 0
	for i, e := range entries {
		if added == room {
			return i, nil
		}
		s, ok := raw[i].(string)
		if !ok {
			if t := types[i]; t != "" && t != "none" {
				page.Unreadable = append(page.Unreadable, UnreadableJob{ID: e.id, Err: &WrongTypeError{Key: keys[i], Want: "string", Got: t}})
				added++
			}
			continue // gone: expired with its retention, or deleted
		}
		j := new(Job)
		err := unmarshalString(s, j)
		if err == nil {
			err = storedAt(keys[i], j)
		}
		switch {
		case err != nil:
			page.Unreadable = append(page.Unreadable, UnreadableJob{ID: e.id, Err: keyed(err, keys[i])})
			added++
		case (o.Corrupt || j.State == o.State) && (o.Type == "" || j.Type == o.Type):
			page.Jobs = append(page.Jobs, j)
			added++
		}
	}
	return len(entries), nil
}

// typesOfNil returns the Redis type of each key whose MGET answer was nil
// (no value, or another type), in one more round trip when there are any.
func (q *Queue) typesOfNil(ctx context.Context, keys []string, raw []any) ([]string, error) {
	out := make([]string, len(keys))
	cmds := map[int]*redis.StatusCmd{}
	all, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, v := range raw {
			if v == nil {
				cmds[i] = p.Type(ctx, keys[i])
			}
		}
		return nil
	})
	if len(cmds) == 0 {
		return out, nil
	}
	if err := reply.Unanswered(all, err); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("jobkey: list %q: %w", q.name, err)
	}
	for i, c := range cmds {
		out[i] = c.Val()
	}
	return out, nil
}
