package asynqcompat

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrMigrationRunning is what a migration (Migrate or MigrateToAsynq)
// returns when another one of the same asynq queue holds that queue's
// migration lock. The error is a *MigrationRunningError.
var ErrMigrationRunning = errors.New("asynqcompat: another migration of this asynq queue is running")

// ErrLockLost is what a migration returns when it lost its queue's
// migration lock while it ran (its renewals did not reach Redis for the
// lock's whole lifetime, or the key was removed by hand): it stops, since
// another migration of the queue may have started.
var ErrLockLost = errors.New("asynqcompat: the migration lock of the asynq queue was lost")

// MigrationRunningError names the asynq queue whose migration lock is held
// and who holds it. errors.Is(err, ErrMigrationRunning) is true.
type MigrationRunningError struct {
	Queue  string        // the asynq queue
	Holder string        // the holder's token: host, process ID, start time
	TTL    time.Duration // when the lock ends unless its holder renews it
}

func (e *MigrationRunningError) Error() string {
	return fmt.Sprintf("asynqcompat: another migration of asynq queue %q is running (lock %q held by %s, expires in %v unless renewed); "+
		"wait for it to finish, or, if it crashed, for the lock to expire (or rerun with a wait longer than that)", e.Queue, lockKey(e.Queue), e.Holder, e.TTL.Round(time.Millisecond))
}

// Is makes errors.Is(err, ErrMigrationRunning) true.
func (e *MigrationRunningError) Is(target error) bool { return target == ErrMigrationRunning }

// defaultLockTTL is how long a migration lock lives without a renewal; its
// holder renews it every third of that. A crashed holder's lock ends that
// long after its last renewal: a rerun with a wait at least that long
// (MigrateOpts.Wait) takes it over then.
const defaultLockTTL = 6 * time.Second

// lockKey is the Redis key of the migration lock of an asynq queue. It is
// outside asynq's "asynq:" keys, which asynq may delete with a queue, and in
// the queue's hash tag, with the migration state: every write of the state
// checks the lock in its WATCH.
func lockKey(queue string) string { return "asynqcompat:{" + queue + "}:migrate-lock" }

// queueLock is a held migration lock: a key set with NX and PX to a
// random token, renewed while held, and released only by its holder.
// Renewal and release compare the token under WATCH before they write.
type queueLock struct {
	rdb        redis.UniversalClient
	key, token string
	ttl        time.Duration

	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	lost error // set once the lock is found lost
}

// acquireLock takes the migration lock of an asynq queue, waiting up to
// wait for it to be free, or returns a *MigrationRunningError. While held,
// it is renewed; when a renewal finds it lost, onLost is called (once) with
// an error wrapping ErrLockLost.
func acquireLock(ctx context.Context, rdb redis.UniversalClient, queue string, ttl, wait time.Duration, onLost func(error)) (*queueLock, error) {
	if ttl <= 0 {
		ttl = defaultLockTTL
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	host, _ := os.Hostname()
	token := fmt.Sprintf("%s pid %d since %s (%s)", host, os.Getpid(), time.Now().UTC().Format(time.RFC3339), hex.EncodeToString(rnd[:]))
	key := lockKey(queue)
	deadline := time.Now().Add(wait)
	var ok bool
	for {
		var err error
		ok, err = rdb.SetNX(ctx, key, token, ttl).Result()
		if err != nil {
			return nil, fmt.Errorf("asynqcompat: take the migration lock of asynq queue %q: %w", queue, err)
		}
		if ok || !time.Now().Before(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("asynqcompat: wait for the migration lock of asynq queue %q: %w", queue, context.Cause(ctx))
		case <-time.After(min(100*time.Millisecond, time.Until(deadline))):
		}
	}
	if !ok {
		holder, _ := rdb.Get(ctx, key).Result()
		left, _ := rdb.PTTL(ctx, key).Result()
		return nil, &MigrationRunningError{Queue: queue, Holder: holder, TTL: max(left, 0)}
	}
	l := &queueLock{rdb: rdb, key: key, token: token, ttl: ttl, stop: make(chan struct{}), done: make(chan struct{})}
	go l.renew(queue, onLost)
	return l, nil
}

// renew extends the lock every third of its TTL until release. The lock
// is lost when the key no longer holds the token, or when no renewal
// reached Redis for a whole TTL.
func (l *queueLock) renew(queue string, onLost func(error)) {
	defer close(l.done)
	t := time.NewTicker(l.ttl / 3)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), l.ttl/3)
		mine, err := l.cas(ctx, func(p redis.Pipeliner) { p.PExpire(ctx, l.key, l.ttl) })
		cancel()
		var lost error
		switch {
		case err == nil && mine:
			last = time.Now()
			continue
		case err == nil:
			lost = fmt.Errorf("%w: asynq queue %q: key %q no longer holds this run's token", ErrLockLost, queue, l.key)
		case time.Since(last) >= l.ttl:
			lost = fmt.Errorf("%w: asynq queue %q: not renewed for %v: %w", ErrLockLost, queue, l.ttl, err)
		default:
			continue // try again at the next tick
		}
		l.mu.Lock()
		l.lost = lost
		l.mu.Unlock()
		if onLost != nil {
			onLost(lost)
		}
		return
	}
}

// cas runs write in a MULTI when the key holds the lock's token, under
// WATCH, and reports whether it did.
func (l *queueLock) cas(ctx context.Context, write func(redis.Pipeliner)) (bool, error) {
	for range 10 {
		mine := false
		err := l.rdb.Watch(ctx, func(tx *redis.Tx) error {
			cur, err := tx.Get(ctx, l.key).Result()
			if errors.Is(err, redis.Nil) || (err == nil && cur != l.token) {
				return nil
			}
			if err != nil {
				return err
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error { write(p); return nil })
			mine = err == nil
			return err
		}, l.key)
		if errors.Is(err, redis.TxFailedErr) {
			continue // the key changed between WATCH and EXEC: read it again
		}
		return mine, err
	}
	return false, fmt.Errorf("asynqcompat: migration lock %q: too many concurrent changes", l.key)
}

// Lost returns the error that says the lock was lost, or nil.
func (l *queueLock) Lost() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// abandon stops the renewals and leaves the key to expire: what a crashed
// holder leaves (tests stand in for a SIGKILL with it).
func (l *queueLock) abandon() {
	close(l.stop)
	<-l.done
}

// release stops the renewals and deletes the key if it still holds this
// lock's token; a lock taken over by another run is left to it.
func (l *queueLock) release() {
	close(l.stop)
	<-l.done
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = l.cas(ctx, func(p redis.Pipeliner) { p.Del(ctx, l.key) })
}
