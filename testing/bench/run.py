#!/usr/bin/env python3
"""kstate benchmark runner: kstate vs Kafka Streams vs the physical limit,
on the same broker and the same topic data, in one run.

    python3 testing/bench/run.py            # small default size (a few minutes)
    python3 testing/bench/run.py --full     # the published size (5M records)
    python3 testing/bench/run.py --only failover [--full]   # failover: 200k records (--full: 2M and 10M)
    python3 testing/bench/run.py --only scaleout [--scaleout-records 5000000]   # scale-out: 1 -> 3 instances
    python3 testing/bench/run.py --only write-eos [--full]   # write with output, at-least-once vs exactly-once
    python3 testing/bench/run.py --only window [--records N]  # hopping-window counts and their restore
    python3 testing/bench/run.py --only snapshot [--records N]  # restore from a snapshot in S3 (MinIO)
    python3 testing/bench/run.py --only processor [--records N]  # the Processor trait vs the closure
    python3 testing/bench/run.py --only threads [--records N] [--work R]  # 1, 2 and 4 processing threads
    python3 testing/bench/run.py --only repartition [--records N]  # a count re-keyed through a repartition topic
    python3 testing/bench/run.py --only join [--records N]  # a stream-table left join over a source table
    python3 testing/bench/run.py --only memory [--records N]  # in-memory stores vs RocksDB (kstate and Kafka Streams)
    python3 testing/bench/run.py --only remote [--records N] [--remote-latency-ms 30]  # time to running on an empty instance: remote stores vs restores
    python3 testing/bench/run.py --only remote-rmw [--records N] [--remote-latency-ms 30]  # counting throughput, remote vs RocksDB, and after a move to an empty instance

Starts a broker with testing/kafka.sh unless KSTATE_BOOTSTRAP is set. Builds
the Rust contenders (`cargo bench --no-run`) and the Kafka Streams jar (Maven).
Prints one table per scenario (medians of --reps runs) and writes
target/bench/results.json. Peak RSS comes from wait4() of each contender.

The failover scenario runs only with `--only failover` (see Suite.failover):
three instances of each contender (kstate and Kafka Streams, each with 0 and
1 standby replica) share a 6-partition input under a steady load; one owner
is SIGKILLed and every partition it owned is timed from the kill, and from its
new owner's assignment, to the first record that new owner processes.

The scaleout scenario runs only with `--only scaleout` (see Suite.scaleout):
one instance of each contender (kstate, Kafka Streams) owns all 6 partitions
of a state of N records (default 5M) under a steady load; two more start at
once. With the same KIP-441 settings for both (acceptable recovery lag 10000,
2 warmups, probing every 60 s, no standbys) it measures the longest pause in
any partition's processing and the time until every instance processes 2
partitions, and counts rebalances, probing rounds and restores of moved
partitions.

The write-eos scenario runs only with `--only write-eos` (see
Suite.write_eos): the write scenario (put every input record into the store)
plus one output record per input record (the record itself, to a fresh
output topic with the input's partition count), for kstate and Kafka Streams
each at-least-once and exactly-once (exactly_once_v2), commit interval
100 ms for all four. Measured as write; afterwards each output topic is
counted with isolation.level=read_committed (`output_records`, expected N).

The window scenario runs only with `--only window` (see Suite.window): N
input records over about 100k keys (new keys at random among overwrites of
earlier ones, no tombstones), event time = offset x 5 ms per partition (the same for both
contenders), counted per key in hopping windows of 5 min advancing by 1
min, grace 0, retention size + grace (both contenders' default): kstate's
window store `update` vs Kafka Streams'
`groupByKey().windowedBy(TimeWindows).count()` with its default 10 MB
record cache (kstate's overlay plays the cache's part: one changelog record
per key and commit). `window` is processing throughput (first to N-th
record); `window-restore` restores each contender's own window changelog
(what its processing wrote) into an empty state dir. Peak RSS as usual.

The snapshot scenario runs only with `--only snapshot` (see
Suite.snapshot): a changelog of N records (the restore scenario's
generator: 75% new keys, 20% overwrites, 5% tombstones, 100-byte random
values) is restored once into a source state dir, which kstate snapshots
into a MinIO server (testing/minio.sh, on this machine: loopback, one
disk) at once (`snapshot-upload` full); then 1% more records are appended
and the source snapshots again (`snapshot-upload` delta: only the new SST
files go up); then 1% more are appended (the tail past the snapshot). Each
rep restores that changelog into an empty state dir three ways: kstate's
full replay, kstate seeded from the snapshot plus the tail replay, and
Kafka Streams' restore; times are from the start of the process's
application to every partition restored (kstate: `seconds_to_running`;
Kafka Streams: its restore listener's span, which leaves out its startup,
to its advantage).

The processor scenario runs only with `--only processor` (see
Suite.processor): the write scenario with one output per record, its body
run as `App::run`'s closure and as a `Processor` per task
(`run_processor`), alternating in each rep; the ratio is trait / closure
(records/s, medians), with each rep's pair printed for the spread.
"""
import argparse
import calendar
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
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
    # The contender's whole life (start, restore, shutdown; a JVM's start
    # too), user + system, broker excluded: a cost that does not depend on
    # how the two cores are shared, as a rate does.
    result["cpu_seconds"] = usage.ru_utime + usage.ru_stime
    return result


def cargo_executable(args, name, what):
    """Builds with `cargo <args> --message-format=json` and returns the path
    of the executable artifact `name`."""
    log(f"building {what} (cargo {' '.join(args)})")
    proc = subprocess.run(["cargo", *args, "--message-format=json"], cwd=ROOT, stdout=subprocess.PIPE)
    out = proc.stdout.decode()
    if proc.returncode != 0:
        # The compiler's own messages (they are inside the JSON lines).
        for line in out.splitlines():
            msg = json.loads(line) if line.startswith("{") else {}
            rendered = (msg.get("message") or {}).get("rendered")
            if msg.get("reason") == "compiler-message" and rendered:
                sys.stderr.write(rendered)
        raise SystemExit(f"building {what} failed (cargo {' '.join(args)}); the compiler's messages are above")
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == name and msg.get("executable"):
            return msg["executable"]
    raise SystemExit(f"could not find the {name} executable")


def build_rust():
    return cargo_executable(["bench", "--bench", "kstate_bench", "--features", "s3,remote", "--no-run"], "kstate_bench", "the Rust contenders")


def build_failover_example():
    return cargo_executable(["build", "--release", "--example", "failover_bench"], "failover_bench", "the kstate failover instance")


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


MINIO_STARTED = []


