package jobkey

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jobkey/jobkey/internal/reply"
	"github.com/redis/go-redis/v9"
)

// A job written in the caller's own transaction: EnqueueTx and CompleteTx
// watch and read the caller's keys beside the job's, in the job's round
// trip 1, and send the caller's writes in the job's one EXEC
// (docs/design.md, section 15).

// KeyType is the Redis type a caller's key holds, as TxKey declares it.
type KeyType uint8

const (
	// KeyString is a string, read with GET and written whole (Tx.Set).
	KeyString KeyType = iota + 1
	// KeyHash is a hash, read with HGETALL and written by field (Tx.HSet,
	// Tx.HDel).
	KeyHash
	// KeySet is a set, read with SMEMBERS and written by member (Tx.SAdd,
	// Tx.SRem).
	KeySet
)

// String is the type's name in Redis ("string", "hash", "set").
func (t KeyType) String() string {
	switch t {
	case KeyString:
		return "string"
	case KeyHash:
		return "hash"
	case KeySet:
		return "set"
	}
	return fmt.Sprintf("KeyType(%d)", uint8(t))
}

// MaxTxKeys bounds the keys of the caller's that one transaction declares:
// each is watched and read whole in the job's round trip 1.
const MaxTxKeys = 64

// TxKey declares one of the caller's keys: its name and the type it holds
// when it exists. A key that does not exist yet is fine: it reads as
// absent, and a write of its type creates it. A key of another type
// refuses the call before anything is written (ErrWrongType).
type TxKey struct {
	Key  string
	Type KeyType
}

// TxFunc reads the caller's keys and adds the caller's writes, for
// EnqueueTx and CompleteTx. It runs once per attempt, on the keys as read
// under the job's WATCH in that attempt, and only on an attempt that
// writes the job: it may run several times in one call (another client
// changed a watched key, and the attempt was made again), so it must be
// pure: no side effects, nothing kept between runs, its writes a function
// of what it reads. An error it returns refuses the call, with nothing
// written, and is returned wrapped (errors.Is and errors.As see it).
type TxFunc func(tx *Tx) error

// Tx is one attempt of a transaction that writes a job and the caller's
// keys together, as its TxFunc sees it: the job as the attempt writes it,
// the caller's keys as read under the WATCH, and the writes the function
// adds. Reads show what Redis held, not the writes added so far.
//
// Only writes that cannot fail inside EXEC once their key's type is
// checked are offered: a whole string value (Set), a key deleted (Del), and
// members of a hash or a set (HSet, HDel, SAdd, SRem). A write that can
// still fail while EXEC applies it (INCR of a value that is not a number,
// HINCRBY past the integer range, a Lua script) would leave the job
// written and the caller's step not, the very half-applied group jobkey
// exists to avoid (docs/design.md, section 1), so there is none. A
// counter is read and Set whole instead. (A write the ACL denies is
// refused as it is queued, and EXEC then aborts whole.)
//
// A read or write of a key the call did not declare, or of the wrong kind
// for its declared type, refuses the call with ErrInvalid before MULTI.
type Tx struct {
	job   *Job
	decl  map[string]KeyType
	vals  map[string]txVal
	steps [][]any
	err   error // the first misuse: refuses the call
}

// txVal is one caller's key as read.
type txVal struct {
	exists bool
	s      string
	h      map[string]string
	m      []string
}

// Job returns a copy of the job as this attempt writes it: for EnqueueTx
// the new pending job (its ID, and its times by Redis's clock), for
// CompleteTx the job as completed. The copy is deep (Payload, Result,
// Progress, Meta and History included): what the function changes in it
// is never written. A Tx that no call made (the zero Tx) has no job: nil.
func (tx *Tx) Job() *Job {
	if tx.job == nil {
		return nil
	}
	c := cloneJob(tx.job)
	c.Payload, c.Result, c.Progress = bytes.Clone(c.Payload), bytes.Clone(c.Result), bytes.Clone(c.Progress)
	c.Meta, c.History = cloneMeta(c.Meta), slices.Clone(c.History)
	return c
}

// Exists reports whether key existed when it was read.
func (tx *Tx) Exists(key string) bool {
	v, ok := tx.read(key, 0)
	return ok && v.exists
}

