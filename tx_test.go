package jobkey

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/faultproxy"
	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// order is a caller's order, kept in its own keys beside the queue: a
// hash (status, confirmations) and a set of the orders being confirmed.
type order struct {
	key, confirming string
}

func newOrder(t *testing.T, q *Queue, n int) order {
	t.Helper()
	tag, err := q.HashTag("confirm-" + strconv.Itoa(n))
	require.NoError(t, err)
	shop := "shop-" + q.ks.prefix
	return order{key: shop + ":order:" + tag + ":" + strconv.Itoa(n), confirming: shop + ":confirming:" + tag}
}

func (o order) keys() []TxKey {
	return []TxKey{{Key: o.key, Type: KeyHash}, {Key: o.confirming, Type: KeySet}}
}

// confirm is the order's side of enqueueing its confirmation job: a
// canceled order is not confirmed, and the count of confirmations is read
// and written whole, so a write applied twice would show as 2.
func (o order) confirm(tx *Tx) error {
	h := tx.HGetAll(o.key)
	if h["status"] == "canceled" {
		return fmt.Errorf("order %s: %w", o.key, errCanceled)
	}
	n, _ := strconv.Atoi(h["confirmations"])
	tx.HSet(o.key, "status", "confirming")
	tx.HSet(o.key, "confirmations", strconv.Itoa(n+1))
	tx.HSet(o.key, "job", tx.Job().ID)
	tx.SAdd(o.confirming, o.key)
	return nil
}

// confirmed is the order's side of completing the job.
func (o order) confirmed(tx *Tx) error {
	h := tx.HGetAll(o.key)
	n, _ := strconv.Atoi(h["completions"])
	tx.HSet(o.key, "status", "confirmed")
	tx.HSet(o.key, "completions", strconv.Itoa(n+1))
	tx.SRem(o.confirming, o.key)
	return nil
}

var errCanceled = errors.New("order canceled")

func TestEnqueueTxWritesTheJobAndTheCallersKeysInOneTransaction(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	o := newOrder(t, f.q, 1)
	require.NoError(t, f.rdb.HSet(f.ctx, o.key, "status", "placed").Err())
	j, err := f.q.EnqueueTx(f.ctx, "confirm", []byte("1"), &EnqueueOpts{ID: "confirm-1"}, o.keys(), o.confirm)
	require.NoError(t, err)
	require.Equal(t, StatePending, j.State)
	f.requireIndexed(t, j)
	h, err := f.rdb.HGetAll(f.ctx, o.key).Result()
	require.NoError(t, err)
	require.Equal(t, map[string]string{"status": "confirming", "confirmations": "1", "job": "confirm-1"}, h)
	require.Equal(t, []string{o.key}, f.rdb.SMembers(f.ctx, o.confirming).Val())

	// Claimed and completed with the order confirmed, in one transaction.
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	done, err := f.q.CompleteTx(f.ctx, c, []byte("ok"), o.keys(), func(tx *Tx) error {
		require.Equal(t, StateSucceeded, tx.Job().State, "fn sees the job as completed")
		return o.confirmed(tx)
	})
	require.NoError(t, err)
	require.Equal(t, StateSucceeded, done.State)
	f.requireIndexed(t, done)
	require.Equal(t, "confirmed", f.rdb.HGet(f.ctx, o.key, "status").Val())
	require.Zero(t, f.rdb.Exists(f.ctx, o.confirming).Val())
}

// A generated ID is drawn in the shard of the caller's keys, so that they
// share its hash slot on a cluster.
func TestEnqueueTxDrawsAGeneratedIDBesideTheCallersKeys(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 8})
	for n := range 8 {
		tag, err := f.q.HashTag("order-" + strconv.Itoa(n))
		require.NoError(t, err)
		key := "shop-" + f.q.ks.prefix + ":" + tag + ":order-" + strconv.Itoa(n)
		j, err := f.q.EnqueueTx(f.ctx, "t", nil, nil, []TxKey{{Key: key, Type: KeyString}}, func(tx *Tx) error {
			tx.Set(key, tx.Job().ID)
			return nil
		})
		require.NoError(t, err)
		jobKey, _ := f.q.ks.jobKeyOf(j.ID)
		require.Equal(t, hashSlot(key), hashSlot(jobKey), "job %s beside %s", j.ID, key)
		require.Equal(t, j.ID, f.rdb.Get(f.ctx, key).Val())
	}
}

