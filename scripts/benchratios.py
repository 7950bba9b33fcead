"""Medians of scripts/benchloop's output per benchmark, build and design,
and the per-round ratios jobkey / each other design within a build.

usage: python3 scripts/benchratios.py OUT
"""
import sys, re, statistics as st, collections
rows = collections.defaultdict(list)  # (bench, build, design) -> list of dict per run (in order)
for line in open(sys.argv[1]):
    f = line.split()
    if not f or not f[0].startswith('Benchmark'): continue
    m = re.match(r'Benchmark(\w+)/build=(\w+)/design=([\w-]+?)(?:/payload=\w+)?-\d+$', f[0])
    if not m: continue
    bench, build, design = m.groups()
    d = {}
    for i in range(3, len(f)):
        try: d[f[i]] = float(f[i-1])
        except: pass
    rows[(bench, build, design)].append(d)  # {} for a failed run: keeps rounds aligned
keys = ['jobs/s','client-µs/job','redis-µs/job','allocs/job','rtt/op','redis-cmds/op','calls/batch','p50-µs/call','p50-ms','p99-ms','p99.9-ms']
def med(v): return st.median(v) if v else float('nan')
print('| bench | build | design | n | ' + ' | '.join(keys) + ' |')
for (bench, build, design), runs in sorted(rows.items()):
    vals = []
    for k in keys:
        v = [r[k] for r in runs if k in r]
        vals.append('%.4g' % med(v) if v else '')
    print(f'| {bench} | {build} | {design} | {sum(1 for r in runs if r)} | ' + ' | '.join(vals) + ' |')
print()
print('per-run ratios jobkey / other (median, min-max):')
for (bench, build, design), runs in sorted(rows.items()):
    if design == 'jobkey': continue
    jk = rows.get((bench, build, 'jobkey'))
    if not jk: continue
    for k in ['jobs/s','client-µs/job','redis-µs/job']:
        rs = [a[k]/b[k] for a, b in zip(jk, runs) if k in a and k in b and b[k] > 0]
        if rs: print(f'  {bench} {build} jobkey/{design} {k}: {st.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f}) n={len(rs)}')
