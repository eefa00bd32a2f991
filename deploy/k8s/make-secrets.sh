#!/usr/bin/env bash
# Make a cluster's secret material into DIR (default: the dev overlay's
# secrets/, which its secretGenerator reads; never committed):
#   cluster_secret, admin_token    32 random bytes each, base64, as compose's
#   ca.crt, ca.key                 a CA for this cluster alone
#   ROLE.crt, ROLE.key             per role (control, router, agent): an EC P-256
#                                  key and a certificate for server and client
#                                  use, named for the role's Service in the
#                                  namespace (NAMESPACE, default llmgw)
# Existing files are kept, so running it again changes nothing. For production
# use your own PKI (or cert-manager) and create the Secrets yourself
# (docs/deploy.md); the private CA key stays out of the cluster here too.
set -euo pipefail
dir=${1:-"$(dirname "$0")/overlays/dev/secrets"}
ns=${NAMESPACE:-llmgw}
days=${DAYS:-365}
mkdir -p "$dir"
cd "$dir"
umask 077

for name in cluster_secret admin_token; do
  [ -s "$name" ] || head -c 32 /dev/urandom | base64 > "$name"
done

if [ ! -s ca.crt ]; then
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout ca.key -out ca.crt \
    -days "$days" -subj "/CN=llmgw-$ns-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi

for role in control router agent; do
  [ -s "$role.crt" ] && continue
  sans="DNS:$role,DNS:$role.$ns,DNS:$role.$ns.svc,DNS:$role.$ns.svc.cluster.local"
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 -keyout "$role.key" -out "$role.csr" \
    -subj "/CN=$role" 2>/dev/null
  openssl x509 -req -in "$role.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$role.crt" -days "$days" \
    -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=critical,digitalSignature\n' "$sans") \
    2>/dev/null
  rm -f "$role.csr"
done
rm -f ca.srl
echo "secrets in $dir"
