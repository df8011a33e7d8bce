#!/usr/bin/env bash
# End-to-end smoke run of every subcommand against a running broker.
#   bash testing/bench/kstreams/verify.sh [BOOTSTRAP] [N] [PARTITIONS]
# Defaults: 127.0.0.1:19092, 200000 records, 4 partitions. Topic and app names get a
# unique suffix, so the script can be re-run against the same broker. Prints the JSON
# result lines; exits non-zero if a subcommand fails or a restored count is wrong.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
B=${1:-127.0.0.1:19092}
N=${2:-200000}
P=${3:-4}
TAIL=$((N / 10))
JAR=$HERE/target/kstreams-bench.jar
[[ -f $JAR ]] || mvn -q -B -Dstyle.color=never -f "$HERE/pom.xml" package
S=v$(date +%s)
STATE=$(mktemp -d)
trap 'rm -rf "$STATE"' EXIT
LOG=$STATE/stderr.log

run() { java -jar "$JAR" "$@" 2>>"$LOG" || { tail -n 30 "$LOG" >&2; exit 1; }; }
field() { sed -E "s/.*\"$1\":([0-9.]+).*/\1/" <<<"$2"; }
check() { [[ $2 == "$3" ]] || { echo "verify.sh: $1: expected $3, got $2" >&2; exit 1; }; }

C=(--bootstrap "$B" --app-id "$S" --store kv --input-topic "$S-input" --partitions "$P" --state-dir "$STATE/state")

run generate --bootstrap "$B" --topic "$S-kv-changelog" --partitions "$P" --records "$N"
out=$(run restore "${C[@]}"); echo "$out"
check "restored records" "$(field records "$out")" "$N"
run consume --bootstrap "$B" --topic "$S-kv-changelog"
run generate --bootstrap "$B" --topic "$S-kv-changelog" --partitions "$P" --records "$TAIL" --seed 43 --append
out=$(run tail-restore "${C[@]}"); echo "$out"
check "tail-restored records" "$(field records "$out")" "$TAIL"
run generate --bootstrap "$B" --topic "$S-write-input" --partitions "$P" --records "$N" --compact false
out=$(run write --bootstrap "$B" --app-id "$S-w" --store kv --input-topic "$S-write-input" --partitions "$P" \
    --state-dir "$STATE/state" --records "$N"); echo "$out"
check "changelog records after write" "$(field changelog_offset_span "$out")" "$N"
run consume --bootstrap "$B" --topic "$S-write-input"
echo "verify.sh: OK" >&2