// Every refusal writes nothing: neither the job nor any key of the
// caller's.
func TestEnqueueTxRefusalsWriteNothing(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	o := newOrder(t, f.q, 1)
	other := "shop-" + f.q.ks.prefix + ":other"
	setOrder := func(t *testing.T) {
		require.NoError(t, f.rdb.Del(f.ctx, o.key, o.confirming, other).Err())
		require.NoError(t, f.rdb.HSet(f.ctx, o.key, "status", "placed").Err())
	}
	cases := []struct {
		name  string
		opts  *EnqueueOpts
		keys  []TxKey
		fn    TxFunc
		setup func(t *testing.T)
		want  error
	}{
		{name: "function refuses", fn: func(tx *Tx) error { tx.HSet(o.key, "x", "y"); return errCanceled }, want: errCanceled},
		{name: "write to an undeclared key", fn: func(tx *Tx) error { tx.HSet(o.key, "x", "y"); tx.Set(other, "v"); return nil }, want: ErrInvalid},
		{name: "read of an undeclared key", fn: func(tx *Tx) error { tx.Get(other); tx.HSet(o.key, "x", "y"); return nil }, want: ErrInvalid},
		{name: "whole value of a hash", fn: func(tx *Tx) error { tx.Set(o.key, "v"); return nil }, want: ErrInvalid},
		{name: "set member of a hash", fn: func(tx *Tx) error { tx.SAdd(o.key, "m"); return nil }, want: ErrInvalid},
		{name: "hash field of a set", fn: func(tx *Tx) error { tx.HSet(o.confirming, "f", "v"); return nil }, want: ErrInvalid},
		{name: "key of another type", want: ErrWrongType, setup: func(t *testing.T) {
			require.NoError(t, f.rdb.LPush(f.ctx, o.confirming, "a list").Err())
		}},
		{name: "key in jobkey's keyspace", keys: []TxKey{{Key: f.q.ks.index(0, idxReady), Type: KeySet}}, want: ErrInvalid},
		{name: "key declared twice", keys: []TxKey{{Key: other, Type: KeyString}, {Key: other, Type: KeyString}}, want: ErrInvalid},
		{name: "no type", keys: []TxKey{{Key: other}}, want: ErrInvalid},
		{name: "no keys", keys: []TxKey{}, want: ErrInvalid},
		{name: "a replace", opts: &EnqueueOpts{ID: "confirm-1", IfExists: IfExistsReplace}, want: ErrInvalid},
		{name: "a keep", opts: &EnqueueOpts{ID: "confirm-1", IfExists: IfExistsKeep}, want: ErrInvalid},
		{name: "no function", fn: TxFunc(nil), want: ErrInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			setOrder(t)
			if c.setup != nil {
				c.setup(t)
			}
			before := f.rdb.HGetAll(f.ctx, o.key).Val()
			keys, fn, opts := c.keys, c.fn, c.opts
			if keys == nil {
				keys = o.keys()
			}
			if fn == nil && c.name != "no function" {
				fn = o.confirm
			}
			if opts == nil {
				opts = &EnqueueOpts{ID: "confirm-1"}
			}
			_, err := f.q.EnqueueTx(f.ctx, "confirm", nil, opts, keys, fn)
			require.ErrorIs(t, err, c.want)
			_, err = f.q.Get(f.ctx, "confirm-1")
			require.ErrorIs(t, err, ErrNotFound, "no job")
			require.Equal(t, before, f.rdb.HGetAll(f.ctx, o.key).Val(), "the order is as it was")
			require.Zero(t, f.rdb.Exists(f.ctx, other).Val())
			require.NotEqual(t, "set", f.rdb.Type(f.ctx, o.confirming).Val())
		})
	}
}

// A job stored under the ID already is not written, and neither are the
// caller's keys: the function does not run, and the call says the job
// exists. So an EnqueueTx retried after a lost reply never applies the
// caller's writes twice.
func TestEnqueueTxOfATakenIDWritesNothingOfTheCallers(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	o := newOrder(t, f.q, 1)
	require.NoError(t, f.rdb.HSet(f.ctx, o.key, "status", "placed").Err())
	_, err := f.q.Enqueue(f.ctx, "confirm", nil, &EnqueueOpts{ID: "confirm-1"})
	require.NoError(t, err)
	runs := 0
	j, err := f.q.EnqueueTx(f.ctx, "confirm", nil, &EnqueueOpts{ID: "confirm-1"}, o.keys(), func(tx *Tx) error {
		runs++
		return o.confirm(tx)
	})
	require.ErrorIs(t, err, ErrJobExists)
	require.Equal(t, "confirm-1", j.ID)
	require.Zero(t, runs)
	require.Equal(t, map[string]string{"status": "placed"}, f.rdb.HGetAll(f.ctx, o.key).Val())
}

