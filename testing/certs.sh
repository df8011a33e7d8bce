#!/usr/bin/env bash
# Test certificates for the kstate test broker (testing/kafka.sh calls this
# before every start). Idempotent: an existing, complete set is left alone, so
# the files (and what a client has cached of them) stay the same across broker
# starts; a missing or partial set is generated again from scratch.
#
#   bash testing/certs.sh DIR      # ensure the set exists in DIR
#
# DIR then holds (all PEM, EC P-256 keys in unencrypted PKCS#8 unless noted,
# certificates valid 10 years):
#   ca.pem, ca.key                  the test CA the broker trusts
#   broker.pem, broker.key          broker certificate (chain: broker + CA),
#                                   SAN DNS:localhost, IP:127.0.0.1
#   broker-keystore.pem             broker.key + broker.pem in one file
#                                   (Kafka's ssl.keystore.type=PEM location)
#   client.pem, client.key          client certificate (CN=kstate-client) signed
#                                   by the test CA: passes ssl.client.auth=required
#   client-encrypted.key            client.key as encrypted PKCS#8 (PBES2,
#                                   AES-256-CBC), password kstate-key-pass
#   untrusted-ca.pem, untrusted-ca.key          a second CA the broker does NOT trust
#   untrusted-client.pem, untrusted-client.key  client certificate signed by it
#                                   (CN=kstate-untrusted-client): must be rejected
#   openssl.cnf                     the extensions used
set -euo pipefail

# Bump when the set changes (files, extensions, key type): older sets are then
# generated again instead of being reused.
TLS_VERSION=kstate-tls-1
DAYS=3650
KEY_PASS=kstate-key-pass

log() { echo "certs.sh: $*" >&2; }
die() { echo "certs.sh: error: $*" >&2; exit 1; }

[[ $# == 1 && -n $1 ]] || die "usage: bash testing/certs.sh DIR"
DIR=$1
MARKER=$DIR/.complete

complete() { [[ -f $MARKER && $(cat "$MARKER" 2>/dev/null) == "$TLS_VERSION" ]]; }
complete && exit 0

# Serialise runs on one DIR (two brokers sharing KSTATE_KAFKA_TLS_DIR), then
# look again: the other run may have made the set meanwhile.
mkdir -p "$(dirname "$DIR")"
exec 9>"$DIR.lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi
complete && exit 0
# DIR is replaced as a whole below: never a directory with files of someone
# else's (only ours, recognised by the marker, possibly of an older version).
if [[ -d $DIR && -n $(ls -A "$DIR" 2>/dev/null) && ! -f $MARKER ]]; then
    die "$DIR exists, is not empty and holds no certificates made by this script; refusing to replace it"
fi
command -v openssl >/dev/null 2>&1 ||
    die "openssl not found; it is needed to make the test certificates (Debian: apt-get install -y openssl)"

# Build in a sibling directory and rename it into place, so a run killed
# half-way never leaves a set that looks complete.
tmp=$DIR.new.$$
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
mkdir -p "$tmp"
chmod 700 "$tmp"

# `req` needs a [req] section even with -subj; the *_ext sections are passed
# explicitly, so OpenSSL's system config (v3_ca for every `req -x509`) is
# never mixed in.
cat >"$tmp/openssl.cnf" <<'EOF'
[req]
distinguished_name = dn
prompt = no
[dn]
[ca_ext]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth,clientAuth
subjectAltName = DNS:localhost,IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client_ext]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOF

# EC P-256: a few ms per key (RSA-2048 is ~0.15 s each), and Kafka's PEM
# keystore loads RSA, DSA and EC PKCS#8 keys. `genpkey` writes PKCS#8
# ("BEGIN PRIVATE KEY"), the only unencrypted form Kafka's PEM loader reads.
newkey() {
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$tmp/$1" 2>/dev/null
}

# Random 128-bit serials: no ca.srl bookkeeping, and no two certificates of
# one CA share a serial.
serial() { echo "0x$(openssl rand -hex 16)"; }

# $1 = name, $2 = subject
make_ca() {
    newkey "$1.key"
    openssl req -x509 -new -config "$tmp/openssl.cnf" -extensions ca_ext \
        -key "$tmp/$1.key" -subj "$2" -days "$DAYS" -sha256 -set_serial "$(serial)" \
        -out "$tmp/$1.pem" 2>/dev/null
}

# $1 = name, $2 = subject, $3 = issuing CA name, $4 = extension section
make_cert() {
    newkey "$1.key"
    openssl req -new -config "$tmp/openssl.cnf" -key "$tmp/$1.key" -subj "$2" \
        -out "$tmp/$1.csr" 2>/dev/null
    openssl x509 -req -in "$tmp/$1.csr" -CA "$tmp/$3.pem" -CAkey "$tmp/$3.key" \
        -set_serial "$(serial)" -days "$DAYS" -sha256 \
        -extfile "$tmp/openssl.cnf" -extensions "$4" -out "$tmp/$1.pem" 2>/dev/null
    rm -f "$tmp/$1.csr"
}

make_ca ca "/O=kstate tests/CN=kstate test CA"
make_cert broker "/O=kstate tests/CN=localhost" ca server_ext
make_cert client "/O=kstate tests/CN=kstate-client" ca client_ext
make_ca untrusted-ca "/O=kstate tests/CN=kstate untrusted test CA"
make_cert untrusted-client "/O=kstate tests/CN=kstate-untrusted-client" untrusted-ca client_ext

# Full chain in broker.pem: clients that trust only ca.pem need nothing else,
# and the chain is what a real deployment sends.
cat "$tmp/ca.pem" >>"$tmp/broker.pem"
cat "$tmp/broker.key" "$tmp/broker.pem" >"$tmp/broker-keystore.pem"
openssl pkcs8 -topk8 -v2 aes-256-cbc -in "$tmp/client.key" \
    -passout "pass:$KEY_PASS" -out "$tmp/client-encrypted.key" 2>/dev/null

# Self-check, so a broken set fails here and not as a TLS error in a test.
openssl verify -CAfile "$tmp/ca.pem" "$tmp/broker.pem" "$tmp/client.pem" >/dev/null ||
    die "generated certificates do not verify against ca.pem"
if openssl verify -CAfile "$tmp/ca.pem" "$tmp/untrusted-client.pem" >/dev/null 2>&1; then
    die "untrusted-client.pem verifies against ca.pem"
fi

chmod 600 "$tmp"/*.key "$tmp/broker-keystore.pem"
echo "$TLS_VERSION" >"$tmp/.complete"
rm -rf "$DIR"
mv "$tmp" "$DIR"
trap - EXIT
log "generated test CA and certificates in $DIR"
