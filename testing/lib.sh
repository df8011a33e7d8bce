# shellcheck shell=bash
# Shared by testing/test.sh and testing/demo.sh (sourced; defines functions and
# installs an EXIT trap):
#   kstate_ensure_packages  install the Debian packages the build needs
#   kstate_start_broker     start a test broker unless KSTATE_BOOTSTRAP is set,
#                           stop it again when the calling script exits
#   kstate_start_minio      start an S3-compatible server (testing/minio.sh)
#                           unless KSTATE_S3_ENDPOINT is set, stop it on exit
# The EXIT trap (kstate_on_exit) stops a broker started here and removes the
# files listed in KSTATE_TMPFILES.

KSTATE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KSTATE_KAFKA_SH=$KSTATE_ROOT/testing/kafka.sh
KSTATE_STARTED_BROKER=0
KSTATE_MINIO_SH=$KSTATE_ROOT/testing/minio.sh
KSTATE_STARTED_MINIO=0
KSTATE_TMPFILES=()

# shellcheck disable=SC2317 # called through the trap
kstate_on_exit() {
    kstate_stop_broker
    if [[ $KSTATE_STARTED_MINIO == 1 ]]; then
        KSTATE_STARTED_MINIO=0
        bash "$KSTATE_MINIO_SH" stop || true
    fi
    if ((${#KSTATE_TMPFILES[@]} > 0)); then rm -f "${KSTATE_TMPFILES[@]}"; fi
}
# EXIT also runs on Ctrl-C / SIGTERM through these exits.
trap kstate_on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

kstate_log() { echo "kstate: $*" >&2; }

kstate_dpkg_installed() {
    [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]
}

# Debian packages the build and the test broker need:
#   clang, libclang-dev  librocksdb-sys (bindgen loads libclang at build time)
#   build-essential      make + C/C++ compilers for librdkafka and RocksDB
#                        (only checked by command: cc, c++, make)
#   default-jre-headless, maven   the test broker (only without KSTATE_BOOTSTRAP)
#   golang, curl         the S3-compatible test server (testing/minio.sh;
#                        only checked by command)
kstate_ensure_packages() {
    if ! command -v dpkg-query >/dev/null 2>&1; then
        kstate_log "not a Debian system: make sure clang, libclang, make and a C/C++ compiler are installed"
        return 0
    fi
    local -a missing=()
    local pkg
    for pkg in clang libclang-dev; do
        kstate_dpkg_installed "$pkg" || missing+=("$pkg")
    done
    if ! command -v make >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1 ||
        ! command -v c++ >/dev/null 2>&1; then
        missing+=(build-essential)
    fi
    if [[ -z ${KSTATE_BOOTSTRAP:-} ]]; then
        command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
        command -v mvn >/dev/null 2>&1 || missing+=(maven)
    fi
    command -v go >/dev/null 2>&1 || missing+=(golang)
    command -v curl >/dev/null 2>&1 || missing+=(curl)
    ((${#missing[@]} > 0)) || return 0

    if [[ $(id -u) != 0 ]]; then
        kstate_log "missing Debian packages: ${missing[*]}. Install them with:"
        echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
    kstate_log "installing missing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

kstate_stop_broker() {
    if [[ $KSTATE_STARTED_BROKER == 1 ]]; then
        KSTATE_STARTED_BROKER=0
        bash "$KSTATE_KAFKA_SH" stop || true
    fi
}

# True if something accepts TCP connections on 127.0.0.1:$1.
kstate_port_taken() {
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# Prints N distinct TCP ports on 127.0.0.1 that are free now (the kernel
# picks them: each bound to port 0, all held until every one is chosen).
kstate_free_ports() {
    python3 -c 'import socket, sys
held = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in held: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in held))' "$1"
}

kstate_start_broker() {
    if [[ -n ${KSTATE_BOOTSTRAP:-} ]]; then
        kstate_log "using the broker at KSTATE_BOOTSTRAP=$KSTATE_BOOTSTRAP"
        export KSTATE_BOOTSTRAP
        return 0
    fi
    if bash "$KSTATE_KAFKA_SH" status >/dev/null 2>&1; then
        # Started earlier with `testing/kafka.sh start`: reuse it, leave it running.
        KSTATE_BOOTSTRAP=$(bash "$KSTATE_KAFKA_SH" start | tail -n 1)
        kstate_log "reusing the test broker already running at $KSTATE_BOOTSTRAP (left running)"
    else
        # The default ports (9092-9095) taken by something else: a broker of
        # our own on ports that are free (kept in the environment, so the
        # exit trap's `stop` finds it).
        if [[ -z ${KSTATE_KAFKA_PORT:-} ]] && { kstate_port_taken 9092 || kstate_port_taken 9093 ||
            kstate_port_taken 9094 || kstate_port_taken 9095; }; then
            local -a ports
            read -r -a ports <<<"$(kstate_free_ports 4)"
            export KSTATE_KAFKA_PORT=${ports[0]} KSTATE_KAFKA_CONTROLLER_PORT=${ports[1]}
            export KSTATE_KAFKA_SSL_PORT=${ports[2]} KSTATE_KAFKA_SASL_PORT=${ports[3]}
            kstate_log "ports 9092-9095 are taken: the test broker uses ${ports[*]}"
        fi
        KSTATE_STARTED_BROKER=1
        KSTATE_BOOTSTRAP=$(bash "$KSTATE_KAFKA_SH" start | tail -n 1)
    fi
    [[ -n $KSTATE_BOOTSTRAP ]] || { kstate_log "testing/kafka.sh start printed no address"; exit 1; }
    export KSTATE_BOOTSTRAP
    kstate_log "KSTATE_BOOTSTRAP=$KSTATE_BOOTSTRAP"
    # The SSL and SASL listeners of the same broker, and its certificates
    # (KSTATE_SSL_BOOTSTRAP, KSTATE_SASL_BOOTSTRAP, KSTATE_TLS_*), for the
    # security tests.
    local env_lines
    env_lines=$(bash "$KSTATE_KAFKA_SH" env) || { kstate_log "testing/kafka.sh env failed"; exit 1; }
    set -a
    eval "$env_lines"
    set +a
}

# The snapshot tests' object storage: a MinIO server from testing/minio.sh
# (built once from the Go module proxy), unless KSTATE_S3_ENDPOINT names one.
# Exports KSTATE_S3_ENDPOINT, KSTATE_S3_BUCKET and the AWS_* credentials.
kstate_start_minio() {
    if [[ -n ${KSTATE_S3_ENDPOINT:-} ]]; then
        kstate_log "using the S3 server at KSTATE_S3_ENDPOINT=$KSTATE_S3_ENDPOINT"
        return 0
    fi
    if bash "$KSTATE_MINIO_SH" status >/dev/null 2>&1; then
        kstate_log "reusing the MinIO server already running (left running)"
    else
        # MinIO's default ports (9000, console 9001) taken: a free pair.
        if [[ -z ${KSTATE_MINIO_PORT:-} ]] && { kstate_port_taken 9000 || kstate_port_taken 9001; }; then
            local port
            for _ in 1 2 3 4 5 6 7 8; do
                port=$(kstate_free_ports 1)
                kstate_port_taken $((port + 1)) || break
            done
            export KSTATE_MINIO_PORT=$port
            kstate_log "ports 9000-9001 are taken: MinIO uses $port and $((port + 1))"
        fi
        bash "$KSTATE_MINIO_SH" start >/dev/null
        KSTATE_STARTED_MINIO=1
    fi
    local env_lines
    env_lines=$(bash "$KSTATE_MINIO_SH" env) || { kstate_log "testing/minio.sh env failed"; exit 1; }
    set -a
    eval "$env_lines"
    set +a
    kstate_log "KSTATE_S3_ENDPOINT=$KSTATE_S3_ENDPOINT bucket $KSTATE_S3_BUCKET"
}