// A caller's key changed by another client between the read and the EXEC
// aborts the EXEC: the attempt is made again, the function runs again on
// the fresh read, and what lands is decided on that.
func TestEnqueueTxRunsItsFunctionAgainWhenACallerKeyChanged(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	o := newOrder(t, f.q, 1)
	require.NoError(t, f.rdb.HSet(f.ctx, o.key, "status", "placed", "confirmations", "5").Err())
	other := redistest.Client(t, nil)
	runs := 0
	_, err := f.q.EnqueueTx(f.ctx, "confirm", nil, &EnqueueOpts{ID: "confirm-1"}, o.keys(), func(tx *Tx) error {
		runs++
		if runs == 1 {
			// Another writer, between this attempt's read and its EXEC.
			require.NoError(t, other.HSet(f.ctx, o.key, "confirmations", "7").Err())
		}
		return o.confirm(tx)
	})
	require.NoError(t, err)
	require.Equal(t, 2, runs)
	require.Equal(t, "8", f.rdb.HGet(f.ctx, o.key, "confirmations").Val(), "decided on the fresh read")

	// And when the other writer cancels the order meanwhile, nothing is
	// enqueued at all.
	o2 := newOrder(t, f.q, 2)
	require.NoError(t, f.rdb.HSet(f.ctx, o2.key, "status", "placed").Err())
	runs = 0
	_, err = f.q.EnqueueTx(f.ctx, "confirm", nil, &EnqueueOpts{ID: "confirm-2"}, o2.keys(), func(tx *Tx) error {
		runs++
		if runs == 1 {
			require.NoError(t, other.HSet(f.ctx, o2.key, "status", "canceled").Err())
		}
		return o2.confirm(tx)
	})
	require.ErrorIs(t, err, errCanceled)
	_, err = f.q.Get(f.ctx, "confirm-2")
	require.ErrorIs(t, err, ErrNotFound)
	require.False(t, f.rdb.SIsMember(f.ctx, o2.confirming, o2.key).Val())
}

// CompleteTx is fenced as Complete is: a copy whose lease was lost writes
// nothing of the caller's, and a call made again after its completion
// landed finds it and writes nothing more.
func TestCompleteTxIsFencedAndRecognisesItsOwnCompletion(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Lease: time.Minute})
	o := newOrder(t, f.q, 1)
	require.NoError(t, f.rdb.HSet(f.ctx, o.key, "status", "confirming").Err())
	_, err := f.q.Enqueue(f.ctx, "confirm", nil, &EnqueueOpts{ID: "confirm-1"})
	require.NoError(t, err)
	stale, err := f.q.Claim(f.ctx, "w1")
	require.NoError(t, err)
	f.clock.Advance(2 * time.Minute) // its lease ran out...
	mine, err := f.q.Claim(f.ctx, "w2")
	require.NoError(t, err) // ...and w2 holds the job now
	runs := 0
	count := func(tx *Tx) error { runs++; return o.confirmed(tx) }
	_, err = f.q.CompleteTx(f.ctx, stale, nil, o.keys(), count)
	require.ErrorIs(t, err, ErrLeaseLost)
	require.Zero(t, runs)
	require.Equal(t, "confirming", f.rdb.HGet(f.ctx, o.key, "status").Val())

	done, err := f.q.CompleteTx(f.ctx, mine, []byte("r"), o.keys(), count)
	require.NoError(t, err)
	require.Equal(t, 1, runs)
	require.Equal(t, "1", f.rdb.HGet(f.ctx, o.key, "completions").Val())
	// As after a lost reply: the same call again finds its completion.
	again, err := f.q.CompleteTx(f.ctx, mine, []byte("r"), o.keys(), count)
	require.NoError(t, err)
	require.Equal(t, done.Rev, again.Rev, "nothing written")
	require.Equal(t, 1, runs)
	require.Equal(t, "1", f.rdb.HGet(f.ctx, o.key, "completions").Val())
}

// A keyed job's CompleteTx frees its slot as Complete does, in the same
// EXEC as the caller's writes.
func TestCompleteTxOfAKeyedJobFreesItsSlot(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 4})
	id, err := f.q.IDFor("cust-1", "confirm-1")
	require.NoError(t, err)
	tag, err := f.q.HashTag(id)
	require.NoError(t, err)
	key := "shop-" + f.q.ks.prefix + ":" + tag + ":customer-1"
	_, err = f.q.EnqueueTx(f.ctx, "t", nil, &EnqueueOpts{ID: id, ConcurrencyKey: "cust-1"}, []TxKey{{Key: key, Type: KeySet}}, func(tx *Tx) error {
		tx.SAdd(key, id)
		return nil
	})
	require.NoError(t, err)
	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	info, err := f.q.Concurrency(f.ctx, "cust-1")
	require.NoError(t, err)
	require.Equal(t, 1, info.Active)
	_, err = f.q.CompleteTx(f.ctx, c, nil, []TxKey{{Key: key, Type: KeySet}}, func(tx *Tx) error {
		tx.SRem(key, id)
		return nil
	})
	require.NoError(t, err)
	info, err = f.q.Concurrency(f.ctx, "cust-1")
	require.NoError(t, err)
	require.Zero(t, info.Active)
	require.Zero(t, f.rdb.Exists(f.ctx, key).Val())
}

