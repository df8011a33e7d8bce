#!/usr/bin/env bash
# A MinIO server (S3-compatible object storage) for the snapshot tests, built
# from the Go module proxy with the machine's Go (no Docker, no binary download).
#
#   bash testing/minio.sh install   # build the server once (idempotent, ~3 min cold)
#   bash testing/minio.sh start     # fresh server + bucket; last stdout line = endpoint
#   bash testing/minio.sh status    # exit 0 if running, 1 if not
#   bash testing/minio.sh stop      # SIGTERM, then SIGKILL after 10 s
#   bash testing/minio.sh kill      # SIGKILL at once (the server dying mid-transfer)
#   bash testing/minio.sh restart   # start again on the existing data
#   bash testing/minio.sh env       # KEY=value lines for the tests (below)
#
# `env` prints KSTATE_S3_ENDPOINT, KSTATE_S3_BUCKET, AWS_ACCESS_KEY_ID,
# AWS_SECRET_ACCESS_KEY, AWS_REGION and AWS_ALLOW_HTTP: what an object_store
# client (kstate's) needs to reach the bucket.
#
# Environment (all optional):
#   KSTATE_MINIO_VERSION  Go module version of github.com/minio/minio (pinned below)
#   KSTATE_MINIO_BIN      where the binary goes (default ~/.cache/kstate/gobin)
#   KSTATE_MINIO_PORT     S3 port (default 9000; the console uses PORT+1)
#   KSTATE_MINIO_DATA     data dir, wiped on start (default /tmp/kstate-minio-<port>)
#   KSTATE_S3_BUCKET      bucket made at start (default kstate-test)
set -euo pipefail

VERSION=${KSTATE_MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}
BIN_DIR=${KSTATE_MINIO_BIN:-$HOME/.cache/kstate/gobin}
BIN=$BIN_DIR/minio
PORT=${KSTATE_MINIO_PORT:-9000}
DATA=${KSTATE_MINIO_DATA:-/tmp/kstate-minio-$PORT}
BUCKET=${KSTATE_S3_BUCKET:-kstate-test}
USER_NAME=kstate
PASSWORD=kstate-secret
ENDPOINT=http://127.0.0.1:$PORT
PID_FILE=$DATA.pid
LOG=$DATA.log

log() { echo "minio.sh: $*" >&2; }

install() {
    [[ -x $BIN ]] && return 0
    command -v go >/dev/null 2>&1 || { log "go is needed to build MinIO (Debian: apt-get install golang)"; exit 1; }
    log "building MinIO $VERSION from the Go module proxy into $BIN_DIR (a few minutes, once)"
    mkdir -p "$BIN_DIR"
    GOBIN=$BIN_DIR GOFLAGS=-mod=mod go install "github.com/minio/minio@$VERSION" >&2
}

running() {
    [[ -f $PID_FILE ]] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null
}

launch() {
    mkdir -p "$DATA"
    MINIO_ROOT_USER=$USER_NAME MINIO_ROOT_PASSWORD=$PASSWORD MINIO_BROWSER=off \
        setsid "$BIN" server --quiet --address "127.0.0.1:$PORT" --console-address "127.0.0.1:$((PORT + 1))" "$DATA" \
        >"$LOG" 2>&1 </dev/null &
    echo $! >"$PID_FILE"
    local i
    for i in $(seq 1 300); do
        if curl -fsS "$ENDPOINT/minio/health/live" >/dev/null 2>&1; then
            return 0
        fi
        running || { log "MinIO exited; its log:"; tail -n 30 "$LOG" >&2; exit 1; }
        sleep 0.1
    done
    log "MinIO did not answer within 30 s; its log:"
    tail -n 30 "$LOG" >&2
    exit 1
}

make_bucket() {
    # A signed S3 CreateBucket request (curl's SigV4); 409: it exists.
    local code
    code=$(curl -sS -o /dev/null -w '%{http_code}' -X PUT --aws-sigv4 "aws:amz:us-east-1:s3" \
        --user "$USER_NAME:$PASSWORD" "$ENDPOINT/$BUCKET")
    [[ $code == 200 || $code == 409 ]] || { log "creating bucket $BUCKET answered HTTP $code"; exit 1; }
}

stop() {
    running || { rm -f "$PID_FILE"; return 0; }
    local pid
    pid=$(cat "$PID_FILE")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$PID_FILE"; return 0; }
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$PID_FILE"
}

case ${1:-} in
    install) install ;;
    start)
        install
        stop
        rm -rf "$DATA"
        launch
        make_bucket
        log "MinIO at $ENDPOINT, bucket $BUCKET (log: $LOG)"
        echo "$ENDPOINT"
        ;;
    restart)
        running || launch
        echo "$ENDPOINT"
        ;;
    status) running ;;
    stop) stop ;;
    kill)
        if running; then kill -KILL "$(cat "$PID_FILE")" 2>/dev/null || true; fi
        rm -f "$PID_FILE"
        ;;
    env)
        printf 'KSTATE_S3_ENDPOINT=%q\nKSTATE_S3_BUCKET=%q\nAWS_ACCESS_KEY_ID=%q\nAWS_SECRET_ACCESS_KEY=%q\nAWS_REGION=us-east-1\nAWS_ALLOW_HTTP=true\n' \
            "$ENDPOINT" "$BUCKET" "$USER_NAME" "$PASSWORD"
        ;;
    *)
        sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2
        exit 2
        ;;
esac