// Get returns the value of a KeyString key, and whether it exists.
func (tx *Tx) Get(key string) (string, bool) {
	v, ok := tx.read(key, KeyString)
	return v.s, ok && v.exists
}

// HGetAll returns the fields of a KeyHash key: empty when it does not
// exist. The map is the caller's.
func (tx *Tx) HGetAll(key string) map[string]string {
	v, _ := tx.read(key, KeyHash)
	out := make(map[string]string, len(v.h))
	for f, x := range v.h {
		out[f] = x
	}
	return out
}

// SMembers returns the members of a KeySet key, sorted: empty when it
// does not exist.
func (tx *Tx) SMembers(key string) []string {
	v, _ := tx.read(key, KeySet)
	return slices.Clone(v.m)
}

// SIsMember reports whether member is in a KeySet key.
func (tx *Tx) SIsMember(key, member string) bool {
	v, _ := tx.read(key, KeySet)
	_, found := slices.BinarySearch(v.m, member)
	return found
}

// Set writes value as the whole value of a KeyString key.
func (tx *Tx) Set(key, value string) { tx.add(KeyString, "set", key, value) }

// Del deletes a declared key, of any type.
func (tx *Tx) Del(key string) { tx.add(0, "del", key) }

// HSet sets field of a KeyHash key to value.
func (tx *Tx) HSet(key, field, value string) { tx.add(KeyHash, "hset", key, field, value) }

// HDel removes fields from a KeyHash key.
func (tx *Tx) HDel(key string, fields ...string) { tx.add(KeyHash, "hdel", key, fields...) }

// SAdd adds members to a KeySet key.
func (tx *Tx) SAdd(key string, members ...string) { tx.add(KeySet, "sadd", key, members...) }

// SRem removes members from a KeySet key.
func (tx *Tx) SRem(key string, members ...string) { tx.add(KeySet, "srem", key, members...) }

// read returns key's value as read, when key is declared of type want (0:
// any). A misuse is kept for the call to report.
func (tx *Tx) read(key string, want KeyType) (txVal, bool) {
	if err := tx.fits("read", key, want); err != nil {
		tx.fail(err)
		return txVal{}, false
	}
	return tx.vals[key], true
}

// add records one write of a key that must be declared of type want (0:
// any). A write with no field or member writes nothing, and is dropped
// (Redis would refuse it as it is queued, aborting the whole EXEC).
func (tx *Tx) add(want KeyType, cmd, key string, args ...string) {
	if err := tx.fits(cmd, key, want); err != nil {
		tx.fail(err)
		return
	}
	if len(args) == 0 && cmd != "del" {
		return
	}
	step := make([]any, 0, 2+len(args))
	step = append(step, cmd, key)
	for _, a := range args {
		step = append(step, a)
	}
	tx.steps = append(tx.steps, step)
}

// fits refuses a use of key that its declaration does not allow.
func (tx *Tx) fits(op, key string, want KeyType) error {
	got, ok := tx.decl[key]
	switch {
	case !ok:
		return fmt.Errorf("%w: transaction: %s of key %q, which the call did not declare: only declared keys are watched", ErrInvalid, op, key)
	case want != 0 && got != want:
		return fmt.Errorf("%w: transaction: %s of key %q, declared a %s: %s is for a %s", ErrInvalid, op, key, got, op, want)
	}
	return nil
}

func (tx *Tx) fail(err error) {
	if tx.err == nil {
		tx.err = err
	}
}

// txSide is the caller's side of one EnqueueTx or CompleteTx: its keys,
// its function, and what the current attempt read.
type txSide struct {
	keys  []TxKey
	names []string
	decl  map[string]KeyType
	fn    TxFunc
	vals  map[string]txVal // this attempt's read
}