// Orders confirmed by a job each, through a link that cuts EXEC replies,
// while other writers cancel orders and touch them: every call that did
// not say what happened is called again, and in the end every order is
// either canceled with no job, or confirmed with its job succeeded, its
// writes applied exactly once, and nothing in between.
func TestTxUnderLostRepliesAndConcurrentWritersIsAllOrNothing(t *testing.T) {
	t.Parallel()
	cut, proxy := proxied(t)
	prefix := redistest.Prefix(t)
	q := queueOn(t, cut, prefix, Config{Shards: 4, Lease: time.Second, DisableGroupCommit: true, Logger: quietLog()})
	direct := redistest.Client(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const orders = 40
	all := make([]order, orders)
	for n := range all {
		all[n] = newOrder(t, q, n)
		require.NoError(t, direct.HSet(ctx, all[n].key, "status", "placed").Err())
	}
	proxy.Set(faultproxy.Faults{ExecCutProb: 0.3})

	// Other writers: cancel an order while it is placed (a compare-and-set
	// of their own), and touch a field nobody else writes.
	stop := make(chan struct{})
	var writers sync.WaitGroup
	var canceled atomic.Int64
	for range 2 {
		writers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				o := all[rand.IntN(orders)]
				_ = direct.HSet(ctx, o.key, "touched", strconv.Itoa(rand.IntN(1000))).Err()
				if rand.IntN(8) == 0 {
					err := direct.Watch(ctx, func(tx *redis.Tx) error {
						if tx.HGet(ctx, o.key, "status").Val() != "placed" {
							return nil
						}
						_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
							p.HSet(ctx, o.key, "status", "canceled")
							return nil
						})
						return err
					}, o.key)
					if err == nil {
						canceled.Add(1)
					}
				}
				time.Sleep(time.Millisecond)
			}
		})
	}

	// again calls op until it says what happened.
	var unknown atomic.Int64
	again := func(op func() error) error {
		for {
			err := op()
			if !errors.Is(err, ErrOutcomeUnknown) && !errors.Is(err, ErrUnreachable) {
				return err
			}
			unknown.Add(1)
		}
	}
	var producers sync.WaitGroup
	var enqueued atomic.Int64
	for n, o := range all {
		producers.Go(func() {
			id := "confirm-" + strconv.Itoa(n)
			err := again(func() error {
				_, err := q.EnqueueTx(ctx, "confirm", nil, &EnqueueOpts{ID: id}, o.keys(), o.confirm)
				return err
			})
			switch {
			case err == nil, errors.Is(err, ErrJobExists): // this call's own write, after a lost reply
				enqueued.Add(1)
			case !errors.Is(err, errCanceled):
				t.Errorf("enqueue %s: %v", id, err)
			}
		})
	}
	producers.Wait()
	// Workers: claim and complete with the order confirmed, until every
	// job is. A claim whose reply was lost holds its job until the lease
	// runs out; a completion that did not land before it did is fenced off
	// (ErrLeaseLost), and the job is claimed again.
	var workers sync.WaitGroup
	var completed atomic.Int64
	for w := range 4 {
		workers.Go(func() {
			for ctx.Err() == nil && completed.Load() < enqueued.Load() {
				var c *Job
				err := again(func() (err error) { c, err = q.Claim(ctx, "w"+strconv.Itoa(w)); return })
				if errors.Is(err, ErrNoJob) {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				n, _ := strconv.Atoi(c.ID[len("confirm-"):])
				err = again(func() error {
					_, err := q.CompleteTx(ctx, c, nil, all[n].keys(), all[n].confirmed)
					return err
				})
				switch {
				case err == nil:
					completed.Add(1)
				case errors.Is(err, ErrLeaseLost):
					// Only when its write did not land: a job completed
					// under its token is its own completion.
					if cur, err := q.Get(ctx, c.ID); err == nil && cur.State == StateSucceeded && cur.LeaseToken == c.LeaseToken {
						t.Errorf("complete %s: ErrLeaseLost for a completion that landed", c.ID)
					}
				default:
					t.Errorf("complete %s: %v", c.ID, err)
				}
			}
		})
	}
	workers.Wait()
	close(stop)
	writers.Wait()
	proxy.Set(faultproxy.Faults{})
	require.NoError(t, ctx.Err())

	var confirmed int
	for n, o := range all {
		h := direct.HGetAll(ctx, o.key).Val()
		j, err := q.Get(ctx, "confirm-"+strconv.Itoa(n))
		switch h["status"] {
		case "canceled":
			require.ErrorIs(t, err, ErrNotFound, "order %d canceled, with no job", n)
			require.Empty(t, h["confirmations"])
		case "confirmed":
			confirmed++
			require.NoError(t, err)
			require.Equal(t, StateSucceeded, j.State, "order %d", n)
			require.Equal(t, "1", h["confirmations"], "order %d: confirmed once", n)
			require.Equal(t, "1", h["completions"], "order %d: completed once", n)
		default:
			t.Fatalf("order %d left %q (job: %v, %v)", n, h["status"], j, err)
		}
		require.False(t, direct.SIsMember(ctx, o.confirming, o.key).Val(), "order %d", n)
	}
	t.Logf("%d confirmed, %d canceled; %d calls made again after an unknown outcome; %d EXEC replies cut",
		confirmed, orders-confirmed, unknown.Load(), proxy.Counts().ExecCuts)
	require.Positive(t, proxy.Counts().ExecCuts)
	require.Positive(t, confirmed)
}

