#!/usr/bin/env python3
"""Interactive queries under load, in one run: benches/parts/query.rs
`kstate-query` processes the same input (KEYS new keys, then overwrites of
random keys up to RECORDS, 4 partitions) REPS times per variant, in
rotating order, so machine and broker drift hit all alike:

- `plain`: no queries (the baseline);
- `paced`: 4 threads read random keys at RATE reads/s in all (default 200k);
- `max`: 4 threads read as fast as they can.

Printed: processing of the overwrites (records/s) per variant and its
ratio to `plain` (goal >= 0.9 at 200k reads/s), reads/s, p50/p99/p99.9
read latency (microseconds).

    python3 testing/bench/query_bench.py [RECORDS] [KEYS] [REPS] [RATE]   # default 2000000 1000000 3 200000

Needs a broker (KSTATE_BOOTSTRAP, default: started with testing/kafka.sh).
Builds the bench binary with `cargo bench --no-run`; a failing build shows
the compiler's errors.
"""
import shutil
import statistics
import subprocess
import sys
import time

from benchlib import bootstrap as start_broker, build_bench, rotated, run, sh

VARIANTS = ["plain", "paced", "max"]


def main():
    records = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000
    keys = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    rate = int(sys.argv[4]) if len(sys.argv) > 4 else 200_000
    bootstrap = start_broker()
    binary = build_bench()
    run_id = f"qb{int(time.time())}"
    source = f"{run_id}-in"
    print(run([binary, "query-generate", "--bootstrap", bootstrap, "--topic", source, "--records", str(records), "--keys", str(keys)]), flush=True)
    results = {v: [] for v in VARIANTS}
    try:
        for rep, v in rotated(VARIANTS, reps):
            app = f"{run_id}-{v}{rep}"
            state = f"/tmp/query-bench-{app}"
            r = run([binary, "kstate-query", "--bootstrap", bootstrap, "--app", app, "--input", source,
                     "--records", str(records), "--keys", str(keys), "--state-dir", state, "--variant", v, "--rate", str(rate)])
            results[v].append(r)
            print(f"{v} rep {rep}: {r['records_per_sec']:,.0f} rec/s, {r['reads_per_sec']:,.0f} reads/s "
                  f"(found {r['found']:,}, errors {r['errors']}), p50 {r['p50_us']} us, p99 {r['p99_us']} us, p99.9 {r['p999_us']} us", flush=True)
            sh([binary, "delete-topics", "--bootstrap", bootstrap, "--prefix", app], stdout=subprocess.DEVNULL)
            shutil.rmtree(state, ignore_errors=True)
    finally:
        sh([binary, "delete-topics", "--bootstrap", bootstrap, "--prefix", run_id], stdout=subprocess.DEVNULL)
    med = lambda v, k: statistics.median(r[k] for r in results[v])
    for v in VARIANTS:
        print(f"{v}: median {med(v, 'records_per_sec'):,.0f} rec/s, {med(v, 'reads_per_sec'):,.0f} reads/s, "
              f"p99 {med(v, 'p99_us'):.0f} us; runs {[round(r['records_per_sec']) for r in results[v]]}")
    for v in ("paced", "max"):
        per_rep = [round(a["records_per_sec"] / b["records_per_sec"], 2) for a, b in zip(results[v], results["plain"])]
        print(f"{v} / plain processing: {med(v, 'records_per_sec') / med('plain', 'records_per_sec'):.2f} "
              f"at {med(v, 'reads_per_sec'):,.0f} reads/s (goal >= 0.9 with >= 200k reads/s; per repetition {per_rep})")


if __name__ == "__main__":
    main()