def minio_env():
    """The S3 settings of a MinIO server (testing/minio.sh), started here
    unless one runs or KSTATE_S3_ENDPOINT names another (then the AWS_*
    variables must be set too)."""
    if os.environ.get("KSTATE_S3_ENDPOINT"):
        env = {"AWS_ENDPOINT": os.environ["KSTATE_S3_ENDPOINT"], "KSTATE_S3_BUCKET": os.environ.get("KSTATE_S3_BUCKET", "kstate-test")}
        return env
    if subprocess.run(["bash", "testing/minio.sh", "status"], cwd=ROOT).returncode != 0:
        log("starting MinIO (testing/minio.sh; built once from the Go module proxy)")
        subprocess.run(["bash", "testing/minio.sh", "start"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        MINIO_STARTED.append(True)
    lines = subprocess.run(["bash", "testing/minio.sh", "env"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    env = dict(l.split("=", 1) for l in lines.split())
    env["AWS_ENDPOINT"] = env["KSTATE_S3_ENDPOINT"]
    return env


def dir_bytes(path):
    """Bytes of the files under `path` (0 if it does not exist)."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def median_of(results, key):
    vals = [r[key] for r in results if key in r]
    return statistics.median(vals) if vals else None


FAILOVER_PARTITIONS = 6
EVENT = re.compile(r"^(ASSIGNED_FIRST_RECORD|RESTORE_START|RESTORE_END|STATUS|PROGRESS) (.*)$")


def now_ms():
    return int(time.time() * 1000)


def log_line_ms(line):
    """Wall-clock ms of a contender's log line, or None: kstate's tracing
    lines start with `2026-12-03T09:34:15.373832Z` (UTC), Kafka Streams'
    slf4j-simple lines with `09:34:15.373` (local time, today)."""
    first = line.split(" ", 1)[0]
    try:
        if "T" in first and first.endswith("Z"):
            day, _, clock = first.rstrip("Z").partition("T")
            secs = calendar.timegm(time.strptime(f"{day} {clock.split('.')[0]}", "%Y-%m-%d %H:%M:%S"))
            return int(secs * 1000) + int((clock.split(".") + ["0"])[1][:3].ljust(3, "0"))
        if re.match(r"^\d\d:\d\d:\d\d\.\d{3}$", first):
            day = time.strftime("%Y-%m-%d", time.localtime())
            secs = time.mktime(time.strptime(f"{day} {first.split('.')[0]}", "%Y-%m-%d %H:%M:%S"))
            return int(secs * 1000) + int(first.split(".")[1])
    except ValueError:
        return None
    return None


def parse_pairs(text):
    """`P:V,P:V` (or `-`) -> {P: V}."""
    if text in ("", "-"):
        return {}
    return {int(p): int(v) for p, v in (x.split(":") for x in text.split(","))}


class Instance:
    """One failover instance (kstate's examples/failover_bench.rs or the
    Kafka Streams `failover` subcommand): event lines from its stdout are
    collected by a thread, stderr goes to a log file; it stops when its stdin
    is closed."""

    def __init__(self, name, cmd, log_path):
        self.name = name
        self.log_path = log_path
        self.events = []
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(log_path, "w"))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for raw in self.proc.stdout:
            m = EVENT.match(raw.decode(errors="replace").strip())
            if not m:
                continue
            ev = {"kind": m.group(1)}
            for field in m.group(2).split():
                k, _, v = field.partition("=")
                ev[k] = v
            with self.lock:
                self.events.append(ev)

    def alive(self):
        return self.proc.poll() is None

    def check(self):
        if not self.alive():
            raise RuntimeError(f"instance {self.name} ended on its own (exit {self.proc.returncode}); "
                               f"see {self.log_path}:\n{self.tail()}")

    def tail(self, n=15):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def status(self):
        """The last STATUS line: ({partition: age ms} active, {partition: lag} standby), or None."""
        with self.lock:
            last = next((e for e in reversed(self.events) if e["kind"] == "STATUS"), None)
        if last is None:
            return None
        return parse_pairs(last["active"]), parse_pairs(last["standby"])

    def find(self, kind, partition, since_ms):
        with self.lock:
            return [e for e in self.events if e["kind"] == kind and int(e["partition"]) == partition
                    and int(e["ts"]) >= since_ms]

    def assignments_received(self):
        """Wall-clock ms of each group assignment this instance received, from
        its log: kstate's `assignment received` (after its SyncGroup
        response), Kafka Streams' consumer coordinator `Successfully synced
        group in generation` (logged at INFO for this scenario)."""
        return [ms for ms, _ in self.log_lines("assignment received", "Successfully synced group in generation")]

    def log_lines(self, *needles):
        """[(wall-clock ms, line)] of the lines of its log holding any of `needles`."""
        try:
            text = open(self.log_path, errors="replace").read()
        except OSError:
            return []
        out = []
        for line in text.splitlines():
            if any(n in line for n in needles):
                ms = log_line_ms(line)
                if ms is not None:
                    out.append((ms, line))
        return out

    def generations(self):
        """[(wall-clock ms, generation id)] of each group assignment this
        instance received (see assignments_received)."""
        out = []
        for ms, line in self.log_lines("assignment received", "Successfully synced group in generation"):
            m = re.search(r"generation(?:Id)?=(\d+)", line)
            if m:
                out.append((ms, int(m.group(1))))
        return out

    def last_status(self):
        """The last STATUS event (a dict of its fields), or None."""
        with self.lock:
            return next((e for e in reversed(self.events) if e["kind"] == "STATUS"), None)

    def events_of(self, kind):
        with self.lock:
            return [e for e in self.events if e["kind"] == kind]

    def stop(self, timeout=60):
        """Closes stdin (a clean stop); SIGKILL if it does not end in `timeout` s."""
        if self.alive():
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log(f"{self.name} did not stop within {timeout} s; killing it")
        self.kill()

    def kill(self):
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def wait_for(what, timeout, cond, instances=()):
    deadline = time.time() + timeout
    while True:
        for i in instances:
            i.check()
        r = cond()
        if r:
            return r
        if time.time() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def spread(vals):
    vals = sorted(v for v in vals if v is not None)
    if not vals:
        return "-"
    return f"{statistics.median(vals):.3f} [{vals[0]:.3f}-{vals[-1]:.3f}]"


class Suite:
    def __init__(self, args, bootstrap, rust_bin, failover_bin=None):
        self.a = args
        self.b = bootstrap
        self.rust = rust_bin
        self.failover_bin = failover_bin
        self.failover_results = {}
        self.scaleout_results = {}
        self.snapshot_results = {}
        self.remote_results = {}
        self.remote_rmw_results = {}
        self.java = ["java", f"-Xmx{args.java_heap}", "-jar", JAR]
        self.run_id = f"bench{int(time.time())}"
        self.tmp = tempfile.mkdtemp(prefix="kstate-bench-")
        self.scenarios = {}

    def gen(self, topic, records, compact=True, append=False, seed=42, partitions=None, extra=()):
        cmd = self.java + ["generate", "--bootstrap", self.b, "--topic", topic,
                           "--partitions", str(partitions or self.a.partitions), "--records", str(records),
                           "--seed", str(seed), "--compact", "true" if compact else "false", *extra]
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
            # The same records as a source table's topic (AppBuilder::table):
            # restored from the topic itself, up to the committed offset.
            kst_table = os.path.join(self.tmp, "kstate-table-restore")
            shutil.rmtree(kst_table, ignore_errors=True)
            self.record("restore", "kstate-table", run_json(
                [self.rust, "kstate-restore", "--bootstrap", self.b, "--app", f"{app}-table-{rep}", "--store", store, "--input", inp,
                 "--state-dir", kst_table, "--table", changelog]))
            # Kafka Streams' own source-table restore (builder.table with
            # topology.optimization=all: the topic is the store's changelog).
            self.record("restore", "kafka-streams-table", run_json(self.java + [
                "table-restore", "--bootstrap", self.b, "--app-id", f"{app}-kstable-{rep}", "--store", store, "--input-topic", inp,
                "--partitions", str(self.a.partitions), "--state-dir", os.path.join(self.tmp, "ks-table-restore"), "--table-topic", changelog]))
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

    def snapshot(self):
        app, store = f"{self.run_id}-s", "kv"
        changelog, inp = f"{app}-{store}-changelog", f"{app}-input"
        n = self.a.records
        env = dict(os.environ, **minio_env())
        url = f"s3://{env['KSTATE_S3_BUCKET']}/{self.run_id}"
        log(f"generating {n} changelog records into {changelog}")
        self.gen(changelog, n)
        self.gen(inp, 0, compact=False)
        src = os.path.join(self.tmp, "snap-src")
        common = ["--bootstrap", self.b, "--app", app, "--store", store, "--input", inp]
        run_json([self.rust, "kstate-restore", *common, "--state-dir", src], env=env)
        res = self.snapshot_results
        res.setdefault("upload-full", []).append(run_json([self.rust, "kstate-snapshot", *common, "--state-dir", src, "--snapshot-url", url], env=env))
        log(f"snapshot (full): {res['upload-full'][-1]}")
        self.gen(changelog, max(1, n // 100), append=True, seed=2000)
        res.setdefault("upload-delta-1pct", []).append(run_json([self.rust, "kstate-snapshot", *common, "--state-dir", src, "--snapshot-url", url], env=env))
        log(f"snapshot (after 1% more records): {res['upload-delta-1pct'][-1]}")
        self.gen(changelog, max(1, n // 100), append=True, seed=3000)
        shutil.rmtree(src, ignore_errors=True)
        ks_state = os.path.join(self.tmp, "ks-snap")
        for rep in range(self.a.reps):
            for name, extra in (("kstate-full-replay", []), ("kstate-snapshot+tail", ["--snapshot-url", url])):
                d = os.path.join(self.tmp, f"snap-{rep}")
                shutil.rmtree(d, ignore_errors=True)
                r = run_json([self.rust, "kstate-restore", *common, "--state-dir", d, *extra], env=env)
                r["seconds"] = r["seconds_to_running"]
                res.setdefault(name, []).append(r)
                log(f"snapshot-restore {name:<22} {r['seconds']:8.3f} s  records {r['records']}  seeded {r.get('seeded_partitions')}"
                    f"  rss {r['peak_rss_bytes'] / 2**20:.0f} MiB")
                shutil.rmtree(d, ignore_errors=True)
            shutil.rmtree(ks_state, ignore_errors=True)
            r = run_json(self.java + ["restore", "--bootstrap", self.b, "--app-id", app, "--store", store, "--input-topic", inp,
                                      "--partitions", str(self.a.partitions), "--state-dir", ks_state])
            res.setdefault("kafka-streams", []).append(r)
            log(f"snapshot-restore kafka-streams          {r['seconds']:8.3f} s  records {r['records']}")
            r = run_json([self.rust, "consume-batch", "--bootstrap", self.b, "--topic", changelog])
            res.setdefault("plain-consumer-batch", []).append(r)
        shutil.rmtree(ks_state, ignore_errors=True)

    def remote(self):
        """Time to running on an instance with an empty state dir, for a
        state of N records: remote stores (MinIO as it is, and with
        --remote-latency-ms added before every request) against kstate's
        full restore into RocksDB and Kafka Streams' restore of the same
        changelog. The remote databases are loaded once (a full restore
        into them, closed cleanly), then opened by new instances."""
        app, store = f"{self.run_id}-m", "kv"
        changelog, inp = f"{app}-{store}-changelog", f"{app}-input"
        n = self.a.records
        env = dict(os.environ, **minio_env())
        url = f"s3://{env['KSTATE_S3_BUCKET']}/{self.run_id}"
        log(f"generating {n} changelog records into {changelog}")
        self.gen(changelog, n)
        self.gen(inp, 0, compact=False)
        common = ["--bootstrap", self.b, "--app", app, "--store", store, "--input", inp]
        load = os.path.join(self.tmp, "remote-load")
        r = run_json([self.rust, "kstate-restore", *common, "--state-dir", load, "--remote-url", url], env=env)
        log(f"remote load (a full restore into the remote databases): {r['seconds']:.2f} s, {r['records']} records")
        self.remote_results.setdefault("load", []).append(r)
        ks_state = os.path.join(self.tmp, "ks-remote")
        contenders = [("kstate-remote", ["--remote-url", url]),
                      (f"kstate-remote-{self.a.remote_latency_ms}ms", ["--remote-url", url, "--remote-latency-ms", str(self.a.remote_latency_ms)]),
                      ("kstate-full-restore", [])]
        for rep in range(self.a.reps):
            for name, extra in contenders:
                d = os.path.join(self.tmp, f"remote-{rep}")
                shutil.rmtree(d, ignore_errors=True)
                r = run_json([self.rust, "kstate-restore", *common, "--state-dir", d, *extra], env=env)
                r["seconds"] = r["seconds_to_running"]
                self.remote_results.setdefault(name, []).append(r)
                log(f"remote {name:<24} {r['seconds']:8.3f} s to running, {r['records']} records replayed, rss {r['peak_rss_bytes'] / 2**20:.0f} MiB")
                shutil.rmtree(d, ignore_errors=True)
            shutil.rmtree(ks_state, ignore_errors=True)
            r = run_json(self.java + ["restore", "--bootstrap", self.b, "--app-id", app, "--store", store, "--input-topic", inp,
                                      "--partitions", str(self.a.partitions), "--state-dir", ks_state])
            self.remote_results.setdefault("kafka-streams", []).append(r)
            log(f"remote kafka-streams            {r['seconds']:8.3f} s, {r['records']} records")
        shutil.rmtree(ks_state, ignore_errors=True)

    def remote_rmw(self):
        """Counting throughput (a get, a little work and a put per record:
        kstate-write --work 1) of remote stores against RocksDB, in two
        phases over one input of about 2N records whose keys repeat (90%
        overwrites, 10% new keys: the cache can hold the state). Phase 1:
        N records from an empty store. Phase 2: the next N records in a new
        process; RocksDB reopens its own disk, the remote contenders start
        on an empty state dir (a move to an empty instance: cold cache).
        Each run reports records/s, records per second over its first 60 s
        (`curve`) and the object-store requests and bytes it made."""
        inp = f"{self.run_id}-rr-input"
        n = self.a.records
        total = n * 2 + n // 10  # phase 1 may take a little more than N
        log(f"generating {total} input records (90% overwrites) into {inp}")
        self.gen(inp, total, compact=False, extra=("--overwrite-fraction", "0.9", "--delete-fraction", "0"))
        env = dict(os.environ, **minio_env())
        lat = self.a.remote_latency_ms
        for rep in range(self.a.reps):
            contenders = [("kstate-rocksdb", []),
                          ("kstate-remote", ["--remote-url", f"s3://{env['KSTATE_S3_BUCKET']}/{self.run_id}-rr{rep}-plain"]),
                          (f"kstate-remote-{lat}ms", ["--remote-url", f"s3://{env['KSTATE_S3_BUCKET']}/{self.run_id}-rr{rep}-slow",
                                                      "--remote-latency-ms", str(lat)])]
            for name, extra in contenders:
                app = f"{self.run_id}-rr{rep}-{name}"
                for phase in (1, 2):
                    # RocksDB keeps its dir; a remote contender's second phase starts on an empty one.
                    d = os.path.join(self.tmp, f"rr{rep}-{name}-{phase if extra else 1}")
                    r = run_json([self.rust, "kstate-write", "--bootstrap", self.b, "--app", app, "--input", inp,
                                  "--records", str(n), "--state-dir", d, "--work", "1", "--curve", *extra], env=env)
                    self.remote_rmw_results.setdefault(f"phase{phase}", {}).setdefault(name, []).append(r)
                    reqs = sum(r.get("remote_requests", {}).values())
                    log(f"remote-rmw phase {phase} {name:<22} {r['records_per_sec']:>10.0f} rec/s, {reqs} requests, "
                        f"first seconds {r.get('curve', [])[:5]}")
                shutil.rmtree(os.path.join(self.tmp, f"rr{rep}-{name}-1"), ignore_errors=True)
                shutil.rmtree(os.path.join(self.tmp, f"rr{rep}-{name}-2"), ignore_errors=True)
                self.delete_topics(app)

    def remote_rmw_report(self, out):
        res = self.remote_rmw_results
        if not res:
            return
        n = self.a.records
        for phase, what in (("phase1", "from an empty store"), ("phase2", "in a new process: RocksDB on its own disk, remote on an empty instance")):
            runs = res.get(phase, {})
            if not runs:
                continue
            base = median_of(runs["kstate-rocksdb"], "records_per_sec")
            print(f"\n## remote-rmw {phase}: counting {n} records {what} ({self.a.partitions} partitions, median of {self.a.reps}; [min-max])")
            print("| contender | records/s | this / kstate-rocksdb | GET per M records | PUT per M records | LIST per M | "
                  "MiB down per M | MiB up per M | cache hit rate | records in seconds 1-5 |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
            for name, rs in runs.items():
                def per_m(f):
                    return sorted(f(r) * 1e6 / r["records"] for r in rs)[len(rs) // 2]
                rate = median_of(rs, "records_per_sec")
                hits = sum(r.get("remote_cache_hits", 0) for r in rs)
                misses = sum(r.get("remote_cache_misses", 0) for r in rs)
                hit_rate = f"{hits / (hits + misses):.3f}" if hits + misses else "-"
                mid = sorted(rs, key=lambda r: r["records_per_sec"])[len(rs) // 2]
                print(f"| {name} | {spread([r['records_per_sec'] for r in rs])} | {rate / base:.2f} | "
                      f"{per_m(lambda r: r.get('remote_requests', {}).get('GET', 0)):.0f} | "
                      f"{per_m(lambda r: r.get('remote_requests', {}).get('PUT', 0)):.0f} | "
                      f"{per_m(lambda r: r.get('remote_requests', {}).get('LIST', 0)):.0f} | "
                      f"{per_m(lambda r: r.get('remote_bytes', {}).get('down', 0)) / 2**20:.1f} | "
                      f"{per_m(lambda r: r.get('remote_bytes', {}).get('up', 0)) / 2**20:.1f} | {hit_rate} | "
                      f"{mid.get('curve', [])[:5]} |")
        out.append({"scenario": "remote-rmw", "records": n, "runs": res})

    def remote_report(self, out):
        res = self.remote_results
        if not res:
            return
        print(f"\n## remote: time to running on an empty instance ({self.a.records} records of state, {self.a.partitions} partitions, "
              f"median of {self.a.reps}; seconds [min-max])")
        print("| contender | records replayed | seconds to running | peak RSS MiB | kafka-streams / this | kstate-full-restore / this |")
        print("|---|---:|---:|---:|---:|---:|")
        secs = {k: median_of(v, "seconds") for k, v in res.items() if k != "load"}
        for name, runs in res.items():
            if name == "load":
                continue
            s = secs[name]
            print(f"| {name} | {int(median_of(runs, 'records'))} | {spread([r['seconds'] for r in runs])} | "
                  f"{median_of(runs, 'peak_rss_bytes') / 2**20:.0f} | {secs['kafka-streams'] / s:.2f} | {secs['kstate-full-restore'] / s:.2f} |")
        out.append({"scenario": "remote", "records": self.a.records, "runs": res,
                    "ratios": {"kafka_streams_over_remote": secs["kafka-streams"] / secs["kstate-remote"],
                               "full_restore_over_remote": secs["kstate-full-restore"] / secs["kstate-remote"]}})

    def snapshot_report(self, out):
        res = self.snapshot_results
        if not res:
            return
        print(f"\n## snapshot-restore ({self.a.records} records + 2%, {self.a.partitions} partitions, median of {self.a.reps}; "
              "seconds [min-max])")
        print("| contender | records replayed | seconds | peak RSS MiB | kstate-full-replay / this | kafka-streams / this |")
        print("|---|---:|---:|---:|---:|---:|")
        secs = {k: median_of(v, "seconds") for k, v in res.items() if not k.startswith("upload")}
        for name in ("kstate-snapshot+tail", "kstate-full-replay", "kafka-streams", "plain-consumer-batch"):
            if name not in res:
                continue
            s = secs[name]
            print(f"| {name} | {int(median_of(res[name], 'records'))} | {spread([r['seconds'] for r in res[name]])} | "
                  f"{median_of(res[name], 'peak_rss_bytes') / 2**20:.0f} | {secs['kstate-full-replay'] / s:.2f} | {secs['kafka-streams'] / s:.2f} |")
        print("\n| snapshot upload | seconds | uploaded | full size | files | upload MB/s |")
        print("|---|---:|---:|---:|---:|---:|")
        for name in ("upload-full", "upload-delta-1pct"):
            for r in res.get(name, []):
                print(f"| {name} | {r['seconds']:.3f} | {r['uploaded_bytes'] / 1e6:.1f} MB | {r['full_bytes'] / 1e6:.1f} MB | {r['files']} | "
                      f"{r['upload_bytes_per_sec'] / 1e6:.1f} |")
        out.append({"scenario": "snapshot", "records": self.a.records, "runs": res,
                    "ratios": {"full_replay_over_snapshot": secs["kstate-full-replay"] / secs["kstate-snapshot+tail"],
                               "kafka_streams_over_snapshot": secs["kafka-streams"] / secs["kstate-snapshot+tail"]}})

    def window(self):
        inp = f"{self.run_id}-win-input"
        n = self.a.records
        keys = min(100_000, n)
        log(f"generating {n} input records over about {keys} keys into {inp}")
        self.gen(inp, n, compact=False, extra=("--overwrite-fraction", f"{1 - keys / n:.4f}", "--delete-fraction", "0"))
        # Recent event times: Kafka Streams' changelog records carry them,
        # and the broker deletes records older than the changelog's
        # retention (retention + 1 day) at once.
        span_ms = 5 * n // self.a.partitions
        base = ["--event-base-ms", str((now_ms() - span_ms - 3_600_000) // 60_000 * 60_000)]
        for rep in range(self.a.reps):
            ka, ks = f"{self.run_id}-wink{rep}", f"{self.run_id}-wins{rep}"
            kdir, sdir = os.path.join(self.tmp, f"kw{rep}"), os.path.join(self.tmp, f"sw{rep}")
            self.record("window", "kstate", run_json(
                [self.rust, "kstate-window", "--bootstrap", self.b, "--app", ka, "--input", inp,
                 "--records", str(n), "--state-dir", kdir, *base]))
            shutil.rmtree(kdir, ignore_errors=True)
            self.record("window-restore", "kstate", run_json(
                [self.rust, "kstate-window-restore", "--bootstrap", self.b, "--app", ka, "--input", inp, "--state-dir", kdir, *base]))
            common = ["--bootstrap", self.b, "--app-id", ks, "--store", "w", "--input-topic", inp,
                      "--partitions", str(self.a.partitions), "--state-dir", sdir, *base]
            self.record("window", "kafka-streams", run_json(self.java + ["window", *common, "--records", str(n)]))
            shutil.rmtree(sdir, ignore_errors=True)
            self.record("window-restore", "kafka-streams", run_json(self.java + ["window-restore", *common]))
            for d in (kdir, sdir):
                shutil.rmtree(d, ignore_errors=True)
            self.delete_topics(ka)
            self.delete_topics(ks)

    def repartition(self):
        """A count re-keyed through a repartition topic (issue 42): kstate's
        `ctx.repartition` against Kafka Streams' `groupBy(..).count()`, the
        new key the value's first two bytes, timed from the first count
        update to the N-th. No tombstones in the input (neither counts them)."""
        inp = f"{self.run_id}-rp-input"
        n = self.a.records
        log(f"generating {n} input records into {inp}")
        self.gen(inp, n, compact=False, extra=("--delete-fraction", "0"))
        for rep in range(self.a.reps):
            ka, ks = f"{self.run_id}-rpk{rep}", f"{self.run_id}-rps{rep}"
            kdir, sdir = os.path.join(self.tmp, f"krp{rep}"), os.path.join(self.tmp, f"srp{rep}")
            self.record("repartition", "kstate", run_json(
                [self.rust, "kstate-repartition", "--bootstrap", self.b, "--app", ka, "--input", inp,
                 "--records", str(n), "--state-dir", kdir]))
            self.record("repartition", "kafka-streams", run_json(self.java + [
                "repartition", "--bootstrap", self.b, "--app-id", ks, "--store", "counts", "--input-topic", inp,
                "--partitions", str(self.a.partitions), "--state-dir", sdir, "--records", str(n)]))
            # The same count with plain clients and a hash map: which part of the rate is kstate's.
            through = self.fresh_topic(f"{self.run_id}-rp-through{rep}")
            self.record("repartition", "plain-clients", run_json(
                [self.rust, "plain-repartition", "--bootstrap", self.b, "--input", inp, "--through", through,
                 "--records", str(n)]))
            self.delete_topics(through)
            for d in (kdir, sdir):
                shutil.rmtree(d, ignore_errors=True)
            self.delete_topics(ka)
            self.delete_topics(ks)

    def memory(self):
        """In-memory stores against RocksDB (issue 43), the same workloads:
        `rmw` (a get, a little CPU work and a put per record: kstate-write
        --work 1), `write` (a put per record, as Kafka Streams' contender),
        a full `restore` of the changelog, and `restart`: the same state
        restored again after a clean stop (kstate: its file or RocksDB plus
        nothing to replay; Kafka Streams' in-memory store replays its whole
        changelog on every start, its RocksDB store nothing)."""
        inp = f"{self.run_id}-m-input"
        n = self.a.records
        log(f"generating {n} input records into {inp}")
        self.gen(inp, n, compact=False)
        for rep in range(self.a.reps):
            for backend, flag in (("rocksdb", []), ("in-memory", ["--in-memory"])):
                app = f"{self.run_id}-mk{rep}-{backend}"
                kdir = os.path.join(self.tmp, f"mk{rep}-{backend}")
                r = run_json([self.rust, "kstate-write", "--bootstrap", self.b, "--app", app, "--input", inp,
                              "--records", str(n), "--state-dir", kdir, "--work", "1", *flag])
                r["disk_bytes"] = dir_bytes(kdir)  # RocksDB's files, or the in-memory stores' files
                self.record("rmw", f"kstate-{backend}", r)
                # The same app again: its stores hold the state of n records.
                shutil.rmtree(kdir, ignore_errors=True)
                self.record("restore", f"kstate-{backend}", run_json(
                    [self.rust, "kstate-restore", "--bootstrap", self.b, "--app", app, "--store", "kv", "--input", inp,
                     "--state-dir", kdir, *flag]))
                r = run_json([self.rust, "kstate-restore", "--bootstrap", self.b, "--app", app, "--store", "kv", "--input", inp,
                              "--state-dir", kdir, *flag])
                r["seconds"] = r["seconds_to_running"]
                self.record("restart", f"kstate-{backend}", r)
                shutil.rmtree(kdir, ignore_errors=True)
                self.delete_topics(app)
                ks = f"{self.run_id}-ms{rep}-{backend}"
                sdir = os.path.join(self.tmp, f"ms{rep}-{backend}")
                common = ["--bootstrap", self.b, "--app-id", ks, "--store", "kv", "--input-topic", inp,
                          "--partitions", str(self.a.partitions), "--state-dir", sdir, *flag]
                r = run_json(self.java + ["write", *common, "--records", str(n)])
                r["disk_bytes"] = dir_bytes(sdir)
                self.record("write", f"kafka-streams-{backend}", r)
                shutil.rmtree(sdir, ignore_errors=True)
                self.record("restore", f"kafka-streams-{backend}", run_json(self.java + ["restore", *common]))
                r = run_json(self.java + ["tail-restore", *common])
                self.record("restart", f"kafka-streams-{backend}", r)
                shutil.rmtree(sdir, ignore_errors=True)
                self.delete_topics(ks)

    def join(self):
        """A stream-table left join (issue 42): kstate's source table and a
        lookup per stream record against Kafka Streams'
        `stream.leftJoin(builder.table(..))`. The table (a tenth of the
        stream's records, compacted) and the stream come from the same
        generator seed, so stream keys find table rows; both topics are
        filled before the start, the table first."""
        table, inp = f"{self.run_id}-j-table", f"{self.run_id}-j-stream"
        n = self.a.records
        log(f"generating {n // 10} table records into {table} and {n} stream records into {inp}")
        self.gen(table, max(1, n // 10), compact=True, extra=("--delete-fraction", "0"))
        self.gen(inp, n, compact=False, extra=("--delete-fraction", "0"))
        for rep in range(self.a.reps):
            ka, ks = f"{self.run_id}-jk{rep}", f"{self.run_id}-js{rep}"
            kdir, sdir = os.path.join(self.tmp, f"kj{rep}"), os.path.join(self.tmp, f"sj{rep}")
            self.record("join", "kstate", run_json(
                [self.rust, "kstate-join", "--bootstrap", self.b, "--app", ka, "--input", inp, "--table", table,
                 "--records", str(n), "--state-dir", kdir]))
            self.record("join", "kafka-streams", run_json(self.java + [
                "join", "--bootstrap", self.b, "--app-id", ks, "--store", "table", "--input-topic", inp,
                "--table-topic", table, "--partitions", str(self.a.partitions), "--state-dir", sdir, "--records", str(n)]))
            # Reading the stream alone with a plain consumer: the floor of any join here.
            self.record("join", "plain-consumer", run_json([self.rust, "consume", "--bootstrap", self.b, "--topic", inp]))
            for d in (kdir, sdir):
                shutil.rmtree(d, ignore_errors=True)
            self.delete_topics(ka)
            self.delete_topics(ks)

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

    # ---- write with output: at-least-once vs exactly-once ----------------

    # (contender, exactly-once?): kstate-write --output, or the Kafka Streams `write` --output-topic.
    WRITE_EOS_CONTENDERS = [("kstate-alo-out", False), ("kstate-eos-out", True),
                            ("kafka-streams-alo-out", False), ("kafka-streams-eos-out", True)]

    def write_eos(self):
        """The write scenario with one output record per input record, each
        contender at-least-once and exactly-once. Timed as write (first to
        N-th processed record); the output topic is then counted as a
        read_committed consumer sees it (`output_records`, which must be N:
        no crash happens, so at-least-once must not duplicate either)."""
        inp = f"{self.run_id}-we-input"
        n = self.a.records
        log(f"generating {n} input records into {inp}")
        self.gen(inp, n, compact=False)
        for rep in range(self.a.reps):
            for name, eos in self.WRITE_EOS_CONTENDERS:
                if self.a.block_every and not name.startswith("kstate"):
                    continue  # the Kafka Streams contender has no such wait
                # The app's changelog and the output share the prefix `app-`, deleted once measured (see write).
                app = f"{self.run_id}-we{rep}-{name[:-len('-out')]}"
                out = self.fresh_topic(f"{app}-out")
                state = os.path.join(self.tmp, f"we{rep}-{name}")
                if name.startswith("kstate"):
                    cmd = [self.rust, "kstate-write", "--bootstrap", self.b, "--app", app, "--input", inp,
                           "--records", str(n), "--state-dir", state, "--output", out,
                           "--guarantee", "exactly_once" if eos else "at_least_once"]
                    if self.a.block_every:
                        cmd += ["--block-every", str(self.a.block_every)]
                else:
                    cmd = self.java + ["write", "--bootstrap", self.b, "--app-id", app, "--store", "kv", "--input-topic", inp,
                                       "--partitions", str(self.a.partitions), "--state-dir", state,
                                       "--records", str(n), "--output-topic", out] + (["--eos"] if eos else [])
                r = run_json(cmd)
                counted = run_json([self.rust, "count", "--bootstrap", self.b, "--topic", out, "--read-committed"])
                r["output_records"] = counted["records"]
                r["output_offset_span"] = counted["offset_span"]
                if counted["records"] != n:
                    log(f"WARNING: write-eos {name} rep {rep}: output topic {out} holds {counted['records']} "
                        f"records read_committed, expected {n}")
                # Every committed transaction leaves a marker in each partition it wrote: none at all
                # means the output was not written in transactions.
                if eos and counted["offset_span"] <= counted["records"]:
                    log(f"WARNING: write-eos {name} rep {rep}: no transaction markers in {out} "
                        f"(offset span {counted['offset_span']} = records): not written transactionally")
                self.record("write-eos", name, r)
                self.delete_topics(f"{app}-")
                shutil.rmtree(state, ignore_errors=True)

    def write_eos_ratios(self, contenders, out):
        """Prints and records issue 27's targets: kstate-eos-out at least 3x
        kafka-streams-eos-out, and at least 0.95 of kstate-alo-out (records/s,
        medians; and per repetition against the same repetition's at-least-once)."""
        rps = {name: median_of(results, "records_per_sec") for name, results in contenders.items()}
        ratios = {}
        for other, target in (("kafka-streams-eos-out", 3.0), ("kstate-alo-out", 0.95)):
            if rps.get("kstate-eos-out") and rps.get(other):
                ratios[other] = rps["kstate-eos-out"] / rps[other]
                print(f"kstate-eos-out / {other} (records/s, medians): {ratios[other]:.2f} (target >= {target})")
        eos, alo = contenders.get("kstate-eos-out", []), contenders.get("kstate-alo-out", [])
        if eos and alo:
            per_rep = [e["records_per_sec"] / a["records_per_sec"] for e, a in zip(eos, alo)]
            print("kstate-eos-out / kstate-alo-out per repetition: " + ", ".join(f"{r:.2f}" for r in per_rep))
        for o in out:
            if o["scenario"] == "write-eos" and o["contender"] == "kstate-eos-out":
                o["ratios"] = ratios

    # ---- the Processor trait vs the closure ------------------------------

    def processor(self):
        """kstate-write with an output per record, as a closure and as a
        Processor per task, alternating within each rep (order swapped every
        other rep); prints each rep's trait / closure ratio."""
        inp = f"{self.run_id}-pr-input"
        n = self.a.records
        log(f"generating {n} input records into {inp}")
        self.gen(inp, n, compact=False)
        for rep in range(self.a.reps):
            order = ["closure", "trait"] if rep % 2 == 0 else ["trait", "closure"]
            rps = {}
            for variant in order:
                app = f"{self.run_id}-pr{rep}-{variant}"
                out = self.fresh_topic(f"{app}-out")
                state = os.path.join(self.tmp, f"pr{rep}-{variant}")
                r = run_json([self.rust, "kstate-write", "--bootstrap", self.b, "--app", app, "--input", inp,
                              "--records", str(n), "--state-dir", state, "--output", out, "--processor", variant]
                             + (["--max-state-memory-mib", str(self.a.max_state_memory_mib)] if self.a.max_state_memory_mib else []))
                rps[variant] = r["records_per_sec"]
                self.record("processor", variant, r)
                self.delete_topics(f"{app}-")
                shutil.rmtree(state, ignore_errors=True)
            print(f"processor rep {rep}: trait / closure = {rps['trait'] / rps['closure']:.3f} "
                  f"({rps['trait']:,.0f} vs {rps['closure']:,.0f} records/s)")

    # ---- processing threads ----------------------------------------------

    THREAD_COUNTS = [1, 2, 4]

    def threads(self):
        """kstate-write as a Processor per task with CPU work per record (a
        read-modify-write mixing the value --work times), on 8 input
        partitions, with 1, 2 and 4 processing threads in turn within each
        rep (the order rotated every rep); prints each rep's ratios to one
        thread. The machine's cores are printed: the broker runs on them too."""
        inp = f"{self.run_id}-th-input"
        n = self.a.records
        log(f"generating {n} input records into {inp} (8 partitions); {os.cpu_count()} cores")
        self.gen(inp, n, compact=False, partitions=8)
        for rep in range(self.a.reps):
            counts = self.THREAD_COUNTS[rep % 3:] + self.THREAD_COUNTS[:rep % 3]
            rps = {}
            for t in counts:
                app = f"{self.run_id}-th{rep}-{t}"
                state = os.path.join(self.tmp, f"th{rep}-{t}")
                r = run_json([self.rust, "kstate-write", "--bootstrap", self.b, "--app", app, "--input", inp,
                              "--records", str(n), "--state-dir", state, "--processor", "trait",
                              "--threads", str(t), "--work", str(self.a.work)])
                rps[t] = r["records_per_sec"]
                self.record("threads", f"kstate-{t}-threads", r)
                self.delete_topics(f"{app}-")
                shutil.rmtree(state, ignore_errors=True)
            print(f"threads rep {rep}: 2 / 1 = {rps[2] / rps[1]:.3f}, 4 / 1 = {rps[4] / rps[1]:.3f} "
                  f"({rps[1]:,.0f} / {rps[2]:,.0f} / {rps[4]:,.0f} records/s)")

    # ---- failover --------------------------------------------------------

    # kstate-1-peers: one standby and failure detection among the
    # instances (`peer_address`): a killed instance is dropped at once.
    FAILOVER_CONTENDERS = [("kstate-0", "kstate", 0), ("kstate-1", "kstate", 1), ("kstate-1-peers", "kstate-peers", 1),
                           ("kstreams-0", "kstreams", 0), ("kstreams-1", "kstreams", 1)]

    def failover(self):
        """Three instances, a state of N records over 6 partitions, a steady
        input load; SIGKILL the instance owning the most partitions; per
        moved partition: (a) kill -> first record processed by its new owner,
        (b) the new owner's restore start (its assignment) -> that record;
        also (b') the new owner's receipt of the group's assignment (SyncGroup
        response, from its log) -> that record."""
        sizes = self.a.failover_sizes
        for size in sizes:
            for rep in range(self.a.reps):
                for name, kind, standbys in self.FAILOVER_CONTENDERS:
                    if self.a.failover_contenders and name not in self.a.failover_contenders:
                        continue
                    try:
                        r = self.failover_run(name, kind, standbys, size, rep)
                    except RuntimeError as e:  # a bounded wait ran out, or an instance died
                        log(f"failover {size} {name} rep {rep} FAILED: {e}")
                        self.failover_results.setdefault((size, name), []).append(
                            {"contender": name, "records": size, "rep": rep, "error": str(e)})
                        continue
                    self.failover_results.setdefault((size, name), []).append(r)
                    log(f"failover {size:>9} {name:<11} rep {rep}: moved {[m['partition'] for m in r['moved']]}, "
                        f"(a) kill->first record {spread([m['kill_to_first_record_s'] for m in r['moved']])} s, "
                        f"(b) assignment->first record {spread([m['assignment_to_first_record_s'] for m in r['moved']])} s, "
                        f"replayed {[m['restored_records'] for m in r['moved']]}")

    def failover_instance_cmd(self, kind, app, inp, state, standbys):
        session, hb = str(self.a.session_timeout_ms), str(self.a.heartbeat_ms)
        if kind.startswith("kstate"):
            peers = ["--peer-address", "127.0.0.1:0"] if kind == "kstate-peers" else []
            return [self.failover_bin, "instance", "--bootstrap", self.b, "--app", app, "--input", inp,
                    "--state-dir", state, "--standbys", str(standbys), "--session-timeout-ms", session,
                    "--heartbeat-ms", hb] + peers
        # The consumer coordinator's INFO lines carry the moment each assignment arrived.
        return self.java[:1] + ["-Dorg.slf4j.simpleLogger.log.org.apache.kafka.clients.consumer.internals."
                                "ConsumerCoordinator=info"] + self.java[1:] + ["failover", "--bootstrap", self.b, "--app-id", app, "--input-topic", inp,
                            "--state-dir", state, "--standbys", str(standbys), "--session-timeout-ms", session,
                            "--heartbeat-ms", hb]

    def failover_run(self, name, kind, standbys, size, rep):
        app = f"{self.run_id}-f{size}-{name}-{rep}"
        inp = f"{app}-input"
        parts = FAILOVER_PARTITIONS
        logdir = os.path.join(ROOT, "target/bench/failover-logs")
        os.makedirs(logdir, exist_ok=True)
        # Empty input first: the three instances join while there is no state,
        # so both assignors spread the tasks evenly (Kafka Streams' would
        # otherwise keep tasks on the first instance and warm the others up,
        # rebalancing only every probing.rebalance.interval.ms, 10 min).
        self.gen(inp, 0, compact=False, partitions=parts)
        settle()
        procs = []
        try:
            load = Instance(f"{app}-load", [self.failover_bin, "load", "--bootstrap", self.b, "--topic", inp,
                                            "--partitions", str(parts), "--rate", str(self.a.load_rate)],
                            os.path.join(logdir, f"{app}-load.log"))
            procs.append(load)
            insts = []
            for i in range(3):
                state = os.path.join(self.tmp, f"{app}-{i}")
                insts.append(Instance(f"{name}#{i}", self.failover_instance_cmd(kind, app, inp, state, standbys),
                                      os.path.join(logdir, f"{app}-{i}.log")))
            procs.extend(insts)

            def statuses():
                return [i.status() for i in insts]

            def balanced():
                st = statuses()
                if any(s is None for s in st):
                    return False
                actives = [set(a) for a, _ in st]
                return (all(len(a) == parts // 3 for a in actives) and set().union(*actives) == set(range(parts))
                        and sum(len(sb) for _, sb in st) == parts * standbys)
            wait_for(f"{name}: three instances with {parts // 3} active tasks each", 180, balanced, insts + [load])
            log(f"failover {name}: balanced {[(sorted(a), sorted(sb)) for a, sb in statuses()]}; "
                f"producing {size} records of state")
            # The state: N records with distinct keys, one store record each.
            self.gen(inp, size, compact=False, append=True, partitions=parts,
                     extra=["--overwrite-fraction", "0", "--delete-fraction", "0"])

            def ready():
                st = statuses()
                if any(s is None for s in st):
                    return False
                ages = {p: age for a, _ in st for p, age in a.items()}
                lags = [lag for _, sb in st for lag in sb.values()]
                return (set(ages) == set(range(parts)) and max(ages.values()) < 2000
                        and len(lags) == parts * standbys and all(0 <= lag < 2000 for lag in lags)
                        and all(len(a) == parts // 3 for a, _ in st))
            t0 = time.time()
            wait_for(f"{name}: input processed and standbys caught up", 120 + size / 10_000, ready, insts + [load])
            log(f"failover {name}: caught up {time.time() - t0:.1f} s after the state was produced")
            time.sleep(self.a.steady_seconds)
            wait_for(f"{name}: still caught up", 30, ready, insts + [load])
            st = statuses()
            victim_i = max(range(3), key=lambda i: (len(st[i][0]), i))
            victim = insts[victim_i]
            moved = sorted(st[victim_i][0])
            survivors = [i for i in insts if i is not victim]
            log(f"failover {name}: SIGKILL {victim.name} (active {moved}, standby {sorted(st[victim_i][1])}); "
                f"others {[(sorted(a), sorted(sb)) for j, (a, sb) in enumerate(st) if j != victim_i]}")
            kill_ms = now_ms()
            victim.proc.send_signal(signal.SIGKILL)

            def first_records():
                found = {}
                for p in moved:
                    for s in survivors:
                        evs = s.find("ASSIGNED_FIRST_RECORD", p, kill_ms)
                        if evs:
                            found[p] = (s, evs[0])
                return found if len(found) == len(moved) else None
            firsts = wait_for(f"{name}: moved partitions processed by their new owners",
                              self.a.session_timeout_ms / 1000 + 120 + size / 20_000, first_records, survivors + [load])
            out = []
            for p in moved:
                owner, first = firsts[p]
                first_ts = int(first["ts"])
                starts = [e for e in owner.find("RESTORE_START", p, kill_ms) if int(e["ts"]) <= first_ts]
                ends = [e for e in owner.find("RESTORE_END", p, kill_ms) if int(e["ts"]) <= first_ts]
                start = starts[-1] if starts else None
                end = ends[-1] if ends else None
                synced = [t for t in owner.assignments_received() if kill_ms <= t <= first_ts]
                out.append({
                    "partition": p, "new_owner": owner.name,
                    "kill_to_first_record_s": (first_ts - kill_ms) / 1000,
                    "assignment_to_first_record_s": (first_ts - int(start["ts"])) / 1000 if start else None,
                    "kill_to_assignment_s": (int(start["ts"]) - kill_ms) / 1000 if start else None,
                    # The last assignment the new owner received before that record (from its log).
                    "assignment_received_to_first_record_s": (first_ts - synced[-1]) / 1000 if synced else None,
                    "restore_seconds": (int(end["ts"]) - int(start["ts"])) / 1000 if start and end else None,
                    "restored_records": int(end["records"]) if end else None,
                    "restore_offsets": [int(start["start"]), int(start["end"])] if start else None,
                })
            return {"contender": name, "records": size, "standbys": standbys, "rep": rep, "victim": victim.name,
                    "moved": out}
        finally:
            for pr in procs:
                pr.stop(timeout=30)
            self.delete_topics(app)
            for i in range(3):
                shutil.rmtree(os.path.join(self.tmp, f"{app}-{i}"), ignore_errors=True)

    def failover_report(self, out):
        if not self.failover_results:
            return
        a = self.a
        for size in a.failover_sizes:
            rows = [(name, self.failover_results.get((size, name))) for name, _, _ in self.FAILOVER_CONTENDERS]
            kill_medians = {n: statistics.median([m["kill_to_first_record_s"] for r in rs if "moved" in r for m in r["moved"]])
                            for n, rs in rows if rs and any("moved" in r for r in rs)}
            rows = [(n, rs) for n, rs in rows if rs]
            if not rows:
                continue
            print(f"\n## failover ({size} records of state, {FAILOVER_PARTITIONS} partitions, 3 instances, "
                  f"{a.reps} reps, session.timeout.ms={a.session_timeout_ms}, heartbeat {a.heartbeat_ms} ms, "
                  f"load {a.load_rate} records/s)")
            print("median [min-max] over all moved partitions of all reps, seconds; per-rep medians in brackets")
            print("(b) = from the new owner's restore start (its assignment, as both start restoring right after it); "
                  "(b') = from the new owner's receipt of the SyncGroup assignment (its log)")
            print("| contender | moved partitions | (a) kill -> first record | (b) assignment -> first record "
                  "| (b) per rep | (b') assignment received -> first record | kill -> assignment | records replayed per partition |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|")
            for name, all_runs in rows:
                runs = [r for r in all_runs if "moved" in r]
                if len(runs) < len(all_runs):
                    print(f"| {name} | {len(all_runs) - len(runs)} of {len(all_runs)} reps failed (see the log) "
                          "| | | | | | |")
                if not runs:
                    continue
                moved = [m for r in runs for m in r["moved"]]
                col = lambda k: [m[k] for m in moved if m[k] is not None]
                per_rep = [statistics.median([m["assignment_to_first_record_s"] for m in r["moved"]
                                              if m["assignment_to_first_record_s"] is not None] or [float("nan")])
                           for r in runs]
                replayed = col("restored_records")
                print(f"| {name} | {len(moved)} | {spread(col('kill_to_first_record_s'))} | "
                      f"{spread(col('assignment_to_first_record_s'))} | {', '.join(f'{v:.3f}' for v in per_rep)} | "
                      f"{spread(col('assignment_received_to_first_record_s'))} | {spread(col('kill_to_assignment_s'))} | "
                      f"{int(statistics.median(replayed)) if replayed else '-'} |")
                out.append({"scenario": "failover", "contender": name, "records": size,
                            "partitions": FAILOVER_PARTITIONS, "session_timeout_ms": a.session_timeout_ms,
                            "heartbeat_interval_ms": a.heartbeat_ms, "load_records_per_sec": a.load_rate,
                            "kill_to_first_record_s": statistics.median(col("kill_to_first_record_s")) if moved else None,
                            "assignment_to_first_record_s": (statistics.median(col("assignment_to_first_record_s"))
                                                             if col("assignment_to_first_record_s") else None),
                            "assignment_to_first_record_s_per_rep": per_rep,
                            "assignment_received_to_first_record_s": (
                                statistics.median(col("assignment_received_to_first_record_s"))
                                if col("assignment_received_to_first_record_s") else None),
                            "restored_records_median": statistics.median(replayed) if replayed else None,
                            "runs": all_runs})
            # The ratios the failure-detection goal is stated in (same run).
            for ours, theirs in (("kstate-1-peers", "kstreams-1"), ("kstate-1-peers", "kstate-1")):
                if ours in kill_medians and theirs in kill_medians and kill_medians[theirs] > 0:
                    print(f"(a) kill -> first record, {ours} / {theirs}: "
                          f"{kill_medians[ours]:.3f} s / {kill_medians[theirs]:.3f} s = {kill_medians[ours] / kill_medians[theirs]:.3f}")

    # ---- scale-out -------------------------------------------------------

    SCALEOUT_CONTENDERS = ["kstate", "kstreams"]

    def scaleout(self):
        """One instance holds all 6 tasks of a state of N records under a
        steady load; two more instances start at once. Measures (a) the
        longest pause in the processing of any partition from their start
        until the group is balanced and stays so, and (b) the time until
        every instance processes exactly 2 partitions; also the group's
        rebalances, probing rounds and restores of moved partitions. Both
        contenders run with the same acceptable recovery lag, max warmup
        replicas and probing interval (KIP-441), no standby replicas."""
        for rep in range(self.a.reps):
            for kind in self.SCALEOUT_CONTENDERS:
                if kind not in self.a.scaleout_contenders:
                    continue
                try:
                    r = self.scaleout_run(kind, rep)
                except RuntimeError as e:  # a bounded wait ran out, or an instance died
                    log(f"scaleout {kind} rep {rep} FAILED: {e}")
                    self.scaleout_results.setdefault(kind, []).append(
                        {"contender": kind, "records": self.a.scaleout_records, "rep": rep, "error": str(e)})
                    continue
                self.scaleout_results.setdefault(kind, []).append(r)
                p = r["longest_pause"]
                log(f"scaleout {kind} rep {rep}: longest pause {r['longest_pause_s']:.3f} s (partition {p['partition']}, "
                    f"{p['before']} -> {p['after']}), balanced after {r['time_to_balanced_s']:.3f} s, "
                    f"{r['rebalances']} rebalances at {r['rebalance_times_s']} s, probing {r['probing']}, "
                    f"restores of moved partitions {[(m['partition'], m['restored_records']) for m in r['moved']]}")

    def scaleout_instance_cmd(self, kind, app, inp, state):
        a = self.a
        cmd = self.failover_instance_cmd(kind, app, inp, state, 0) + [
            "--acceptable-lag", str(a.scaleout_acceptable_lag), "--max-warmups", str(a.scaleout_max_warmups),
            "--probing-ms", str(a.scaleout_probing_ms)]
        if kind == "kstreams":
            # The assignor's stable/unstable verdicts and the probing rebalances it schedules.
            cmd[1:1] = ["-Dorg.slf4j.simpleLogger.log.org.apache.kafka.streams.processor.internals."
                        "StreamsPartitionAssignor=info",
                        "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.streams.processor.internals.StreamThread=info"]
        return cmd

    def scaleout_run(self, kind, rep):
        a = self.a
        size = a.scaleout_records
        app = f"{self.run_id}-s{size}-{kind}-{rep}"
        inp = f"{app}-input"
        parts = FAILOVER_PARTITIONS
        per = parts // 3
        logdir = os.path.join(ROOT, "target/bench/scaleout-logs")
        os.makedirs(logdir, exist_ok=True)
        # Empty input first, as in failover: the first instance owns every task
        # before the state exists, then processes it all (and writes the changelog).
        self.gen(inp, 0, compact=False, partitions=parts)
        settle()
        procs, insts = [], []

        def start(i):
            inst = Instance(f"{kind}#{i}", self.scaleout_instance_cmd(kind, app, inp, os.path.join(self.tmp, f"{app}-{i}")),
                            os.path.join(logdir, f"{app}-{i}.log"))
            insts.append(inst)
            procs.append(inst)

        try:
            load_ms = now_ms()
            load = Instance(f"{app}-load", [self.failover_bin, "load", "--bootstrap", self.b, "--topic", inp,
                                            "--partitions", str(parts), "--rate", str(a.load_rate)],
                            os.path.join(logdir, f"{app}-load.log"))
            procs.append(load)
            start(0)
            first = insts[0]

            def owns_all():
                st = first.status()
                return st is not None and set(st[0]) == set(range(parts))
            wait_for(f"scaleout {kind}: the first instance processing all {parts} partitions", 180, owns_all, procs)
            log(f"scaleout {kind}: one instance owns all {parts} partitions; producing {size} records of state")
            self.gen(inp, size, compact=False, append=True, partitions=parts,
                     extra=["--overwrite-fraction", "0", "--delete-fraction", "0"])

            def ready():
                # Every partition's last record is fresh, and the instance has
                # processed the state and (but for the last 3 s) the load so far.
                st = first.status()
                processed = sum(int(e["records"]) for e in first.events_of("PROGRESS"))
                return (st is not None and set(st[0]) == set(range(parts)) and max(st[0].values()) < 2000
                        and processed >= size + a.load_rate * (now_ms() - load_ms - 3000) / 1000)
            t0 = time.time()
            wait_for(f"scaleout {kind}: the state processed by the first instance", 120 + size / 10_000, ready, procs)
            log(f"scaleout {kind}: caught up {time.time() - t0:.1f} s after the state was produced")
            time.sleep(a.steady_seconds)
            wait_for(f"scaleout {kind}: still caught up", 30, ready, procs)

            start_ms = now_ms()
            start(1)
            start(2)
            log(f"scaleout {kind}: started two more instances; waiting until each processes {per} partitions "
                f"for {a.scaleout_settle_seconds:.0f} s (at most {a.scaleout_timeout:.0f} s)")
            deadline = time.time() + a.scaleout_timeout
            balanced_since, warmups_max, shown = None, 0, None
            while True:
                for pr in procs:
                    pr.check()
                st = [i.status() for i in insts]
                if all(s is not None for s in st):
                    # Standby tasks are warmups here (no standby replicas); kstate's
                    # lag gauge still lists one for up to 3 s after its promotion.
                    warmups_max = max(warmups_max, sum(len(set(sb) - set(act)) for act, sb in st))
                    view = [(sorted(act), sorted(sb)) for act, sb in st]
                    if view != shown:
                        log(f"scaleout {kind} +{(now_ms() - start_ms) / 1000:6.1f} s: active, standby/warmup per instance {view}")
                        shown = view
                fresh = all(s is not None for s in st) and all(
                    int(i.last_status()["ts"]) >= start_ms + 2000 for i in insts)
                balanced = fresh and all(len(act) == per for act, _ in st) and \
                    set().union(*(set(act) for act, _ in st)) == set(range(parts))
                if balanced:
                    balanced_since = balanced_since or now_ms()
                    if now_ms() - balanced_since >= a.scaleout_settle_seconds * 1000:
                        break
                else:
                    balanced_since = None
                if time.time() > deadline:
                    raise RuntimeError(
                        f"scaleout {kind}: not balanced {a.scaleout_timeout:.0f} s after the two instances started; "
                        f"last (active, standby) per instance: {[(s and (sorted(s[0]), sorted(s[1]))) for s in st]}")
                time.sleep(0.5)
            end_ms = now_ms()
            owners = {p: i for i in insts for p in i.status()[0]}
            time.sleep(2.5)  # the last PROGRESS windows (printed once a second)
            for i, inst in zip(range(3), insts):  # for a look afterwards
                with open(os.path.join(logdir, f"{app}-{i}.events.json"), "w") as f:
                    json.dump({"start_ms": start_ms, "end_ms": end_ms, "events": inst.events_of("PROGRESS") + [
                        e for e in inst.events if e["kind"] != "PROGRESS"]}, f)
            return self.scaleout_measure(kind, rep, size, insts, owners, start_ms, end_ms, balanced_since, warmups_max)
        finally:
            for pr in procs:
                pr.stop(timeout=30)
            self.delete_topics(app)
            for i in range(3):
                shutil.rmtree(os.path.join(self.tmp, f"{app}-{i}"), ignore_errors=True)

    def scaleout_measure(self, kind, rep, size, insts, owners, start_ms, end_ms, balanced_seen_ms, warmups_max):
        a = self.a
        parts = FAILOVER_PARTITIONS
        # Every partition's processing, as windows (first, last, largest inner gap, instance).
        windows = {p: [] for p in range(parts)}
        for i in insts:
            for e in i.events_of("PROGRESS"):
                w = (int(e["first"]), int(e["last"]), int(e["maxgap"]), i.name)
                if w[1] >= start_ms - 10_000 and w[0] <= end_ms:
                    windows[int(e["partition"])].append(w)
        pauses = {}
        for p in range(parts):
            # The largest hole in the union of the processing times of p over
            # all instances that ends after start_ms (the new instances' start),
            # up to end_ms (balanced for scaleout_settle_seconds).
            best = {"partition": p, "ms": 0, "from": None, "to": None, "before": None, "after": None}
            covered, by = None, None
            for first, last, maxgap, who in sorted(windows[p]):
                if covered is not None and first > covered and first > start_ms and first - covered > best["ms"]:
                    best = {"partition": p, "ms": first - covered, "from": covered, "to": first, "before": by, "after": who}
                if maxgap > best["ms"] and last > start_ms:  # inside one window of one instance
                    best = {"partition": p, "ms": maxgap, "from": None, "to": None, "before": who, "after": who,
                            "within": [first, last]}
                if covered is None or last > covered:
                    covered, by = last, who
            if covered is None or covered < end_ms:
                since = covered if covered is not None else start_ms
                if end_ms - since > best["ms"]:
                    best = {"partition": p, "ms": end_ms - since, "from": since, "to": None, "before": by, "after": None}
            pauses[p] = best
        longest = max(pauses.values(), key=lambda b: b["ms"])
        # When each partition reached its final owner: its first record there
        # after the last record any other instance processed after start_ms.
        arrivals, moved = {}, []
        for p in range(parts):
            owner = owners[p]
            others = [w[1] for w in windows[p] if w[3] != owner.name and w[1] >= start_ms]
            if not others:
                arrivals[p] = start_ms
                continue
            others_last = max(others)
            own = [max(w[0], others_last) for w in windows[p] if w[3] == owner.name and w[1] > others_last]
            arrivals[p] = min(own) if own else end_ms
        # Restores after start_ms, START and END paired per instance and partition.
        restores = []
        for i in insts:
            open_ = {}
            for e in sorted(i.events_of("RESTORE_START") + i.events_of("RESTORE_END"),
                            key=lambda e: (int(e["ts"]), e["kind"] == "RESTORE_END")):
                p, ts = int(e["partition"]), int(e["ts"])
                if ts < start_ms:
                    continue
                if e["kind"] == "RESTORE_START":
                    open_[p] = e
                    restores.append({"instance": i.name, "partition": p, "start_s": (ts - start_ms) / 1000,
                                     "offsets": [int(e["start"]), int(e["end"])], "records": None, "seconds": None})
                elif p in open_:
                    s = open_.pop(p)
                    r = next(r for r in reversed(restores) if r["instance"] == i.name and r["partition"] == p)
                    r["records"] = int(e["records"])
                    r["seconds"] = (ts - int(s["ts"])) / 1000
        for p in range(parts):
            owner = owners[p]
            if owner is insts[0] and arrivals[p] == start_ms:
                continue
            mine = [r for r in restores if r["partition"] == p and r["instance"] == owner.name
                    and start_ms + r["start_s"] * 1000 <= arrivals[p] + 1]
            last = mine[-1] if mine else None
            moved.append({"partition": p, "new_owner": owner.name,
                          "arrival_s": (arrivals[p] - start_ms) / 1000,
                          "restored_records": (last["records"] if last["records"] is not None
                                               else last["offsets"][1] - last["offsets"][0]) if last else None,
                          "restore_seconds": last["seconds"] if last else None,
                          "restore_offsets": last["offsets"] if last else None})
        over_lag = [r for r in restores
                    if (r["records"] if r["records"] is not None else r["offsets"][1] - r["offsets"][0])
                    > a.scaleout_acceptable_lag]
        # The group's rebalances (new generations after start_ms) and probing.
        gens = {}
        for i in insts:
            for ms, g in i.generations():
                if start_ms - 1000 <= ms <= end_ms:
                    gens[g] = min(gens.get(g, ms), ms)
        rebalance_times = sorted(round((ms - start_ms) / 1000, 1) for ms in gens.values())
        def lines(*needles):
            return sorted((ms, line) for i in insts for ms, line in i.log_lines(*needles) if start_ms <= ms <= end_ms)
        if kind == "kstreams":
            followups = [ms for ms, _ in lines("Triggering the followup rebalance")]
            rounds = [ms for j, ms in enumerate(followups) if j == 0 or ms - followups[j - 1] > 5000]
            probing = {
                # The leader's assignor: "a followup rebalance will be scheduled" (warmups to probe,
                # or a task to hand over once its old owner revoked it).
                "unstable_assignments": len(lines("Finished unstable assignment")),
                # Follow-up rebalances triggered by any member; those within 5 s
                # of each other are one round (the probing rebalance due after
                # probing.rebalance.interval.ms, then the immediate one that
                # hands the revoked tasks over).
                "followups_triggered_s": [round((ms - start_ms) / 1000, 1) for ms in followups],
                "rounds_s": [round((ms - start_ms) / 1000, 1) for ms in rounds],
            }
        else:
            computed = lines("assignment computed")

            def withholding(line):  # the leader kept a task from its balanced owner (warming it up first)
                return ("warmup {" in line or "handed over" in line
                        or ("withheld=" in line and "withheld={}" not in line)
                        or ("deferred_moves=" in line and "deferred_moves=[]" not in line))
            probing = {
                "assignments_computed": len(computed),
                "assignments_withholding": len([1 for _, line in computed if withholding(line)]),
                # Members asking for a rebalance because their warmups caught up.
                "warmups_caught_up_requests": len(lines("warmups caught up")),
                "probing_log_lines": len(lines("probing", "Probing", "warmup", "Warmup")),
            }
        return {
            "contender": kind, "records": size, "rep": rep,
            "longest_pause_s": longest["ms"] / 1000,
            "longest_pause": {**longest, "from_s": (longest["from"] - start_ms) / 1000 if longest["from"] else None,
                              "to_s": (longest["to"] - start_ms) / 1000 if longest["to"] else None},
            "pause_s_per_partition": {p: b["ms"] / 1000 for p, b in pauses.items()},
            "time_to_balanced_s": (max(arrivals.values()) - start_ms) / 1000,
            "balanced_seen_s": (balanced_seen_ms - start_ms) / 1000,
            "measured_until_s": (end_ms - start_ms) / 1000,
            "final_assignment": {i.name: sorted(p for p, o in owners.items() if o is i) for i in insts},
            "moved": moved,
            "restores": restores,
            "restores_over_acceptable_lag": len(over_lag),
            "max_warmups_seen": warmups_max,
            "rebalances": len(gens),
            "rebalance_times_s": rebalance_times,
            "probing": probing,
        }

    def scaleout_report(self, out):
        if not self.scaleout_results:
            return
        a = self.a
        print(f"\n## scale-out ({a.scaleout_records} records of state, {FAILOVER_PARTITIONS} partitions, 1 -> 3 instances, "
              f"{a.reps} reps; acceptable recovery lag {a.scaleout_acceptable_lag}, max warmups {a.scaleout_max_warmups}, "
              f"probing interval {a.scaleout_probing_ms} ms, 0 standbys, commit interval 100 ms, "
              f"session.timeout.ms={a.session_timeout_ms}, heartbeat {a.heartbeat_ms} ms, load {a.load_rate} records/s)")
        print("seconds from the start of the two new instances; median [min-max] over reps, then per rep. "
              "Longest pause: the largest gap between two consecutively processed records of one partition "
              "(any instance). Balanced: every instance processes exactly 2 partitions (held "
              f"{a.scaleout_settle_seconds:.0f} s).")
        print("| contender | reps ok | longest pause | per rep | time to balanced | per rep | rebalances per rep "
              "| probing per rep | restores > acceptable lag per rep | records restored per moved partition |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        medians = {}
        for kind in self.SCALEOUT_CONTENDERS:
            all_runs = self.scaleout_results.get(kind)
            if not all_runs:
                continue
            runs = [r for r in all_runs if "error" not in r]
            if not runs:
                print(f"| {kind} | 0 of {len(all_runs)} (see the log) | | | | | | | | |")
                continue
            pause = [r["longest_pause_s"] for r in runs]
            bal = [r["time_to_balanced_s"] for r in runs]
            medians[kind] = (statistics.median(pause), statistics.median(bal))
            if kind == "kstreams":
                probing = [f"{r['probing']['unstable_assignments']} unstable, follow-up rounds at "
                           f"{r['probing']['rounds_s']} s" for r in runs]
            else:
                probing = [f"{r['probing']['assignments_withholding']} of {r['probing']['assignments_computed']} "
                           "withholding" for r in runs]
            replayed = [m["restored_records"] for r in runs for m in r["moved"] if m["restored_records"] is not None]
            print(f"| {kind} | {len(runs)} of {len(all_runs)} | {spread(pause)} | {', '.join(f'{v:.3f}' for v in pause)} "
                  f"| {spread(bal)} | {', '.join(f'{v:.3f}' for v in bal)} "
                  f"| {', '.join(str(r['rebalances']) for r in runs)} | {'; '.join(probing)} "
                  f"| {', '.join(str(r['restores_over_acceptable_lag']) for r in runs)} "
                  f"| {f'{statistics.median(replayed):.0f} [{min(replayed)}-{max(replayed)}]' if replayed else '-'} |")
            out.append({"scenario": "scaleout", "contender": kind, "records": a.scaleout_records,
                        "partitions": FAILOVER_PARTITIONS, "acceptable_recovery_lag": a.scaleout_acceptable_lag,
                        "max_warmup_replicas": a.scaleout_max_warmups, "probing_rebalance_interval_ms": a.scaleout_probing_ms,
                        "num_standby_replicas": 0, "commit_interval_ms": 100,
                        "session_timeout_ms": a.session_timeout_ms, "heartbeat_interval_ms": a.heartbeat_ms,
                        "load_records_per_sec": a.load_rate, "settle_seconds": a.scaleout_settle_seconds,
                        "longest_pause_s": medians[kind][0], "longest_pause_s_per_rep": pause,
                        "time_to_balanced_s": medians[kind][1], "time_to_balanced_s_per_rep": bal,
                        "runs": all_runs})
        if "kstate" in medians and "kstreams" in medians:
            (kp, kb), (sp, sb) = medians["kstate"], medians["kstreams"]
            ratio = lambda x, y: f"{x / y:.2f}" if y else "-"
            print(f"\nkstate / kstreams (medians): longest pause {ratio(kp, sp)}, time to balanced {ratio(kb, sb)}")
            for o in out:
                if o["scenario"] == "scaleout" and o["contender"] == "kstate":
                    o["ratio_to_kstreams"] = {"longest_pause": kp / sp if sp else None,
                                              "time_to_balanced": kb / sb if sb else None}

    def delete_topics(self, prefix=None):
        """Deletes this run's topics (or those starting with `prefix`): a
        --full run writes about 15 GB to the broker."""
        subprocess.run([self.rust, "delete-topics", "--bootstrap", self.b, "--prefix", prefix or self.run_id],
                       cwd=ROOT, stdout=subprocess.DEVNULL)

    def fresh_topic(self, name):
        self.gen(name, 0, compact=False)
        return name

    def report(self):
        baselines = {"restore": "plain-consumer", "tail-restore": "kafka-streams", "write": "plain-producer",
                     "write-eos": "kafka-streams-eos-out", "window": "kafka-streams", "window-restore": "kafka-streams",
                     "processor": "closure", "threads": "kstate-1-threads", "repartition": "kafka-streams", "join": "kafka-streams",
                     "rmw": "kstate-rocksdb", "restart": "kafka-streams-in-memory"}
        out = []
        self.failover_report(out)
        self.scaleout_report(out)
        self.snapshot_report(out)
        self.remote_report(out)
        self.remote_rmw_report(out)
        for scenario, contenders in self.scenarios.items():
            base = median_of(contenders.get(baselines[scenario], []), "records_per_sec")
            base_secs = median_of(contenders.get(baselines[scenario], []), "seconds")
            print(f"\n## {scenario} ({self.a.records} records, {self.a.partitions} partitions, median of {self.a.reps})")
            # write-eos: the output records a read_committed consumer counted, per rep.
            counted = any("output_records" in r for rs in contenders.values() for r in rs)
            print(f"| contender | records | records/s | MB/s | seconds | peak RSS MiB | CPU s per M records | ratio to {baselines[scenario]} |"
                  + (" output records (read_committed) per rep |" if counted else ""))
            print("|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if counted else ""))
            for name, results in contenders.items():
                rps = median_of(results, "records_per_sec")
                secs = median_of(results, "seconds")
                # Contenders that report no bytes (Kafka Streams) read the same
                # records, so their MB/s follows from the scenario's record size.
                per_record = next((r["bytes"] / r["records"] for rs in contenders.values() for r in rs
                                   if r.get("bytes") and r.get("records")), None)
                # (None when no contender of the scenario reports bytes, as in write-eos.)
                mbs = median_of([dict(r, mb=(r.get("bytes") or r["records"] * per_record) / r["seconds"] / 1e6)
                                 for r in results if r.get("seconds") and (r.get("bytes") or per_record)], "mb")
                rss = median_of(results, "peak_rss_bytes")
                cpu = median_of([dict(r, cpu_per_m=r["cpu_seconds"] / r["records"] * 1e6)
                                 for r in results if r.get("cpu_seconds") is not None and r.get("records")], "cpu_per_m")
                # Restores of different changelogs (tail, window) compare by time.
                ratio = ((base_secs / secs if secs else None) if scenario in ("tail-restore", "window-restore", "restart")
                         else (rps / base if base else None))
                outs = [r.get("output_records") for r in results]
                print(f"| {name} | {int(median_of(results, 'records'))} | {rps:,.0f} | "
                      f"{'-' if mbs is None else f'{mbs:.1f}'} | {secs:.3f} | {rss / 2**20:.0f} | {'-' if cpu is None else f'{cpu:.2f}'} | "
                      f"{'-' if ratio is None else f'{ratio:.2f}'} |"
                      + (f" {', '.join('-' if o is None else str(o) for o in outs)} |" if counted else ""))
                out.append({"scenario": scenario, "contender": name, "records_per_sec": rps, "mb_per_sec": mbs,
                            "seconds": secs, "peak_rss_bytes": rss, "cpu_seconds_per_million": cpu, "ratio_to_baseline": ratio,
                            "baseline": baselines[scenario], "runs": results,
                            **({"output_records": outs} if counted else {})})
            if scenario == "write-eos":
                self.write_eos_ratios(contenders, out)
            if scenario == "rmw":
                # Each 16th record's get and put, timed in the processor (medians of the reps' quantiles).
                print("\n| contender | get p50 ns | get p99 ns | put p50 ns | put p99 ns | disk bytes after the run |\n|---|---:|---:|---:|---:|---:|")
                for name, results in contenders.items():
                    q = [median_of(results, k) for k in ("get_ns_p50", "get_ns_p99", "put_ns_p50", "put_ns_p99", "disk_bytes")]
                    print(f"| {name} | " + " | ".join("-" if v is None else f"{v:,.0f}" for v in q) + " |")
        os.makedirs(os.path.join(ROOT, "target/bench"), exist_ok=True)
        with open(os.path.join(ROOT, "target/bench/results.json"), "w") as f:
            json.dump({"records": self.a.records, "partitions": self.a.partitions, "reps": self.a.reps,
                       "failover_sizes": self.a.failover_sizes if self.failover_results else None,
                       "scaleout_records": self.a.scaleout_records if self.scaleout_results else None,
                       "results": out}, f, indent=1)
        log("wrote target/bench/results.json")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--full", action="store_true", help="5M records (the published size)")
    p.add_argument("--records", type=int, default=None)
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--max-state-memory-mib", type=int, default=None,
                   help="processor scenario: run kstate with max_state_memory of this many MiB")
    p.add_argument("--work", type=int, default=20,
                   help="threads scenario: rounds of CPU work per record (a read-modify-write mixing the value)")
    p.add_argument("--block-every", type=int, default=0,
                   help="write-eos scenario: kstate only, a 1 ms sleep every K records (processing waiting on I/O); "
                        "Kafka Streams is left out")
    p.add_argument("--java-heap", default="1g")
    p.add_argument("--remote-latency-ms", type=int, default=30, help="remote: latency added before every object-store request (second contender)")
    p.add_argument("--only", choices=["restore", "write", "write-eos", "failover", "scaleout", "window", "snapshot", "processor", "threads", "repartition", "join", "memory", "remote", "remote-rmw"], default=None,
                   help="one scenario; write-eos, failover, scaleout, window, snapshot and processor run only when asked for")
    p.add_argument("--failover-sizes", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="records of state, comma separated (default 200000; --full: 2000000,10000000)")
    p.add_argument("--failover-contenders", type=lambda s: s.split(","), default=None,
                   help="subset of kstate-0,kstate-1,kstate-1-peers,kstreams-0,kstreams-1")
    p.add_argument("--session-timeout-ms", type=int, default=10_000, help="failover, scaleout: both contenders")
    p.add_argument("--heartbeat-ms", type=int, default=1_000, help="failover, scaleout: both contenders")
    p.add_argument("--load-rate", type=int, default=2_000, help="failover, scaleout: input records/s during the run")
    p.add_argument("--steady-seconds", type=float, default=5,
                   help="failover: caught up this long before the kill; scaleout: before the new instances start")
    p.add_argument("--scaleout-records", type=int, default=5_000_000, help="scaleout: records of state")
    p.add_argument("--scaleout-contenders", type=lambda s: s.split(","), default=["kstate", "kstreams"],
                   help="scaleout: subset of kstate,kstreams")
    p.add_argument("--scaleout-acceptable-lag", type=int, default=10_000,
                   help="scaleout: acceptable recovery lag, both contenders")
    p.add_argument("--scaleout-max-warmups", type=int, default=2, help="scaleout: max warmup replicas, both contenders")
    p.add_argument("--scaleout-probing-ms", type=int, default=60_000,
                   help="scaleout: probing rebalance interval, both contenders (Kafka Streams' minimum is 60000)")
    p.add_argument("--scaleout-settle-seconds", type=float, default=20,
                   help="scaleout: balanced this long counts as the end")
    p.add_argument("--scaleout-timeout", type=float, default=900,
                   help="scaleout: seconds from the new instances' start to a balanced group before the rep fails")
    a = p.parse_args()
    unknown = set(a.scaleout_contenders) - set(Suite.SCALEOUT_CONTENDERS)
    if unknown:
        p.error(f"--scaleout-contenders: unknown {sorted(unknown)} (choose from {','.join(Suite.SCALEOUT_CONTENDERS)})")
    a.records = a.records or (5_000_000 if a.full else 500_000)
    a.failover_sizes = a.failover_sizes or ([2_000_000, 10_000_000] if a.full else [200_000])
    bootstrap, started = start_broker()
    suite = None
    try:
        rust = build_rust()
        failover_bin = build_failover_example() if a.only in ("failover", "scaleout") else None
        build_java()
        suite = Suite(a, bootstrap, rust, failover_bin)
        if a.only in (None, "restore"):
            suite.restore()
        if a.only in (None, "write"):
            suite.write()
        if a.only == "write-eos":
            suite.write_eos()
        if a.only == "failover":
            suite.failover()
        if a.only == "scaleout":
            suite.scaleout()
        if a.only == "window":
            suite.window()
        if a.only == "snapshot":
            suite.snapshot()
        if a.only == "processor":
            suite.processor()
        if a.only == "threads":
            suite.threads()
        if a.only == "repartition":
            suite.repartition()
        if a.only == "join":
            suite.join()
        if a.only == "memory":
            suite.memory()
        if a.only == "remote":
            suite.remote()
        if a.only == "remote-rmw":
            suite.remote_rmw()
        suite.report()
    finally:
        if suite is not None:
            suite.delete_topics()
            shutil.rmtree(suite.tmp, ignore_errors=True)
        if started:
            subprocess.run(["bash", "testing/kafka.sh", "stop"], cwd=ROOT)
        if MINIO_STARTED:
            subprocess.run(["bash", "testing/minio.sh", "stop"], cwd=ROOT)


if __name__ == "__main__":
    main()