// On a cluster the caller's keys must share the job's hash slot: a key
// that holds the job's hash tag does, and a job with no ID of the
// caller's is drawn beside its keys; any other key is refused before
// anything is sent, named, and nothing is written.
func TestClusterTxRefusesACallersKeyOutsideTheJobsHashSlot(t *testing.T) {
	t.Parallel()
	cl := redistest.SharedCluster(t)
	rdb := cl.Client(t, nil)
	ctx := context.Background()
	q := queueOn(t, rdb, redistest.Prefix(t), Config{Shards: 8})
	shop := "shop-" + q.ks.prefix

	tag, err := q.HashTag("confirm-1")
	require.NoError(t, err)
	beside := shop + ":order:" + tag + ":1"
	stray := shop + ":order:1" // hashed whole: some other slot
	for slices.ContainsFunc(q.ks.tags, func(t string) bool { return hashSlot(t) == hashSlot(stray) }) {
		stray += "x" // in no shard's slot
	}
	set := func(key string) TxFunc {
		return func(tx *Tx) error { tx.Set(key, "confirming"); return nil }
	}
	_, err = q.EnqueueTx(ctx, "t", nil, &EnqueueOpts{ID: "confirm-1"},
		[]TxKey{{Key: beside, Type: KeyString}, {Key: stray, Type: KeyString}}, set(beside))
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, strconv.Quote(stray), "the key is named")
	_, err = q.Get(ctx, "confirm-1")
	require.ErrorIs(t, err, ErrNotFound)
	require.Zero(t, rdb.Exists(ctx, beside).Val())

	j, err := q.EnqueueTx(ctx, "t", nil, &EnqueueOpts{ID: "confirm-1"}, []TxKey{{Key: beside, Type: KeyString}}, set(beside))
	require.NoError(t, err)
	require.Equal(t, "confirming", rdb.Get(ctx, beside).Val())

	// Completed with a stray key: refused, the job still active.
	c, err := q.Claim(ctx, "w")
	require.NoError(t, err)
	require.Equal(t, j.ID, c.ID)
	_, err = q.CompleteTx(ctx, c, nil, []TxKey{{Key: stray, Type: KeyString}}, set(stray))
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, strconv.Quote(stray))
	cur, err := q.Get(ctx, c.ID)
	require.NoError(t, err)
	require.Equal(t, StateActive, cur.State)
	_, err = q.CompleteTx(ctx, c, nil, []TxKey{{Key: beside, Type: KeyString}}, func(tx *Tx) error {
		tx.Set(beside, "confirmed")
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, "confirmed", rdb.Get(ctx, beside).Val())

	// No ID of the caller's: drawn in the shard of the keys' tag, on
	// whichever master holds it.
	for n := range 16 {
		tag, err := q.HashTag("order-" + strconv.Itoa(n))
		require.NoError(t, err)
		key := shop + ":cart:" + tag + ":" + strconv.Itoa(n)
		j, err := q.EnqueueTx(ctx, "t", nil, nil, []TxKey{{Key: key, Type: KeySet}}, func(tx *Tx) error {
			tx.SAdd(key, tx.Job().ID)
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, []string{j.ID}, rdb.SMembers(ctx, key).Val())
	}
	// A key whose slot is no shard's cannot have a job beside it.
	_, err = q.EnqueueTx(ctx, "t", nil, nil, []TxKey{{Key: stray, Type: KeySet}}, func(tx *Tx) error { return nil })
	require.ErrorIs(t, err, ErrInvalid)
	require.ErrorContains(t, err, strconv.Quote(stray))
}

// A Work handler may complete its own job in its own transaction: Work
// then finds the job completed under the run's token, writes nothing
// more, and records the run's success; a renewal that comes between does
// not take the completion for a lost lease.
func TestWorkRecordsAHandlersOwnCompleteTx(t *testing.T) {
	t.Parallel()
	for _, returns := range []error{nil, errors.New("returned after its own completion")} {
		t.Run(fmt.Sprint(returns), func(t *testing.T) {
			t.Parallel()
			workRecordsOwnCompleteTx(t, returns)
		})
	}
}

func workRecordsOwnCompleteTx(t *testing.T, returns error) {
	// A lease long enough that a loaded machine does not let it run out
	// unrenewed (a 300 ms one did, under CI's full run: the run's
	// self-fence ended the handler's context), and a handler that runs past
	// its first renewal (every Lease/3).
	const lease = 1500 * time.Millisecond
	q := realQueue(t, &Config{Lease: lease, Logger: quietLog()})
	rdb := redistest.Client(t, nil)
	ctx := context.Background()
	o := newOrder(t, q, 1)
	require.NoError(t, rdb.HSet(ctx, o.key, "status", "confirming").Err())
	_, err := q.Enqueue(ctx, "confirm", nil, &EnqueueOpts{ID: "confirm-1"})
	require.NoError(t, err)
	type rec struct {
		j   *Job
		err error
	}
	recorded := make(chan rec, 4)
	var handlerErr atomic.Value
	h := HandlerFunc(func(hctx context.Context, j *Job) ([]byte, error) {
		if _, err := q.CompleteTx(hctx, j, []byte("done"), o.keys(), o.confirmed); err != nil {
			handlerErr.Store(err)
			return nil, err
		}
		// Past a renewal (every Lease/3) before it returns.
		select {
		case <-time.After(lease/3 + 100*time.Millisecond):
		case <-hctx.Done():
			handlerErr.Store(fmt.Errorf("the handler's context ended: %w", context.Cause(hctx)))
		}
		return []byte("ignored"), returns
	})
	stop := startWork(t, q, h, &WorkOpts{Concurrency: 1, OnRecorded: func(j *Job, err error) { recorded <- rec{j, err} }})
	var got rec
	select {
	case got = <-recorded:
	case <-time.After(5 * time.Second):
		t.Fatal("Work recorded no outcome")
	}
	stop()
	require.Nil(t, handlerErr.Load())
	require.NoError(t, got.err)
	require.Equal(t, StateSucceeded, got.j.State)
	require.Equal(t, []byte("done"), got.j.Result, "the handler's own completion stands")
	require.Equal(t, "1", rdb.HGet(ctx, o.key, "completions").Val())
	require.Equal(t, "confirmed", rdb.HGet(ctx, o.key, "status").Val())
	require.Equal(t, int64(1), q.Metrics().Succeeded)
}

// Tx.Job is the function's own copy: what it changes there, Meta, Payload
// or Result, is never written, neither by EnqueueTx nor by CompleteTx.
func TestTxFunctionChangingItsJobCopyChangesNothingWritten(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	key := "shop-" + f.q.ks.prefix + ":order"
	keys := []TxKey{{Key: key, Type: KeyString}}
	scribble := func(tx *Tx) error {
		c := tx.Job()
		if c.Meta != nil {
			c.Meta["m"] = "changed"
			c.Meta["added"] = "by the function"
		}
		if len(c.Payload) > 0 {
			c.Payload[0] = 'X'
		}
		if len(c.Result) > 0 {
			c.Result[0] = 'X'
		}
		if len(c.History) > 0 {
			c.History[0].Worker = "the function"
		}
		if len(c.Progress) > 0 {
			c.Progress[0] = 'X'
		}
		tx.Set(key, c.ID)
		return nil
	}
	payload, result := []byte("abc"), []byte("def")
	j, err := f.q.EnqueueTx(f.ctx, "t", payload, &EnqueueOpts{ID: "a", Meta: map[string]string{"m": "1"}}, keys, scribble)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"m": "1"}, j.Meta)
	got, err := f.q.Get(f.ctx, "a")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"m": "1"}, got.Meta)
	require.Equal(t, []byte("abc"), got.Payload)
	require.Equal(t, []byte("abc"), payload, "the caller's payload")

	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	c.Progress = []byte("half")
	done, err := f.q.CompleteTx(f.ctx, c, result, keys, scribble)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"m": "1"}, done.Meta)
	require.Equal(t, "w", done.History[0].Worker)
	got, err = f.q.Get(f.ctx, "a")
	require.NoError(t, err)
	require.Equal(t, StateSucceeded, got.State)
	require.Equal(t, map[string]string{"m": "1"}, got.Meta)
	require.Equal(t, []byte("def"), got.Result)
	require.Equal(t, []byte("abc"), got.Payload)
	require.Equal(t, []byte("def"), result, "the caller's result")
	require.Equal(t, "w", got.History[0].Worker)
	require.Equal(t, []byte("half"), got.Progress)
}

