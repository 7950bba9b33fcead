package jobkey

import (
	"testing"
	"time"

	"github.com/jobkey/jobkey/internal/redistest"
	"github.com/stretchr/testify/require"
)

// otherProcess returns a second process on f's queue, sharing its clock.
func (f *fixture) otherProcess(t *testing.T, cfg Config) *Queue {
	t.Helper()
	cfg.Prefix = f.q.cfg.Prefix
	q, err := NewQueue(redistest.Client(t, nil), "q", &cfg)
	require.NoError(t, err)
	q.clock.fake = f.clock.Now
	return q
}

// DEFECT: the flag is a new on-Redis protocol inside the same value format
// 1.4, with no upgrade note (docs/design.md section 11 still says only "roll
// 1.4 out to every worker ... before any producer sets Priority") and no
// migration. A job of priority > 0 enqueued by a 1.4 build before 17ea1eb
// (063bc7e: same format, no flag), or by such a producer during a rolling
// upgrade, sits in ready.<p> with no flag on its shard. An upgraded worker
// reads only `ready` and `leased` and never the flag-less priority index:
// the due job is never claimed (Stats counts it due), and Verify finds
// nothing to report or fix.
// Observed: Claim returns ErrNoJob forever; Verify reports no finding.
func TestBreak16PreFlagPriorityJobsStranded(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 2, DisableGroupCommit: true})
	j, err := f.q.Enqueue(f.ctx, "hi", nil, &EnqueueOpts{Priority: 5})
	require.NoError(t, err)
	// What a pre-flag 1.4 producer leaves: the same value and entry, no flag.
	_, shard := f.q.ks.jobKeyOf(j.ID)
	require.NoError(t, f.rdb.Del(f.ctx, f.q.ks.index(shard, prioFlag)).Err())

	w := f.otherProcess(t, Config{Shards: 2, DisableGroupCommit: true})
	st, err := w.Stats(f.ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, st.Due, "the job is due")
	rep, err := w.Verify(f.ctx, &VerifyOpts{Keys: true, Fix: true})
	require.NoError(t, err)
	require.Empty(t, rep.Findings, "Verify sees nothing wrong")
	c, err := w.Claim(f.ctx, "w")
	require.NoError(t, err, "the due priority-5 job is never claimed by an upgraded worker")
	require.Equal(t, j.ID, c.ID)
}

// DEFECT: Verify's repair (rederive) writes a job's entry into ready.<p>
// without setting the shard's prio flag, breaking the rule that the EXEC
// putting a job above priority 0 in a ready index sets it. Rebuilding the
// indexes from the job values with Verify{Keys, Fix} (what -keys -fix is
// for: values that no index lists, e.g. job keys restored or copied without
// their shard's other keys) therefore leaves every priority job in an index
// that no process without the flag ever reads -- not even the process that
// ran the repair.
// Observed: Verify reports and fixes the missing entry (Fixed: true), the
// entry is in ready.5, yet Claim (from the verifying process and from a
// fresh one) returns ErrNoJob.
func TestBreak16VerifyFixRebuildsPriorityEntryWithoutFlag(t *testing.T) {
	t.Parallel()
	f := setup(t, &Config{Shards: 1, DisableGroupCommit: true})
	prod := f.otherProcess(t, Config{Shards: 1})
	j, err := prod.Enqueue(f.ctx, "hi", nil, &EnqueueOpts{Priority: 5})
	require.NoError(t, err)
	// Only the job key survives (restored/copied without the shard's other keys).
	var others []string
	for _, idx := range append(allIndexes, prioFlag) {
		others = append(others, f.q.ks.index(0, idx))
	}
	require.NoError(t, f.rdb.Del(f.ctx, others...).Err())

	admin := f.otherProcess(t, Config{Shards: 1, DisableGroupCommit: true})
	rep, err := admin.Verify(f.ctx, &VerifyOpts{Keys: true, Fix: true})
	require.NoError(t, err)
	require.Len(t, rep.Findings, 1)
	require.True(t, rep.Findings[0].Fixed)
	idx, _ := f.indexOf(t, j.ID)
	require.Equal(t, "ready.5", idx, "the repair put the entry back")

	// Fixed: the repair sets the shard's flag, as the move that first put
	// the job there did, so a process that has not seen priorities yet
	// finds it.
	require.EqualValues(t, 1, f.rdb.Exists(f.ctx, f.q.ks.index(0, prioFlag)).Val(), "the repair sets the flag")
	fresh := f.otherProcess(t, Config{Shards: 1, DisableGroupCommit: true})
	fresh.fullRead.Store(time.Now().UnixNano()) // no periodic full read: the flag alone must do
	c, err := fresh.Claim(f.ctx, "w")
	require.NoError(t, err, "the repaired priority job is claimable")
	require.Equal(t, j.ID, c.ID)
}
