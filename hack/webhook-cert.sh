#!/usr/bin/env bash
# webhook-cert.sh DIR [SERVICE [NAMESPACE]] — a self-signed CA and the
# webhook serving certificate it signs, for installs without cert-manager
# (config/certs-selfsigned). Writes DIR/ca.crt, DIR/tls.crt and DIR/tls.key
# (mode 0600); the CA's key is thrown away, so nothing else can ever be
# signed with it. The certificate names SERVICE.NAMESPACE.svc and
# SERVICE.NAMESPACE.svc.cluster.local (default: config/default's webhook
# Service, proxy-operator-webhook-service in proxy-operator-system) and is
# valid for DAYS days (environment, default 365). Existing files are
# replaced: run it again to renew, then apply again. Needs openssl.
set -euo pipefail

DIR=${1:?usage: webhook-cert.sh DIR [SERVICE [NAMESPACE]]}
SERVICE=${2:-proxy-operator-webhook-service}
NAMESPACE=${3:-proxy-operator-system}
DAYS=${DAYS:-365}
command -v openssl >/dev/null || {
	echo "webhook-cert.sh: openssl is required" >&2
	exit 1
}
[ -d "$DIR" ] || {
	echo "webhook-cert.sh: $DIR is not a directory" >&2
	exit 1
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
umask 077
openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
	-keyout "$work/ca.key" -out "$work/ca.crt" -days "$DAYS" \
	-subj "/CN=proxy-operator webhook CA" 2>/dev/null
openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
	-keyout "$work/tls.key" -out "$work/tls.csr" -subj "/CN=$SERVICE.$NAMESPACE.svc" 2>/dev/null
printf '%s\n' \
	'basicConstraints = critical, CA:FALSE' \
	'keyUsage = critical, digitalSignature, keyEncipherment' \
	'extendedKeyUsage = serverAuth' \
	"subjectAltName = DNS:$SERVICE.$NAMESPACE.svc, DNS:$SERVICE.$NAMESPACE.svc.cluster.local" >"$work/ext"
openssl x509 -req -in "$work/tls.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial \
	-days "$DAYS" -extfile "$work/ext" -out "$work/tls.crt" 2>/dev/null
install -m 0644 "$work/ca.crt" "$DIR/ca.crt"
install -m 0644 "$work/tls.crt" "$DIR/tls.crt"
install -m 0600 "$work/tls.key" "$DIR/tls.key"
echo "webhook-cert.sh: $DIR/{ca.crt,tls.crt,tls.key} for $SERVICE.$NAMESPACE.svc, valid $DAYS days" >&2
