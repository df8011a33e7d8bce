#!/usr/bin/env python3
"""A/B of kstate's write path (or, with `restore`, of a full restore): two
builds of benches/kstate_bench.rs run the `kstate-write` (`kstate-restore`)
contender alternately on the same input, so machine and broker drift hit
both alike. A restore A/B also runs the plain consumer on the same
changelog in every repetition (the limit both sides are measured against).

    # build each side and keep its binary (cargo reuses one path for both:
    # touch the sources so it rebuilds)
    git worktree add /tmp/kstate-old <commit>
    (cd /tmp/kstate-old && touch src/*.rs && cargo bench --bench kstate_bench --no-run)
    cp "$CARGO_TARGET_DIR"/release/deps/kstate_bench-<hash> /tmp/bench-old
    (touch src/*.rs && cargo bench --bench kstate_bench --no-run)
    cp "$CARGO_TARGET_DIR"/release/deps/kstate_bench-<hash> /tmp/bench-new
    python3 testing/bench/ab_write.py /tmp/bench-old /tmp/bench-new 5000000
    python3 testing/bench/ab_write.py /tmp/bench-old /tmp/bench-new 2000000 5 restore

Needs a broker (KSTATE_BOOTSTRAP, default 127.0.0.1:9092) and the Kafka
Streams jar for the data generator (built by testing/bench/run.py).
Prints each run and the medians.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
JAR = os.path.join(ROOT, "testing/bench/kstreams/target/kstreams-bench.jar")


def run(cmd):
    os.sync()
    time.sleep(1)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, cwd=ROOT, check=True).stdout.decode()
    return json.loads(out.strip().splitlines()[-1])


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    bins = {"old": sys.argv[1], "new": sys.argv[2]}
    records = int(sys.argv[3]) if len(sys.argv) > 3 else 5_000_000
    reps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    if len(sys.argv) > 5 and sys.argv[5] == "restore":
        return ab_restore(bins, records, reps)
    bootstrap = os.environ.get("KSTATE_BOOTSTRAP", "127.0.0.1:9092")
    run_id = f"ab{int(time.time())}"
    source = f"{run_id}-in"
    run(["java", "-Xmx1g", "-jar", JAR, "generate", "--bootstrap", bootstrap, "--topic", source,
         "--partitions", "4", "--records", str(records), "--seed", "42", "--compact", "false"])
    rates = {"old": [], "new": []}
    try:
        for rep in range(reps):
            for side in (["new", "old"] if rep % 2 == 0 else ["old", "new"]):
                app = f"{run_id}-{side}{rep}"
                state = f"/tmp/ab-state-{app}"
                r = run([bins[side], "kstate-write", "--bootstrap", bootstrap, "--app", app, "--input", source,
                         "--records", str(records), "--state-dir", state])
                rates[side].append(r["records_per_sec"])
                print(f"{side} rep {rep}: {r['records_per_sec']:,.0f} rec/s", flush=True)
                subprocess.run([bins["new"], "delete-topics", "--bootstrap", bootstrap, "--prefix", app],
                               stdout=subprocess.DEVNULL)
                shutil.rmtree(state, ignore_errors=True)
    finally:
        subprocess.run([bins["new"], "delete-topics", "--bootstrap", bootstrap, "--prefix", run_id],
                       stdout=subprocess.DEVNULL)
    for side, values in rates.items():
        print(f"{side}: median {statistics.median(values):,.0f} rec/s, runs {[round(v) for v in values]}")


def ab_restore(bins, records, reps):
    """Full restores of one compacted changelog of `records` records into an
    empty state dir, old and new alternately, and the plain consumer."""
    bootstrap = os.environ.get("KSTATE_BOOTSTRAP", "127.0.0.1:9092")
    run_id = f"abr{int(time.time())}"
    app, store = f"{run_id}-r", "kv"
    changelog, inp = f"{app}-{store}-changelog", f"{app}-input"
    for topic, n, compact in ((changelog, records, "true"), (inp, 0, "false")):
        run(["java", "-Xmx1g", "-jar", JAR, "generate", "--bootstrap", bootstrap, "--topic", topic,
             "--partitions", "4", "--records", str(n), "--seed", "42", "--compact", compact])
    rates = {"old": [], "new": [], "plain-consumer": []}
    try:
        for rep in range(reps):
            r = run([bins["new"], "consume", "--bootstrap", bootstrap, "--topic", changelog])
            rates["plain-consumer"].append(r["records_per_sec"])
            print(f"plain-consumer rep {rep}: {r['records_per_sec']:,.0f} rec/s", flush=True)
            for side in (["new", "old"] if rep % 2 == 0 else ["old", "new"]):
                state = f"/tmp/ab-state-{run_id}-{side}{rep}"
                r = run([bins[side], "kstate-restore", "--bootstrap", bootstrap, "--app", app, "--store", store,
                         "--input", inp, "--state-dir", state])
                rates[side].append(r["records_per_sec"])
                print(f"{side} rep {rep}: {r['records_per_sec']:,.0f} rec/s", flush=True)
                shutil.rmtree(state, ignore_errors=True)
    finally:
        subprocess.run([bins["new"], "delete-topics", "--bootstrap", bootstrap, "--prefix", run_id],
                       stdout=subprocess.DEVNULL)
    limit = statistics.median(rates["plain-consumer"])
    for side, values in rates.items():
        print(f"{side}: median {statistics.median(values):,.0f} rec/s ({statistics.median(values) / limit:.2f} of the "
              f"plain consumer), runs {[round(v) for v in values]}")


if __name__ == "__main__":
    main()