// txSide checks the caller's declarations, before anything is sent.
func (q *Queue) txSide(keys []TxKey, fn TxFunc) (*txSide, error) {
	switch {
	case fn == nil:
		return nil, fmt.Errorf("%w: transaction: nil function", ErrInvalid)
	case len(keys) == 0:
		return nil, fmt.Errorf("%w: transaction: no keys declared (use Enqueue or Complete)", ErrInvalid)
	case len(keys) > MaxTxKeys:
		return nil, fmt.Errorf("%w: transaction: %d keys declared, limit %d", ErrInvalid, len(keys), MaxTxKeys)
	}
	s := &txSide{keys: keys, fn: fn, decl: make(map[string]KeyType, len(keys)), names: make([]string, len(keys))}
	for i, k := range keys {
		switch {
		case k.Key == "":
			return nil, fmt.Errorf("%w: transaction: key %d is empty", ErrInvalid, i)
		case k.Type < KeyString || k.Type > KeySet:
			return nil, fmt.Errorf("%w: transaction: key %q is declared of type %v: want KeyString, KeyHash or KeySet", ErrInvalid, k.Key, k.Type)
		case q.ks.ownsKey(k.Key):
			return nil, fmt.Errorf("%w: transaction: key %q is in jobkey's own keyspace (prefix %q): only jobkey writes there", ErrInvalid, k.Key, q.ks.prefix)
		}
		if _, dup := s.decl[k.Key]; dup {
			return nil, fmt.Errorf("%w: transaction: key %q is declared twice", ErrInvalid, k.Key)
		}
		s.decl[k.Key] = k.Type
		s.names[i] = k.Key
	}
	return s, nil
}

// sameSlot refuses, on a cluster, a caller's key outside the hash slot of
// jobKey, naming it: the transaction could not WATCH it there. On one
// Redis any key shares a transaction.
func (q *Queue) sameSlot(s *txSide, id, jobKey string) error {
	if !q.cluster() {
		return nil
	}
	want := hashSlot(jobKey)
	for _, k := range s.names {
		if got := hashSlot(k); got != want {
			tag, _ := q.HashTag(id)
			return fmt.Errorf("%w: transaction: key %q is in hash slot %d, job %q in hash slot %d: on a cluster the caller's keys must hold the job's hash tag %s (Queue.HashTag)",
				ErrInvalid, k, got, id, want, tag)
		}
	}
	return nil
}

// shardOfKeys returns the shard whose hash slot the caller's first key
// falls in, if any: EnqueueTx draws a generated ID there.
func (q *Queue) shardOfKeys(s *txSide) (int, bool) {
	slot := hashSlot(s.names[0])
	for i, t := range q.ks.tags {
		if hashSlot(t) == slot {
			return i, true
		}
	}
	return 0, false
}

// HashTag returns the Redis Cluster hash tag of the shard that job id
// lives in, braces included. A key that holds it, with no "{" before it,
// shares the job's hash slot, which EnqueueTx and CompleteTx need of the
// caller's keys on a cluster: "orders:" + tag + ":42". It depends only on
// the queue's name, its shard count and id, so every process agrees. A
// keyed job lives in its concurrency key's shard: ask for the ID that
// Queue.IDFor gives. An EnqueueTx with no ID draws its job's ID in the
// shard of its first key's tag, so HashTag of any string (an order's ID)
// also picks a shard for the order and its jobs.
func (q *Queue) HashTag(id string) (string, error) {
	if err := validID(id); err != nil {
		return "", err
	}
	return strings.TrimPrefix(q.ks.tags[q.ks.shardOf(id)], q.ks.prefix+":"), nil
}

// read queues the reads of the caller's keys, each by its declared type,
// on round trip 1's pipeline, under the WATCH: a key of another type
// answers WRONGTYPE, which types it as TYPE would, before MULTI.
func (s *txSide) read(ctx context.Context, p redis.Pipeliner) func(*casRead) error {
	cmds := make([]redis.Cmder, len(s.keys))
	for i, k := range s.keys {
		switch k.Type {
		case KeyString:
			cmds[i] = p.Get(ctx, k.Key)
		case KeyHash:
			cmds[i] = p.HGetAll(ctx, k.Key)
		case KeySet:
			cmds[i] = p.SMembers(ctx, k.Key)
		}
	}
	return func(*casRead) error {
		vals := make(map[string]txVal, len(s.keys))
		for i, k := range s.keys {
			var v txVal
			err := cmds[i].Err()
			switch {
			case err != nil && reply.IsWrongType(err):
				return &WrongTypeError{Key: k.Key, Want: k.Type.String(), Got: "value of another type"}
			case errors.Is(err, redis.Nil):
			case err != nil:
				return fmt.Errorf("jobkey: read %s: %w", k.Key, err)
			}
			switch c := cmds[i].(type) {
			case *redis.StringCmd:
				v.s, v.exists = c.Val(), err == nil
			case *redis.MapStringStringCmd:
				v.h, v.exists = c.Val(), len(c.Val()) > 0
			case *redis.StringSliceCmd:
				v.m = slices.Clone(c.Val())
				slices.Sort(v.m)
				v.exists = len(v.m) > 0
			}
			vals[k.Key] = v
		}
		s.vals = vals
		return nil
	}
}

