#!/usr/bin/env python3
"""kstate benchmark runner: kstate vs Kafka Streams vs the physical limit,
on the same broker and the same topic data, in one run.

    python3 testing/bench/run.py            # small default size (a few minutes)
    python3 testing/bench/run.py --full     # the published size (5M records)

Starts a broker with testing/kafka.sh unless KSTATE_BOOTSTRAP is set. Builds
the Rust contenders (`cargo bench --no-run`) and the Kafka Streams jar (Maven).
Prints one table per scenario (medians of --reps runs) and writes
target/bench/results.json. Peak RSS comes from wait4() of each contender.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
JAR = os.path.join(ROOT, "testing/bench/kstreams/target/kstreams-bench.jar")


def log(msg):
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def settle():
    """Lets the previous contender's writes reach the disk before the next
    contender starts: the kernel's background writeback of a 5M-record run
    (about 1 GB of broker log) would otherwise compete with the next one
    for CPU and disk, whichever it is."""
    os.sync()
    time.sleep(1)


def run_json(cmd, env=None):
    """Runs a contender; returns (its JSON result, peak RSS bytes)."""
    settle()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, cwd=ROOT)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    line = out.decode().strip().splitlines()[-1] if out.strip() else "{}"
    result = json.loads(line)
    if proc.returncode != 0 or "error" in result:
        raise SystemExit(f"contender failed: {' '.join(cmd)}\n{line}")
    result["peak_rss_bytes"] = usage.ru_maxrss * 1024
    return result


def build_rust():
    log("building the Rust contenders (cargo bench --no-run)")
    out = subprocess.run(
        ["cargo", "bench", "--bench", "kstate_bench", "--no-run", "--message-format=json"],
        cwd=ROOT, check=True, stdout=subprocess.PIPE).stdout.decode()
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "kstate_bench" and msg.get("executable"):
            return msg["executable"]
    raise SystemExit("could not find the kstate_bench executable")


def build_java():
    log("building the Kafka Streams contender (maven)")
    subprocess.run(["mvn", "-q", "-B", "-f", "testing/bench/kstreams/pom.xml", "package", "-DskipTests"],
                   cwd=ROOT, check=True)


def start_broker():
    if os.environ.get("KSTATE_BOOTSTRAP"):
        return os.environ["KSTATE_BOOTSTRAP"], False
    status = subprocess.run(["bash", "testing/kafka.sh", "status"], cwd=ROOT, stdout=subprocess.DEVNULL)
    if status.returncode == 0:
        return "127.0.0.1:9092", False
    out = subprocess.run(["bash", "testing/kafka.sh", "start"], cwd=ROOT, check=True, stdout=subprocess.PIPE)
    return out.stdout.decode().strip().splitlines()[-1], True


def median_of(results, key):
    vals = [r[key] for r in results if key in r]
    return statistics.median(vals) if vals else None


class Suite:
    def __init__(self, args, bootstrap, rust_bin):
        self.a = args
        self.b = bootstrap
        self.rust = rust_bin
        self.java = ["java", f"-Xmx{args.java_heap}", "-jar", JAR]
        self.run_id = f"bench{int(time.time())}"
        self.tmp = tempfile.mkdtemp(prefix="kstate-bench-")
        self.scenarios = {}

    def gen(self, topic, records, compact=True, append=False, seed=42):
        cmd = self.java + ["generate", "--bootstrap", self.b, "--topic", topic, "--partitions", str(self.a.partitions),
                           "--records", str(records), "--seed", str(seed), "--compact", "true" if compact else "false"]
        if append:
            cmd.append("--append")
        return run_json(cmd)

    def record(self, scenario, contender, result):
        self.scenarios.setdefault(scenario, {}).setdefault(contender, []).append(result)
        log(f"{scenario:<13} {contender:<15} {result.get('records_per_sec', 0):>12.0f} rec/s "
            f"{result.get('seconds', 0):8.3f} s  rss {result['peak_rss_bytes'] / 2**20:7.1f} MiB")

    def restore(self):
        app, store = f"{self.run_id}-r", "kv"
        changelog = f"{app}-{store}-changelog"
        inp = f"{app}-input"
        log(f"generating {self.a.records} changelog records into {changelog}")
        self.gen(changelog, self.a.records)
        self.gen(inp, 0, compact=False)
        ks_state = os.path.join(self.tmp, "ks-restore")
        for rep in range(self.a.reps):
            self.record("restore", "plain-consumer", run_json([self.rust, "consume", "--bootstrap", self.b, "--topic", changelog]))
            self.record("restore", "plain-consumer-batch", run_json(
                [self.rust, "consume-batch", "--bootstrap", self.b, "--topic", changelog]))
            self.record("restore", "rocksdb-raw", run_json(
                [self.rust, "rocksdb-raw", "--bootstrap", self.b, "--topic", changelog, "--dir", os.path.join(self.tmp, "raw")]))
            kst = os.path.join(self.tmp, "kstate-restore")
            shutil.rmtree(kst, ignore_errors=True)
            self.record("restore", "kstate", run_json(
                [self.rust, "kstate-restore", "--bootstrap", self.b, "--app", app, "--store", store, "--input", inp, "--state-dir", kst]))
            self.record("restore", "kafka-streams", run_json(self.java + [
                "restore", "--bootstrap", self.b, "--app-id", app, "--store", store, "--input-topic", inp,
                "--partitions", str(self.a.partitions), "--state-dir", ks_state]))
        # Tail restore: 1% more records on top of the state both just restored.
        for rep in range(self.a.reps):
            self.gen(changelog, max(1, self.a.records // 100), append=True, seed=1000 + rep)
            kst = os.path.join(self.tmp, "kstate-restore")
            r = run_json([self.rust, "kstate-restore", "--bootstrap", self.b, "--app", app, "--store", store, "--input", inp, "--state-dir", kst])
            r["seconds"] = r["seconds_to_running"]
            self.record("tail-restore", "kstate", r)
            r = run_json(self.java + ["tail-restore", "--bootstrap", self.b, "--app-id", app, "--store", store, "--input-topic", inp,
                                      "--partitions", str(self.a.partitions), "--state-dir", ks_state])
            self.record("tail-restore", "kafka-streams", r)

    def write(self):
        inp = f"{self.run_id}-w-input"
        log(f"generating {self.a.records} input records into {inp}")
        self.gen(inp, self.a.records, compact=False)
        # Each contender's output (5M records, ~0.6 GB) is deleted once it is
        # measured, so every contender runs against the same broker: with 12
        # outputs piling up, producer and kstate alike ran 20-35% slower in
        # later repetitions (not understood; see BENCHMARKS.md).
        for rep in range(self.a.reps):
            out, pipe, wk, ws = (f"{self.run_id}-w-out{rep}", f"{self.run_id}-w-pipe{rep}",
                                 f"{self.run_id}-wk{rep}-", f"{self.run_id}-ws{rep}-")
            self.record("write", "plain-producer", run_json(
                [self.rust, "produce", "--bootstrap", self.b, "--topic", self.fresh_topic(out), "--source", inp]))
            self.delete_topics(out)
            self.record("write", "consume-produce", run_json(
                [self.rust, "pipe", "--bootstrap", self.b, "--input", inp, "--output", self.fresh_topic(pipe)]))
            self.delete_topics(pipe)
            self.record("write", "kstate", run_json(
                [self.rust, "kstate-write", "--bootstrap", self.b, "--app", wk[:-1], "--input", inp,
                 "--records", str(self.a.records), "--state-dir", os.path.join(self.tmp, f"kstate-w{rep}")]))
            self.delete_topics(wk)
            shutil.rmtree(os.path.join(self.tmp, f"kstate-w{rep}"), ignore_errors=True)
            self.record("write", "kafka-streams", run_json(self.java + [
                "write", "--bootstrap", self.b, "--app-id", ws[:-1], "--store", "kv", "--input-topic", inp,
                "--partitions", str(self.a.partitions), "--state-dir", os.path.join(self.tmp, f"ks-w{rep}"),
                "--records", str(self.a.records)]))
            self.delete_topics(ws)
            shutil.rmtree(os.path.join(self.tmp, f"ks-w{rep}"), ignore_errors=True)

    def delete_topics(self, prefix=None):
        """Deletes this run's topics (or those starting with `prefix`): a
        --full run writes about 15 GB to the broker."""
        subprocess.run([self.rust, "delete-topics", "--bootstrap", self.b, "--prefix", prefix or self.run_id],
                       cwd=ROOT, stdout=subprocess.DEVNULL)

    def fresh_topic(self, name):
        self.gen(name, 0, compact=False)
        return name

    def report(self):
        baselines = {"restore": "plain-consumer", "tail-restore": "kafka-streams", "write": "plain-producer"}
        out = []
        for scenario, contenders in self.scenarios.items():
            base = median_of(contenders.get(baselines[scenario], []), "records_per_sec")
            base_secs = median_of(contenders.get(baselines[scenario], []), "seconds")
            print(f"\n## {scenario} ({self.a.records} records, {self.a.partitions} partitions, median of {self.a.reps})")
            print(f"| contender | records | records/s | MB/s | seconds | peak RSS MiB | ratio to {baselines[scenario]} |")
            print("|---|---:|---:|---:|---:|---:|---:|")
            for name, results in contenders.items():
                rps = median_of(results, "records_per_sec")
                secs = median_of(results, "seconds")
                # Contenders that report no bytes (Kafka Streams) read the same
                # records, so their MB/s follows from the scenario's record size.
                per_record = next((r["bytes"] / r["records"] for rs in contenders.values() for r in rs
                                   if r.get("bytes") and r.get("records")), None)
                mbs = median_of([dict(r, mb=(r.get("bytes") or r["records"] * (per_record or 0)) / r["seconds"] / 1e6)
                                 for r in results if r.get("seconds")], "mb")
                rss = median_of(results, "peak_rss_bytes")
                ratio = (base_secs / secs) if scenario == "tail-restore" else (rps / base if base else None)
                print(f"| {name} | {int(median_of(results, 'records'))} | {rps:,.0f} | "
                      f"{mbs if mbs is None else f'{mbs:.1f}'} | {secs:.3f} | {rss / 2**20:.0f} | {ratio:.2f} |")
                out.append({"scenario": scenario, "contender": name, "records_per_sec": rps, "mb_per_sec": mbs,
                            "seconds": secs, "peak_rss_bytes": rss, "ratio_to_baseline": ratio,
                            "baseline": baselines[scenario], "runs": results})
        os.makedirs(os.path.join(ROOT, "target/bench"), exist_ok=True)
        with open(os.path.join(ROOT, "target/bench/results.json"), "w") as f:
            json.dump({"records": self.a.records, "partitions": self.a.partitions, "reps": self.a.reps,
                       "results": out}, f, indent=1)
        log("wrote target/bench/results.json")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--full", action="store_true", help="5M records (the published size)")
    p.add_argument("--records", type=int, default=None)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--java-heap", default="1g")
    p.add_argument("--only", choices=["restore", "write"], default=None)
    a = p.parse_args()
    a.records = a.records or (5_000_000 if a.full else 500_000)
    bootstrap, started = start_broker()
    suite = None
    try:
        rust = build_rust()
        build_java()
        suite = Suite(a, bootstrap, rust)
        if a.only in (None, "restore"):
            suite.restore()
        if a.only in (None, "write"):
            suite.write()
        suite.report()
    finally:
        if suite is not None:
            suite.delete_topics()
            shutil.rmtree(suite.tmp, ignore_errors=True)
        if started:
            subprocess.run(["bash", "testing/kafka.sh", "stop"], cwd=ROOT)


if __name__ == "__main__":
    main()