// Tx.Job is the job exactly as the attempt writes it, its revision
// included: a function may keep what it sees (the job's Rev, beside an
// order) and find it stored.
func TestTxFunctionSeesTheJobAsWritten(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	key := "shop-" + f.q.ks.prefix + ":order"
	keys := []TxKey{{Key: key, Type: KeyString}}
	var seen *Job
	look := func(tx *Tx) error {
		seen = tx.Job()
		tx.Set(key, strconv.FormatUint(seen.Rev, 10))
		return nil
	}
	j, err := f.q.EnqueueTx(f.ctx, "t", []byte("p"), &EnqueueOpts{ID: "a"}, keys, look)
	require.NoError(t, err)
	got, err := f.q.Get(f.ctx, "a")
	require.NoError(t, err)
	require.Equal(t, got, seen, "enqueued")
	require.Equal(t, j.Rev, seen.Rev)
	require.Equal(t, strconv.FormatUint(got.Rev, 10), f.rdb.Get(f.ctx, key).Val())

	c, err := f.q.Claim(f.ctx, "w")
	require.NoError(t, err)
	done, err := f.q.CompleteTx(f.ctx, c, []byte("r"), keys, look)
	require.NoError(t, err)
	got, err = f.q.Get(f.ctx, "a")
	require.NoError(t, err)
	require.Equal(t, got, seen, "completed")
	require.Equal(t, done.Rev, seen.Rev)
	require.Equal(t, strconv.FormatUint(got.Rev, 10), f.rdb.Get(f.ctx, key).Val())
}

