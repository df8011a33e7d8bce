"""What the one-scenario bench scripts (time_bench.py, query_bench.py) share:
building benches/kstate_bench.rs and running one contender process."""
import json
import os
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def sh(cmd, **kw):
    return subprocess.run(cmd, cwd=ROOT, **kw)


def build_bench():
    """Builds the bench binary (`cargo bench --no-run`); a failing build
    shows the compiler's errors and exits."""
    out = sh(["cargo", "bench", "--bench", "kstate_bench", "--features", "s3", "--no-run", "--message-format", "json-render-diagnostics"],
             stdout=subprocess.PIPE)
    if out.returncode:
        sys.exit("building benches/kstate_bench.rs failed; the compiler's errors are above")
    for line in out.stdout.decode().splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("target", {}).get("name") == "kstate_bench" and msg.get("executable"):
            return msg["executable"]
    sys.exit("cargo built no kstate_bench executable")


def run(cmd):
    """Runs one contender after a sync and a pause; its last stdout line as JSON."""
    os.sync()
    time.sleep(1)
    out = sh(cmd, stdout=subprocess.PIPE, check=True).stdout.decode()
    return json.loads(out.strip().splitlines()[-1])


def bootstrap():
    """KSTATE_BOOTSTRAP, or a broker started with testing/kafka.sh."""
    if "KSTATE_BOOTSTRAP" in os.environ:
        return os.environ["KSTATE_BOOTSTRAP"]
    return sh(["bash", "testing/kafka.sh", "start"], stdout=subprocess.PIPE, check=True).stdout.decode().split()[-1]


def rotated(variants, reps):
    """(rep, variant) in run order: each repetition starts one variant later,
    so that no variant always runs first (on a cold broker) or last."""
    for rep in range(reps):
        for v in variants[rep % len(variants):] + variants[:rep % len(variants)]:
            yield rep, v
