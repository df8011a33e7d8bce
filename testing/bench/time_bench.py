#!/usr/bin/env python3
"""Time features against the same workload without them, in one run:
every variant of benches/kstate_bench.rs `kstate-time` processes the same
input (N generated records, 4 partitions) REPS times, in rotating order, so
machine and broker drift hit all alike.

    python3 testing/bench/time_bench.py [RECORDS] [REPS]     # default 2000000 3

Ratios printed: `timers` (one stream-time timer registered and, in steady
state, one fired per record) / `plain` (goal >= 0.7); `ttl` (writes into a
TTL store) / `plain` and `ttl-read` (a get and a write per record) / `read`
(goal >= 0.9). Needs a broker (KSTATE_BOOTSTRAP, default 127.0.0.1:9092;
started with testing/kafka.sh otherwise) and the Kafka Streams jar for the
data generator (built here with Maven if missing). Builds the bench binary
with `cargo bench --no-run`; a failing build shows the compiler's errors.
"""
import os
import shutil
import statistics
import subprocess
import sys
import time

from benchlib import bootstrap as start_broker, ROOT, build_bench, rotated, run, sh

JAR = os.path.join(ROOT, "testing/bench/kstreams/target/kstreams-bench.jar")
VARIANTS = ["plain", "timers", "ttl", "read", "ttl-read"]


def build():
    if not os.path.exists(JAR):
        if sh(["mvn", "-q", "-B", "-f", "testing/bench/kstreams/pom.xml", "package", "-DskipTests"]).returncode:
            sys.exit("building the Kafka Streams jar (the data generator) failed; see Maven's output above")
    return build_bench()


def main():
    records = int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    bootstrap = start_broker()
    binary = build()
    run_id = f"tb{int(time.time())}"
    source = f"{run_id}-in"
    run(["java", "-Xmx1g", "-jar", JAR, "generate", "--bootstrap", bootstrap, "--topic", source,
         "--partitions", "4", "--records", str(records), "--seed", "42", "--compact", "false"])
    rates = {v: [] for v in VARIANTS}
    try:
        for rep, v in rotated(VARIANTS, reps):
            app = f"{run_id}-{v}{rep}"
            state = f"/tmp/time-bench-{app}"
            r = run([binary, "kstate-time", "--bootstrap", bootstrap, "--app", app, "--input", source,
                     "--records", str(records), "--state-dir", state, "--variant", v])
            rates[v].append(r["records_per_sec"])
            print(f"{v} rep {rep}: {r['records_per_sec']:,.0f} rec/s (timers fired {r['timers_fired']:,})", flush=True)
            sh([binary, "delete-topics", "--bootstrap", bootstrap, "--prefix", app], stdout=subprocess.DEVNULL)
            shutil.rmtree(state, ignore_errors=True)
    finally:
        sh([binary, "delete-topics", "--bootstrap", bootstrap, "--prefix", run_id], stdout=subprocess.DEVNULL)
    med = {v: statistics.median(x) for v, x in rates.items()}
    for v in VARIANTS:
        print(f"{v}: median {med[v]:,.0f} rec/s, runs {[round(x) for x in rates[v]]}")
    for a, b, goal in (("timers", "plain", 0.7), ("ttl", "plain", 0.9), ("ttl-read", "read", 0.9)):
        per_rep = [round(x / y, 2) for x, y in zip(rates[a], rates[b])]
        print(f"{a} / {b}: {med[a] / med[b]:.2f} (goal >= {goal}; per repetition {per_rep})")


if __name__ == "__main__":
    main()
