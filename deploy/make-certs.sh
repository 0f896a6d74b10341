#!/bin/sh
# Certificates for a fedspeech fleet, made with openssl: a CA of the fleet's own, one server certificate
# for Mosquitto's TLS listener and the coordinator's HTTPS, and one client certificate per device.
#
#   deploy/make-certs.sh OUTDIR [--host NAME_OR_IP]... [--device ID]... [--days N] [--renew] [--new-ca]
#
#   OUTDIR/ca.crt                      the CA: copy it to every device (--broker-ca, --coordinator-ca)
#   OUTDIR/ca.key                      the CA's key, which signs every certificate: keep it private
#   OUTDIR/server.crt, server.key      for Mosquitto and `fedspeech coordinator --tls-cert/--tls-key`;
#                                      valid for localhost, 127.0.0.1 and every --host
#   OUTDIR/devices/ID.crt, ID.key      a device's client certificate (--broker-cert/--broker-key)
#
# Keys are ECDSA P-256 (which Mosquitto, Python's ssl and browsers all accept), mode 0600.
# Files that exist are kept: run it again with another --device to add a device. --renew re-issues the
# server certificate (give every --host again) and the named devices' certificates. The CA is never
# replaced unless --new-ca is given; that also re-issues the server certificate and the named devices'.
set -eu

usage() {
    echo "usage: $0 OUTDIR [--host NAME_OR_IP]... [--device ID]... [--days N] [--renew] [--new-ca]" >&2
    exit 2
}

case ${1:-} in
    -h | --help) sed -n '2,/^set -eu/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    -* | "") usage ;;
esac
out=$1
shift
hosts="localhost 127.0.0.1"
devices=""
days=825
renew=false
new_ca=false
while [ $# -gt 0 ]; do
    case $1 in
        --host)
            [ $# -ge 2 ] || usage
            case " $hosts " in *" $2 "*) ;; *) hosts="$hosts $2" ;; esac
            shift 2
            ;;
        --device) [ $# -ge 2 ] || usage; devices="$devices $2"; shift 2 ;;
        --days) [ $# -ge 2 ] || usage; days=$2; shift 2 ;;
        --renew) renew=true; shift ;;
        --new-ca) new_ca=true; renew=true; shift ;;
        *) usage ;;
    esac
done
case $days in '' | *[!0-9]*) echo "--days takes a number of days, got '$days'" >&2; exit 2 ;; esac
for device in $devices; do
    # The id names files and is the certificate's CN: the characters of a fedspeech device id.
    if ! printf '%s\n' "$device" | grep -Eqx '[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}'; then
        echo "bad device id '$device': letters, digits, '_', '.', '-', at most 64" >&2
        exit 2
    fi
done
for host in $hosts; do
    if ! printf '%s\n' "$host" | grep -Eqx '[A-Za-z0-9_.:-]{1,253}'; then
        echo "bad host '$host': a DNS name or an IP address" >&2
        exit 2
    fi
done

umask 077 # keys are made private from the start; certificates are opened up below
mkdir -p "$out/devices"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

new_key() {
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
    chmod 600 "$1"
}

# issue NAME KEY CERT EXTENSIONS: a certificate for KEY, signed by the CA.
issue() {
    openssl req -new -key "$2" -subj "/CN=$1" -out "$work/request.csr"
    printf '%s\n' "$4" >"$work/extensions.cnf"
    openssl x509 -req -in "$work/request.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
        -set_serial "0x$(openssl rand -hex 16)" -days "$days" -sha256 \
        -extfile "$work/extensions.cnf" -out "$3" 2>/dev/null
    chmod 644 "$3"
    echo "made $3"
}

if [ -e "$out/ca.key" ] && [ "$new_ca" = false ]; then
    echo "kept $out/ca.crt (--new-ca replaces it)"
else
    new_key "$out/ca.key"
    openssl req -x509 -new -key "$out/ca.key" -subj "/CN=fedspeech fleet CA" -days 3650 -sha256 \
        -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -addext "subjectKeyIdentifier=hash" \
        -out "$out/ca.crt"
    chmod 644 "$out/ca.crt"
    echo "made $out/ca.crt"
    renew=true # certificates of an earlier CA would not verify
fi

leaf_extensions="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid"

if [ -e "$out/server.crt" ] && [ "$renew" = false ]; then
    echo "kept $out/server.crt (--renew re-issues it): $(openssl x509 -in "$out/server.crt" -noout -ext subjectAltName | sed -n 's/^ *//; 2p')"
else
    names=""
    for host in $hosts; do
        case $host in
            *[!0-9.]* | "") case $host in *:*) kind=IP ;; *) kind=DNS ;; esac ;;
            *) kind=IP ;;
        esac
        names="$names${names:+,}$kind:$host"
    done
    new_key "$out/server.key"
    issue "fedspeech server" "$out/server.key" "$out/server.crt" "$leaf_extensions
extendedKeyUsage=serverAuth
subjectAltName=$names"
fi

for device in $devices; do
    if [ -e "$out/devices/$device.crt" ] && [ "$renew" = false ]; then
        echo "kept $out/devices/$device.crt"
        continue
    fi
    new_key "$out/devices/$device.key"
    issue "$device" "$out/devices/$device.key" "$out/devices/$device.crt" "$leaf_extensions
extendedKeyUsage=clientAuth"
done