// apply runs the caller's function on this attempt's read, beside job
// (the job as the attempt writes it, over a stored value of revision
// prev, 0 for none), and returns the caller's writes.
func (s *txSide) apply(job *Job, prev uint64) ([][]any, error) {
	// The function sees the revision the write will carry (encodePlan
	// bumps it once the decision is made).
	view := cloneJob(job)
	view.Rev = prev + 1
	tx := &Tx{job: view, decl: s.decl, vals: s.vals}
	if err := s.fn(tx); err != nil {
		return nil, wrapf(err, "transaction of job %q: the caller's function refused", job.ID)
	}
	if tx.err != nil {
		return nil, tx.err
	}
	return tx.steps, nil
}

// EnqueueTx enqueues a job and applies the caller's writes to its own
// keys in the job's one MULTI/EXEC, all or nothing, in the two round
// trips of an Enqueue. keys declares the caller's keys: they are watched
// and read with the job's key in round trip 1, each by its type, and fn
// sees them as read and adds the writes (see TxFunc and Tx). If another
// client changes one of them, or the job's key, before EXEC, the attempt
// is made again on fresh reads, fn included.
//
// fn runs only on an attempt that writes the job. When a job is stored
// under the ID already, nothing is written, the caller's writes included,
// and the stored job is returned with an error that matches ErrJobExists:
// so an EnqueueTx whose outcome was unknown (ErrOutcomeUnknown) can be
// called again with the same ID, and never applies the caller's writes
// twice. For the same reason opts.IfExists must be IfExistsRefuse: a
// replace could not tell its own landed write from a job to replace, and
// would apply the writes again, and a keep would answer success for writes
// it did not make.
//
// On a cluster every key must share the job's hash slot (HashTag), or the
// call is refused, naming the key. A job with no ID of the caller's (and
// no ConcurrencyKey or UniqueBy to place it) gets one drawn in the shard
// of keys[0]'s hash tag when it holds one. Keys in jobkey's own keyspace
// are refused.
func (q *Queue) EnqueueTx(ctx context.Context, typ string, payload []byte, opts *EnqueueOpts, keys []TxKey, fn TxFunc) (*Job, error) {
	side, err := q.txSide(keys, fn)
	if err != nil {
		return nil, err
	}
	if opts != nil && opts.IfExists != IfExistsRefuse {
		return nil, fmt.Errorf("%w: EnqueueTx takes IfExistsRefuse only, not %s: a retry after a lost reply could not tell its own write from another", ErrInvalid, opts.IfExists)
	}
	in, err := q.newJob(ctx, JobSpec{Type: typ, Payload: payload, Opts: opts})
	if err != nil {
		return nil, err
	}
	if opts == nil || opts.ID == "" && opts.UniqueBy == nil && opts.ConcurrencyKey == "" {
		// A generated ID: drawn beside the caller's keys when they are in
		// one of the queue's shards.
		if s, ok := q.shardOfKeys(side); ok {
			for q.ks.shardOf(in.job.ID) != s {
				in.job.ID = NewID()
			}
		}
	}
	id := in.job.ID
	keysOf, shards, checks := q.txnKeys([]string{id}, readyIndex(in.job.Priority))
	if err := q.sameSlot(side, id, keysOf[0]); err != nil {
		return nil, err
	}
	if in.job.Priority > 0 {
		// The shard's priority flag is set in the EXEC (indexPlan.flag):
		// typed here, in round trip 1, rather than in a round trip of its
		// own before MULTI.
		checks = append(checks, typeCheck{Key: q.ks.index(shards[0], prioFlag), Want: "string"})
	}
	var stored, written *Job
	_, _, err = q.run(ctx, &casTxn{keys: keysOf, checks: checks, watch: side.names, extra: side.read,
		decide: func(r *casRead) (*casPlan, error) {
			stored, written = nil, nil
			switch {
			case r.errs[0] != nil:
				return nil, wrapf(r.errs[0], "enqueue %q", id)
			case r.jobs[0] != nil:
				// Perhaps this very call, retried after a lost reply: its
				// writes went with the job, and go no second time.
				stored = r.jobs[0]
				return &casPlan{confirm: true}, nil
			}
			j := cloneJob(in.job)
			j.CreatedAt, j.UpdatedAt, j.RunAt = r.now, r.now, in.runAt
			if !in.fixed {
				j.RunAt = r.now.Add(in.delay)
			}
			mine, err := side.apply(j, 0)
			if err != nil {
				return nil, err
			}
			plan := &casPlan{}
			var ip indexPlan
			plan.writes = append(plan.writes, casWrite{key: keysOf[0], job: j})
			q.move(&ip, shards[0], id, nil, j, "")
			plan.index(&ip)
			plan.steps = append(plan.steps, []any{"publish", q.ks.wakeChannel(), wakeHint(j.Priority)})
			plan.steps = append(plan.steps, mine...)
			written = j
			return plan, nil
		}})
	switch {
	case err != nil:
		return nil, err
	case stored != nil:
		return stored, &JobExistsError{Job: stored}
	}
	return written, nil
}

