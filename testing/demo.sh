#!/usr/bin/env bash
# Runs the restore demo (examples/restore_demo.rs) against a real Kafka broker:
#
#   bash testing/demo.sh
#   KSTATE_BOOTSTRAP=127.0.0.1:9092 bash testing/demo.sh   # use a running broker
#
# Same steps as testing/test.sh: installs missing Debian packages, starts a
# broker with testing/kafka.sh unless KSTATE_BOOTSTRAP is set (stopped again on
# exit), exports KSTATE_BOOTSTRAP, then runs
# `cargo run --release --example restore_demo -- "$@"`.
# The exit code is cargo's.
set -euo pipefail
# shellcheck source=testing/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$KSTATE_ROOT"

kstate_ensure_packages
kstate_start_broker

rc=0
kstate_log "cargo run --release --example restore_demo $*"
cargo run --release --example restore_demo -- "$@" || rc=$?
exit "$rc"