// A Tx that no call made (the zero Tx, which a caller can build) panics
// nowhere: its reads and writes are misuses it keeps, and it has no job.
func TestZeroTxPanicsNowhere(t *testing.T) {
	t.Parallel()
	var tx Tx
	require.False(t, tx.Exists("k"))
	_, ok := tx.Get("k")
	require.False(t, ok)
	require.Empty(t, tx.HGetAll("k"))
	require.Empty(t, tx.SMembers("k"))
	require.False(t, tx.SIsMember("k", "m"))
	tx.Set("k", "v")
	tx.Del("k")
	tx.HSet("k", "f", "v")
	tx.HDel("k", "f")
	tx.SAdd("k", "m")
	tx.SRem("k", "m")
	require.Nil(t, tx.Job())
	require.ErrorIs(t, tx.err, ErrInvalid)
	require.Empty(t, tx.steps)
}

// A handler's progress (SetProgress) rides its own CompleteTx, as it
// rides the completion Work writes: it is not lost, nor turned back to
// what the handler's copy held at its claim.
func TestCompleteTxFromAHandlerWritesItsProgress(t *testing.T) {
	t.Parallel()
	q := realQueue(t, &Config{Lease: time.Minute, Logger: quietLog()})
	rdb := redistest.Client(t, nil)
	ctx := context.Background()
	o := newOrder(t, q, 1)
	_, err := q.Enqueue(ctx, "confirm", nil, &EnqueueOpts{ID: "confirm-1"})
	require.NoError(t, err)
	recorded := make(chan *Job, 4)
	h := HandlerFunc(func(hctx context.Context, j *Job) ([]byte, error) {
		if err := SetProgress(hctx, []byte("all 3 items packed")); err != nil {
			return nil, err
		}
		_, err := q.CompleteTx(hctx, j, []byte("done"), o.keys(), o.confirmed)
		return nil, err
	})
	stop := startWork(t, q, h, &WorkOpts{Concurrency: 1, OnRecorded: func(j *Job, err error) {
		if err == nil {
			recorded <- j
		}
	}})
	select {
	case <-recorded:
	case <-time.After(5 * time.Second):
		t.Fatal("Work recorded no success")
	}
	stop()
	got, err := q.Get(ctx, "confirm-1")
	require.NoError(t, err)
	require.Equal(t, StateSucceeded, got.State)
	require.Equal(t, []byte("all 3 items packed"), got.Progress)
	require.Equal(t, "confirmed", rdb.HGet(ctx, o.key, "status").Val())
}

