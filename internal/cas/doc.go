// Package cas is jobkey's compare-and-set engine: every write jobkey makes
// goes through Engine.Run, as one optimistic transaction over whole values.
//
// It carries raw values: a Txn names the keys it watches, the decision
// (Txn.Decide) sees them as bytes in a Read with Redis's clock, and returns
// a Plan of whole values and idempotent steps. The job layer above (the
// root package's cas.go) decodes the bytes into jobs and encodes its
// decisions back.
//
// The files follow an attempt's control flow:
//   - engine.go: Run, its retries and back-off, and one attempt;
//   - read.go: round trip 1 (WATCH, TIME, the reads, the type checks);
//   - exec.go: round trip 2 (late type checks, MULTI/EXEC, what the reply
//     means, UNWATCH);
//   - pipe.go: the EXEC round trip's command objects, built once and
//     reused, and the raw replies they read;
//   - handover.go: the next batch's round trip 1 carried behind this EXEC,
//     and the connection handed to it;
//   - wait.go: WAIT for replicas (Options.MinReplicas);
//   - conn.go: the connections a group-commit leader keeps;
//   - group.go: group commit, which lets concurrent calls share round
//     trips;
//   - errors.go: the errors the engine makes, re-exported at the root.
package cas
