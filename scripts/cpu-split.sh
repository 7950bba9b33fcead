#!/usr/bin/env bash
# cpu-split.sh: how a benchmark's CPU splits between the Go client and the
# redis-server the test binary started. Samples /proc/<pid>/stat for 3 s
# in the middle of the run.
#
#   go test -c -o /tmp/jk.test .
#   scripts/cpu-split.sh /tmp/jk.test 'LifecycleBatch$/design=jobkey/payload=1KiB' 120000
set -euo pipefail
bin=$1 bench=$2 n=$3
out=$(mktemp)
"$bin" -test.run '^$' -test.bench "$bench" -test.benchtime "${n}x" >"$out" 2>&1 &
t=$!
sleep 2.5
p=$(pgrep -P "$t" -x redis-server | head -1)
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
a1=$(ticks "$p"); b1=$(ticks "$t")
sleep 3
a2=$(ticks "$p"); b2=$(ticks "$t")
echo "redis-server: $(((a2 - a1) / 3))% of a core, client: $(((b2 - b1) / 3))% of a core (clock ticks at 100 Hz)"
wait "$t"
grep -o 'Benchmark[^ ]*\|[0-9.]* jobs/s' "$out"
rm -f "$out"