// A caller's key whose type another client changes between the read and
// the EXEC (a list pushed where a set was read absent; a set deleted and
// made a hash) aborts the EXEC under the WATCH, and the attempt made again
// finds the type in its read, before MULTI: nothing is written.
func TestTxOfACallerKeyWhoseTypeChangesBeforeExecWritesNothing(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	other := redistest.Client(t, nil)
	absent := "shop-" + f.q.ks.prefix + ":absent"
	set := "shop-" + f.q.ks.prefix + ":set"
	require.NoError(t, f.rdb.SAdd(f.ctx, set, "a").Err())
	for _, c := range []struct {
		key    string
		change func()
		want   string
	}{
		{absent, func() { require.NoError(t, other.LPush(f.ctx, absent, "x").Err()) }, "list"},
		{set, func() {
			require.NoError(t, other.Del(f.ctx, set).Err())
			require.NoError(t, other.HSet(f.ctx, set, "f", "v").Err())
		}, "hash"},
	} {
		runs := 0
		id := "job-" + c.want
		_, err := f.q.EnqueueTx(f.ctx, "t", nil, &EnqueueOpts{ID: id}, []TxKey{{Key: c.key, Type: KeySet}}, func(tx *Tx) error {
			runs++
			if runs == 1 {
				c.change() // between this attempt's read and its EXEC
			}
			tx.SAdd(c.key, "m")
			return nil
		})
		require.ErrorIs(t, err, ErrWrongType, c.want)
		require.ErrorContains(t, err, c.key)
		require.Equal(t, 1, runs, "the second attempt refused at its read")
		_, err = f.q.Get(f.ctx, id)
		require.ErrorIs(t, err, ErrNotFound)
		require.Equal(t, c.want, f.rdb.Type(f.ctx, c.key).Val())
	}
}

// A handler's CompleteTx whose EXEC reply is lost (it landed) and that
// then returns the error, nil, or panics: Work finds the job completed
// under the run's token and records the success once, with the caller's
// writes applied once and the job run once.
func TestWorkRecordsAHandlersCompleteTxWhoseReplyWasLost(t *testing.T) {
	t.Parallel()
	for _, then := range []string{"returns the error", "returns nil", "panics"} {
		t.Run(then, func(t *testing.T) {
			t.Parallel()
			cut, proxy := proxied(t)
			q := queueOn(t, cut, redistest.Prefix(t), Config{Lease: 2 * time.Second, DisableGroupCommit: true, Logger: quietLog()})
			direct := redistest.Client(t, nil)
			ctx := context.Background()
			o := newOrder(t, q, 1)
			_, err := q.Enqueue(ctx, "confirm", nil, &EnqueueOpts{ID: "confirm-1"})
			require.NoError(t, err)
			type rec struct {
				j   *Job
				err error
			}
			recorded := make(chan rec, 4)
			var runs atomic.Int64
			var handlerErr atomic.Value
			h := HandlerFunc(func(hctx context.Context, j *Job) ([]byte, error) {
				runs.Add(1)
				proxy.Set(faultproxy.Faults{ExecCutProb: 1})
				_, err := q.CompleteTx(hctx, j, []byte("done"), o.keys(), o.confirmed)
				proxy.Set(faultproxy.Faults{})
				handlerErr.Store(fmt.Sprint(err))
				switch then {
				case "returns the error":
					return nil, err
				case "panics":
					panic(err)
				}
				return []byte("returned"), nil
			})
			stop := startWork(t, q, h, &WorkOpts{Concurrency: 1, OnRecorded: func(j *Job, err error) { recorded <- rec{j, err} }})
			var got rec
			select {
			case got = <-recorded:
			case <-time.After(10 * time.Second):
				t.Fatal("Work recorded no outcome")
			}
			stop()
			require.Contains(t, handlerErr.Load(), ErrOutcomeUnknown.Error(), "the reply was lost")
			require.NoError(t, got.err)
			require.Equal(t, StateSucceeded, got.j.State)
			j, err := q.Get(ctx, "confirm-1")
			require.NoError(t, err)
			require.Equal(t, StateSucceeded, j.State)
			require.Equal(t, []byte("done"), j.Result)
			require.Equal(t, "1", direct.HGet(ctx, o.key, "completions").Val())
			require.Equal(t, int64(1), runs.Load())
			require.Equal(t, int64(1), q.Metrics().Succeeded)
			require.Len(t, recorded, 0, "recorded once")
		})
	}
}
