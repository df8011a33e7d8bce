#!/usr/bin/env bash
# A single-node Apache Kafka broker (KRaft, combined broker+controller) for the
# kstate test suite, run straight from Maven Central jars: no Docker, no tarball.
#
#   bash testing/kafka.sh install   # resolve the broker's jars (idempotent)
#   bash testing/kafka.sh start     # fresh broker; last stdout line = bootstrap address
#   bash testing/kafka.sh restart   # start again on the existing data (after stop/kill)
#   bash testing/kafka.sh status    # exit 0 if running, 1 if not
#   bash testing/kafka.sh stop      # SIGTERM, then SIGKILL after 30 s
#   bash testing/kafka.sh kill      # SIGKILL at once (a crashed broker); data kept
#   bash testing/kafka.sh env       # KEY=value lines for the secured listeners (below)
#
# Listeners, all on 127.0.0.1 (inter-broker and controller traffic: PLAINTEXT):
#   PORT     PLAINTEXT       what `start` prints
#   PORT+1   CONTROLLER      KRaft controller (not for clients)
#   PORT+2   SSL             mutual TLS (ssl.client.auth=required), PEM files
#                            from testing/certs.sh in the TLS dir; the broker
#                            certificate has SAN DNS:localhost and IP:127.0.0.1
#   PORT+3   SASL_PLAINTEXT  SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN; user kstate,
#                            password kstate-secret (SCRAM users are written at
#                            format time, so `restart` keeps them)
# TLS dir (default DATA/tls; kept by `start`, which wipes the rest of DATA):
#   ca.pem                       CA the broker trusts (clients: ssl.ca.location)
#   client.pem, client.key       client certificate + key (unencrypted PKCS#8)
#   client-encrypted.key         the same key encrypted, password kstate-key-pass
#   untrusted-ca.pem             a CA the broker does not trust, and a client
#   untrusted-client.pem/.key    certificate + key signed by it (negative tests)
#   broker.pem, broker.key, broker-keystore.pem, ca.key   the broker's side
# `env` prints KSTATE_SSL_BOOTSTRAP, KSTATE_SASL_BOOTSTRAP, KSTATE_SASL_USER,
# KSTATE_SASL_PASSWORD, KSTATE_SASL_MECHANISMS, KSTATE_TLS_DIR, KSTATE_TLS_CA,
# KSTATE_TLS_CLIENT_CERT, KSTATE_TLS_CLIENT_KEY, KSTATE_TLS_CLIENT_KEY_ENCRYPTED,
# KSTATE_TLS_CLIENT_KEY_PASSWORD, KSTATE_TLS_UNTRUSTED_CA,
# KSTATE_TLS_UNTRUSTED_CLIENT_CERT, KSTATE_TLS_UNTRUSTED_CLIENT_KEY, one
# KEY=value line each (shell-quoted; to export them all:
# `set -a; eval "$(bash testing/kafka.sh env)"; set +a`).
# It only computes them from the environment below; the files exist once
# `start` has run.
#
# Environment (all optional):
#   KSTATE_KAFKA_VERSION          Kafka version (default 4.4.0)
#   KSTATE_KAFKA_HOME             where the jars go (default ~/.cache/kstate/kafka-<version>)
#   KSTATE_KAFKA_PORT             PLAINTEXT listener port (default 9092)
#   KSTATE_KAFKA_CONTROLLER_PORT  KRaft controller port (default PORT+1)
#   KSTATE_KAFKA_SSL_PORT         SSL listener port (default PORT+2)
#   KSTATE_KAFKA_SASL_PORT        SASL_PLAINTEXT listener port (default PORT+3)
#   KSTATE_KAFKA_DATA             data dir, wiped on start, kept by restart (default /tmp/kstate-kafka-<port>)
#   KSTATE_KAFKA_TLS_DIR          certificates (default DATA/tls); made if missing, else reused
#   KSTATE_KAFKA_START_TIMEOUT    seconds to wait for readiness (default 90)
#   KSTATE_KAFKA_HEAP             JVM heap (default 512m)
#
# Progress goes to stderr; `start` prints only the bootstrap address on stdout,
# so `BOOTSTRAP=$(bash testing/kafka.sh start)` works.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KAFKA_VERSION=${KSTATE_KAFKA_VERSION:-4.4.0}
KAFKA_HOME_DIR=${KSTATE_KAFKA_HOME:-$HOME/.cache/kstate/kafka-$KAFKA_VERSION}
LIB=$KAFKA_HOME_DIR/lib
PORT=${KSTATE_KAFKA_PORT:-9092}
CONTROLLER_PORT=${KSTATE_KAFKA_CONTROLLER_PORT:-$((PORT + 1))}
SSL_PORT=${KSTATE_KAFKA_SSL_PORT:-$((PORT + 2))}
SASL_PORT=${KSTATE_KAFKA_SASL_PORT:-$((PORT + 3))}
DATA=${KSTATE_KAFKA_DATA:-/tmp/kstate-kafka-$PORT}
TLS_DIR=${KSTATE_KAFKA_TLS_DIR:-$DATA/tls}
START_TIMEOUT=${KSTATE_KAFKA_START_TIMEOUT:-90}
HEAP=${KSTATE_KAFKA_HEAP:-512m}
PIDFILE=$DATA/broker.pid
BROKER_LOG=$DATA/broker.log
# Written into every data dir this script creates; `start` refuses to wipe a
# non-empty directory without it.
DATA_MARKER=.kstate-kafka-data
POM_SRC=$SCRIPT_DIR/kafka/pom.xml
LOG4J_SRC=$SCRIPT_DIR/kafka/log4j2.properties
CERTS_SH=$SCRIPT_DIR/certs.sh
# The SASL user, on every mechanism of the SASL_PLAINTEXT listener.
SASL_USER=kstate
SASL_PASSWORD=kstate-secret
SASL_MECHANISMS=SCRAM-SHA-256,SCRAM-SHA-512,PLAIN
# Password of client-encrypted.key; must match KEY_PASS in testing/certs.sh.
TLS_KEY_PASSWORD=kstate-key-pass