// CompleteTx completes a claimed job, as Complete does, and applies the
// caller's writes to its own keys in the job's one MULTI/EXEC, all or
// nothing, in the two round trips of a Complete. keys and fn are as for
// EnqueueTx (see TxFunc and Tx); fn sees the job as completed.
//
// It is fenced as Complete is: while the stored job is not active under
// j's lease token it writes nothing, the caller's writes included, and
// returns ErrLeaseLost. Called again after a lost reply, it finds the job
// completed under its token and returns it, writing nothing: the caller's
// writes went with that completion, and go no second time. A job
// completed under the token by a plain Complete is taken the same way.
//
// A Work handler may call it for its own job (the job it was given), with
// the ctx Work gave it: the progress it reported (SetProgress) is written
// with the completion, and Work then finds the job completed under the
// run's token and records the run's success without writing again; the
// handler should return a nil error after it.
//
// On a cluster every key must share the job's hash slot (HashTag), or the
// call is refused, naming the key.
func (q *Queue) CompleteTx(ctx context.Context, j *Job, result []byte, keys []TxKey, fn TxFunc) (*Job, error) {
	side, err := q.txSide(keys, fn)
	if err != nil {
		return nil, err
	}
	if err := q.checkJob(j); err != nil {
		return nil, err
	}
	if err := q.resultFits(j, result); err != nil {
		return nil, err
	}
	if r := ownRun(ctx, q, j); r != nil {
		// A Work handler's own job: the progress it reported rides this
		// completion, as it rides the one Work writes.
		j = r.withProgress(j)
	}
	predict := []string{idxLeased, idxSucceeded}
	keysOf, shards, checks := q.txnKeys([]string{j.ID}, predict...)
	if err := q.sameSlot(side, j.ID, keysOf[0]); err != nil {
		return nil, err
	}
	mine := []*Job{j}
	checks = q.pullChecks(checks, mine, shards, predict)
	var out *Job
	_, _, err = q.run(ctx, &casTxn{keys: keysOf, checks: checks, aux: q.slotPredict(mine, shards), follow: q.slotFollow(shards),
		watch: side.names, extra: side.read,
		decide: func(r *casRead) (*casPlan, error) {
			plan := &casPlan{}
			var ip indexPlan
			b := q.newSlotBook(r)
			f := fencedWrite{key: keysOf[0], shard: shards[0], j: j, done: completed, fn: succeed(result)}
			var err error
			if out, err = q.decideFenced(plan, &ip, b, f, r.jobs[0], r.errs[0], r.now); err != nil {
				return nil, err
			}
			if len(plan.writes) == 0 {
				return plan, nil // its own completion, found: written before, with its writes
			}
			mine, err := side.apply(out, r.jobs[0].Rev)
			if err != nil {
				return nil, err
			}
			b.finish(plan, &ip)
			plan.index(&ip)
			plan.steps = append(plan.steps, mine...)
			return plan, nil
		}})
	if err != nil {
		return nil, err
	}
	completedOwn(ctx, q, j, out)
	return out, nil
}