log() { echo "kafka.sh: $*" >&2; }
die() { echo "kafka.sh: error: $*" >&2; exit 1; }

# The header comment: every line from line 2 up to the first non-comment one.
usage() {
    awk 'NR == 1 { next } !/^#/ { exit } { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}" >&2
}

# ---------------------------------------------------------------- checks

require_java() {
    command -v java >/dev/null 2>&1 ||
        die "java not found. The test broker needs Java 17 or newer (Debian: apt-get install -y default-jre-headless)."
    local ver major
    ver=$(java -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
    major=${ver%%.*}
    if [[ $major == 1 ]]; then major=$(echo "$ver" | cut -d. -f2); fi
    if [[ $major =~ ^[0-9]+$ ]] && ((major < 17)); then
        die "java $ver found, but Kafka $KAFKA_VERSION needs Java 17 or newer."
    fi
}

require_maven() {
    command -v mvn >/dev/null 2>&1 ||
        die "mvn not found. It is needed once to fetch the broker's jars (Debian: apt-get install -y maven)."
}

# True if something accepts TCP connections on 127.0.0.1:$1.
port_open() {
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

all_ports_open() {
    local p
    for p in "$@"; do port_open "$p" || return 1; done
}

# Prints the pid of the broker started by this script for $DATA, if it runs.
running_pid() {
    [[ -f $PIDFILE ]] || return 1
    local pid
    pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    # Guard against pid reuse: it must be our JVM.
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'kafka\.Kafka' || return 1
    echo "$pid"
}

# ---------------------------------------------------------------- install

installed() {
    [[ -f $KAFKA_HOME_DIR/.complete && -d $LIB ]] &&
        cmp -s "$POM_SRC" "$KAFKA_HOME_DIR/pom.xml" &&
        [[ $(cat "$KAFKA_HOME_DIR/.complete") == "$KAFKA_VERSION" ]]
}

cmd_install() {
    require_java
    if installed; then
        log "Kafka $KAFKA_VERSION already installed in $LIB"
        return 0
    fi
    require_maven
    mkdir -p "$KAFKA_HOME_DIR"
    # Serialise concurrent installs (e.g. two test runs on one machine). The
    # lock fd lives only in this subshell, so the broker never inherits it.
    (
        if command -v flock >/dev/null 2>&1; then flock 9; fi
        install_locked
    ) 9>"$KAFKA_HOME_DIR/.install.lock"
}

install_locked() {
    if installed; then
        log "Kafka $KAFKA_VERSION already installed in $LIB"
        return 0
    fi
    log "resolving Kafka $KAFKA_VERSION jars from Maven Central into $LIB (first run only)"
    rm -f "$KAFKA_HOME_DIR/.complete"
    cp "$POM_SRC" "$KAFKA_HOME_DIR/pom.xml.new"
    local tmp=$KAFKA_HOME_DIR/lib.new
    rm -rf "$tmp"
    # Run from the home dir so Maven leaves nothing (target/) in the clone.
    # Debian's Maven 3.8 prints stray ANSI resets even with -B; strip them.
    if ! (cd "$KAFKA_HOME_DIR" && mvn -q -B -Dstyle.color=never -f pom.xml.new \
        -Dkafka.version="$KAFKA_VERSION" \
        dependency:copy-dependencies -DoutputDirectory="$tmp" 2>&1 |
        sed 's/\x1b\[[0-9;]*m//g' >&2); then
        rm -rf "$tmp" "$KAFKA_HOME_DIR/pom.xml.new"
        die "mvn could not resolve org.apache.kafka:kafka_2.13:$KAFKA_VERSION (see the output above)"
    fi
    [[ -f $tmp/kafka_2.13-$KAFKA_VERSION.jar ]] ||
        die "mvn finished but $tmp has no kafka_2.13-$KAFKA_VERSION.jar"
    rm -rf "$LIB"
    mv "$tmp" "$LIB"
    mv "$KAFKA_HOME_DIR/pom.xml.new" "$KAFKA_HOME_DIR/pom.xml"
    echo "$KAFKA_VERSION" >"$KAFKA_HOME_DIR/.complete"
    log "installed $(find "$LIB" -name '*.jar' | wc -l) jars in $LIB"
}

# ---------------------------------------------------------------- start

write_server_properties() {
    cat >"$DATA/server.properties" <<EOF
# Generated by testing/kafka.sh for the kstate test suite. Single node, KRaft,
# combined broker+controller, 127.0.0.1 only. Broker-to-broker and controller
# traffic is PLAINTEXT; SSL and SASL_PLAINTEXT are for clients under test.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT,SSL://127.0.0.1:$SSL_PORT,SASL_PLAINTEXT://127.0.0.1:$SASL_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT,SSL://127.0.0.1:$SSL_PORT,SASL_PLAINTEXT://127.0.0.1:$SASL_PORT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT
log.dirs=$DATA/logs

# SSL listener: mutual TLS. PEM files (testing/certs.sh), no JKS/PKCS#12 and
# no store passwords: the key in broker-keystore.pem is unencrypted PKCS#8, so
# ssl.key.password stays unset (Kafka rejects ssl.keystore.password for PEM).
# Prefixed with the listener name so nothing applies to the other listeners.
listener.name.ssl.ssl.keystore.type=PEM
listener.name.ssl.ssl.keystore.location=$TLS_DIR/broker-keystore.pem
listener.name.ssl.ssl.truststore.type=PEM
listener.name.ssl.ssl.truststore.location=$TLS_DIR/ca.pem
listener.name.ssl.ssl.client.auth=required

# SASL_PLAINTEXT listener. SCRAM credentials live in the cluster metadata
# (written by "StorageTool format --add-scram"); PLAIN users in the JAAS line.
listener.name.sasl_plaintext.sasl.enabled.mechanisms=$SASL_MECHANISMS
listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$SASL_USER="$SASL_PASSWORD";

# Topics are created explicitly by the code under test.
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=1

# Internal topics on a single node: replication factor 1, min ISR 1, and fewer
# partitions than the default 50 so the first group/transaction is quick.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=5
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=5
# A crashed or frozen exactly-once instance's transaction is aborted within
# about 1 s of its transaction.timeout.ms (default check: every 10 s).
transaction.abort.timed.out.transaction.cleanup.interval.ms=1000
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=5

# No 3 s wait before the first rebalance of a new group.
group.initial.rebalance.delay.ms=0

# Compaction observable within seconds (topics still need segment.ms and
# min.cleanable.dirty.ratio of their own; see testing/README.md).
log.cleaner.enable=true
log.cleaner.threads=1
log.cleaner.backoff.ms=1000
log.cleaner.min.compaction.lag.ms=0
log.cleaner.dedupe.buffer.size=33554432
log.retention.check.interval.ms=5000
log.segment.delete.delay.ms=1000

# Small machine: fewer threads than the defaults.
num.network.threads=2
num.io.threads=4
background.threads=4
EOF
}

# $1 = 1: start on the existing data (restart), else on a fresh data dir.
cmd_start() {
    local keep_data=${1:-0}
    local pid
    if pid=$(running_pid); then
        log "broker already running (pid $pid, data $DATA)"
        echo "127.0.0.1:$PORT"
        return 0
    fi
    local p
    for p in "$PORT" "$CONTROLLER_PORT" "$SSL_PORT" "$SASL_PORT"; do
        [[ $p =~ ^[0-9]+$ ]] ||
            die "KSTATE_KAFKA_PORT / _CONTROLLER_PORT / _SSL_PORT / _SASL_PORT must be numbers"
    done
    [[ $(printf '%s\n' "$PORT" "$CONTROLLER_PORT" "$SSL_PORT" "$SASL_PORT" | sort -u | wc -l) == 4 ]] ||
        die "the PLAINTEXT, controller, SSL and SASL ports must all differ ($PORT, $CONTROLLER_PORT, $SSL_PORT, $SASL_PORT)"
    for p in "$PORT" "$CONTROLLER_PORT" "$SSL_PORT" "$SASL_PORT"; do
        if port_open "$p"; then
            die "port $p on 127.0.0.1 is already in use by another process (not a broker started by this script with data dir $DATA). Stop it, choose another KSTATE_KAFKA_PORT, or point the tests at it with KSTATE_BOOTSTRAP=127.0.0.1:$p"
        fi
    done

    cmd_install

    local -a jvm_common=(
        -Djava.awt.headless=true
        -Dlog4j2.configurationFile="$DATA/log4j2.properties"
        -Dkafka.logs.dir="$DATA"
        -cp "$LIB/*"
    )
    local cluster_id
    if [[ $keep_data == 1 ]]; then
        [[ -f $DATA/$DATA_MARKER && -f $DATA/logs/meta.properties ]] ||
            die "restart needs the data of an earlier start in $DATA (none found; use start)"
        cluster_id=$(sed -n 's/^cluster.id=//p' "$DATA/logs/meta.properties")
        log "restarting on the existing data in $DATA"
        # restart reuses server.properties and the metadata log as they are.
        grep -q '^listeners=.*SASL_PLAINTEXT://' "$DATA/server.properties" ||
            log "warning: $DATA was made by an older kafka.sh: no SSL/SASL listeners until a fresh start"
    else
        # Wipe and recreate the data dir, but never a directory we did not make.
        case $DATA in "" | / | "$HOME" | "$HOME/") die "refusing to use '$DATA' as the data dir" ;; esac
        if [[ -d $DATA && -n $(ls -A "$DATA" 2>/dev/null) && ! -f $DATA/$DATA_MARKER ]]; then
            die "$DATA exists, is not empty and was not made by this script; refusing to wipe it (set KSTATE_KAFKA_DATA)"
        fi
        # The certificates survive (when in DATA/tls): they are no broker state,
        # and clients holding the old CA keep working after a fresh start.
        if [[ -d $DATA ]]; then
            find "$DATA" -mindepth 1 -maxdepth 1 ! -path "$TLS_DIR" -exec rm -rf {} +
        fi
        mkdir -p "$DATA/logs"
        touch "$DATA/$DATA_MARKER"
        write_server_properties
        cp "$LOG4J_SRC" "$DATA/log4j2.properties"

        # A random Kafka Uuid: 16 random bytes, URL-safe base64 without padding
        # (what `StorageTool random-uuid` prints, minus a JVM start).
        cluster_id=-
        while [[ $cluster_id == -* ]]; do
            cluster_id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
        done
        # SCRAM users go into the bootstrap metadata here (so they exist before
        # the first client connects, and restart keeps them with the metadata
        # log); adding them later would need an Admin client after startup.
        if ! java "${jvm_common[@]}" kafka.tools.StorageTool format --standalone \
            -t "$cluster_id" -c "$DATA/server.properties" \
            --add-scram "SCRAM-SHA-256=[name=$SASL_USER,password=$SASL_PASSWORD]" \
            --add-scram "SCRAM-SHA-512=[name=$SASL_USER,password=$SASL_PASSWORD]" \
            >>"$DATA/format.log" 2>&1; then
            cat "$DATA/format.log" >&2
            die "formatting the storage in $DATA/logs failed"
        fi
    fi

    # Before every start, restart included: the broker reads the PEM files
    # only at startup, and certs.sh is a no-op when the set is complete.
    bash "$CERTS_SH" "$TLS_DIR" || die "could not make the test certificates in $TLS_DIR"
    # Readiness covers every client listener in this data dir's config (a
    # restart on data of an older kafka.sh has only PLAINTEXT).
    local -a ready_ports=("$PORT")
    local secured=""
    if grep -q '^listeners=.*SASL_PLAINTEXT://' "$DATA/server.properties"; then
        ready_ports+=("$SSL_PORT" "$SASL_PORT")
        secured=", SSL $SSL_PORT, SASL $SASL_PORT"
    fi

    log "starting Kafka $KAFKA_VERSION on 127.0.0.1:$PORT (controller $CONTROLLER_PORT$secured, data $DATA, cluster $cluster_id)"
    local t0=$SECONDS log_offset=0
    [[ -f $BROKER_LOG ]] && log_offset=$(stat -c %s "$BROKER_LOG")
    nohup java \
        -Xms"$HEAP" -Xmx"$HEAP" \
        -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
        -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent \
        -XX:+ExitOnOutOfMemoryError \
        "${jvm_common[@]}" \
        kafka.Kafka "$DATA/server.properties" \
        >>"$BROKER_LOG" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$PIDFILE"

    # Ready = "Kafka Server started" logged (after this start's offset in
    # the log, which a restart appends to) AND the client ports accept TCP.
    local deadline=$((SECONDS + START_TIMEOUT))
    while :; do
        if ! kill -0 "$pid" 2>/dev/null; then
            log "the broker process (pid $pid) died during startup; last lines of $BROKER_LOG:"
            tail -n 40 "$BROKER_LOG" >&2 || true
            rm -f "$PIDFILE"
            die "broker failed to start"
        fi
        if tail -c +$((log_offset + 1)) "$BROKER_LOG" 2>/dev/null | grep -q 'Kafka Server started' &&
            all_ports_open "${ready_ports[@]}"; then
            break
        fi
        if ((SECONDS >= deadline)); then
            log "broker not ready after ${START_TIMEOUT}s; last lines of $BROKER_LOG:"
            tail -n 40 "$BROKER_LOG" >&2 || true
            stop_pid "$pid"
            rm -f "$PIDFILE"
            die "broker did not become ready within ${START_TIMEOUT}s"
        fi
        sleep 0.2
    done
    log "broker ready after $((SECONDS - t0))s (pid $pid, log $BROKER_LOG)"
    echo "127.0.0.1:$PORT"
}

# ---------------------------------------------------------------- stop/status

stop_pid() {
    local pid=$1 i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 300; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    log "broker (pid $pid) still running 30s after SIGTERM; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
}

cmd_stop() {
    local pid
    if pid=$(running_pid); then
        log "stopping broker on 127.0.0.1:$PORT (pid $pid)"
        stop_pid "$pid"
        log "stopped"
    else
        log "no broker running for $DATA"
    fi
    rm -f "$PIDFILE"
}

cmd_kill() {
    local pid
    if pid=$(running_pid); then
        log "killing broker on 127.0.0.1:$PORT (pid $pid) with SIGKILL; data kept in $DATA"
        kill -KILL "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    else
        log "no broker running for $DATA"
    fi
    rm -f "$PIDFILE"
}

cmd_status() {
    local pid
    if pid=$(running_pid); then
        echo "running: pid $pid, bootstrap 127.0.0.1:$PORT, data $DATA"
        return 0
    fi
    echo "not running (port $PORT, data $DATA)"
    return 1
}

# ---------------------------------------------------------------- env

# $1 as one shell word: as is when plainly safe (so line-based parsers see
# the bare value), else in single quotes. Not printf %q: it escapes commas.
shell_word() {
    if [[ $1 =~ ^[A-Za-z0-9_./:,@%+=-]+$ ]]; then
        printf '%s' "$1"
    else
        printf "'%s'" "${1//\'/\'\\\'\'}"
    fi
}

# KEY=value lines (values shell-quoted) telling tests where the secured
# listeners and the certificates are. Computed from the environment only, like
# the ports themselves, so it also works before `start`; it warns on stderr
# when this data dir's broker is not running with those listeners.
cmd_env() {
    if ! running_pid >/dev/null; then
        log "note: no broker running for $DATA (start one with: bash testing/kafka.sh start)"
    elif ! grep -q '^listeners=.*SASL_PLAINTEXT://' "$DATA/server.properties" 2>/dev/null; then
        log "warning: the broker for $DATA was started by an older kafka.sh: no SSL/SASL listeners (stop, then start)"
    fi
    local -a vars=(
        KSTATE_SSL_BOOTSTRAP "127.0.0.1:$SSL_PORT"
        KSTATE_SASL_BOOTSTRAP "127.0.0.1:$SASL_PORT"
        KSTATE_SASL_USER "$SASL_USER"
        KSTATE_SASL_PASSWORD "$SASL_PASSWORD"
        KSTATE_SASL_MECHANISMS "$SASL_MECHANISMS"
        KSTATE_TLS_DIR "$TLS_DIR"
        KSTATE_TLS_CA "$TLS_DIR/ca.pem"
        KSTATE_TLS_CLIENT_CERT "$TLS_DIR/client.pem"
        KSTATE_TLS_CLIENT_KEY "$TLS_DIR/client.key"
        KSTATE_TLS_CLIENT_KEY_ENCRYPTED "$TLS_DIR/client-encrypted.key"
        KSTATE_TLS_CLIENT_KEY_PASSWORD "$TLS_KEY_PASSWORD"
        KSTATE_TLS_UNTRUSTED_CA "$TLS_DIR/untrusted-ca.pem"
        KSTATE_TLS_UNTRUSTED_CLIENT_CERT "$TLS_DIR/untrusted-client.pem"
        KSTATE_TLS_UNTRUSTED_CLIENT_KEY "$TLS_DIR/untrusted-client.key"
    )
    local i
    for ((i = 0; i < ${#vars[@]}; i += 2)); do
        printf '%s=%s\n' "${vars[i]}" "$(shell_word "${vars[i + 1]}")"
    done
}

case ${1:-} in
    install) cmd_install ;;
    start) cmd_start 0 ;;
    restart) cmd_start 1 ;;
    stop) cmd_stop ;;
    kill) cmd_kill ;;
    status) cmd_status ;;
    env) cmd_env ;;
    -h | --help | help) usage ;;
    *)
        usage
        exit 2
        ;;
esac
