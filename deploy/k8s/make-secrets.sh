#!/usr/bin/env bash
# Make a cluster's secret material, and the kustomize Component that turns it
# into the Secrets the manifests mount:
#
#   deploy/k8s/make-secrets.sh [--dir DIR] NODE...
#
# NODE: the Kubernetes names of the nodes agents run on (`kubectl get nodes`);
# each gets its own certificate. DIR (default: the dev overlay's secrets/,
# which git ignores and the dev overlay includes) receives
#   cluster_secret, admin_token    32 random bytes each, base64
#   ca.crt, ca.key                 the cluster CA (`llmgw certs ca`); ca.key goes in no Secret
#   control-control.crt/.key       the control planes' certificate (llmgw://control/control, DNS llmgw-control)
#   router-router.crt/.key         the routers' (llmgw://router/router)
#   node-NODE.crt/.key             each node's (llmgw://node/NODE)
#   admin-USER.crt/.key            yours, for the CLI: LLMGW_TLS_DIR=DIR llmgw status
#   kustomization.yaml             the Component: llmgw-secrets, llmgw-tls-control,
#                                  llmgw-tls-router, llmgw-tls-nodes (every node-*.crt in DIR)
# Existing files are kept: run it again with a new node to add that node.
# Production brings its own PKI and creates the Secrets itself (docs/deploy.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=$here/overlays/dev/secrets
if [ "${1:-}" = "--dir" ]; then
  dir=$2
  shift 2
fi
llmgw=${LLMGW:-$(command -v llmgw || echo "$here/../../.venv/bin/llmgw")}
[ -x "$llmgw" ] || { echo "make-secrets: llmgw is not installed; run make setup" >&2; exit 2; }

mkdir -p "$dir"
cd "$dir"
umask 077
for name in cluster_secret admin_token; do
  [ -s "$name" ] || head -c 32 /dev/urandom | base64 > "$name"
done
[ -s ca.crt ] || "$llmgw" certs ca --dir . --cluster llmgw >/dev/null
issue() {  # ROLE NAME
  [ -s "$1-$2.crt" ] || "$llmgw" certs issue "$1" "$2" --dir . >/dev/null
}
issue control control
issue router router
issue admin "${USER:-admin}"
for node in "$@"; do
  issue node "$node"
done

# Node certificates carry no host: the control plane then lets a node publish
# only the address it connects from, its pod's IP, which is what the agent
# advertises (--advertise-host $(POD_IP)).
nodes=""
names=""
for crt in node-*.crt; do
  [ -e "$crt" ] || continue
  node=${crt#node-}
  node=${node%.crt}
  nodes="$nodes, $node.crt=$crt, $node.key=node-$node.key"
  names="$names $node"
done
[ -n "$nodes" ] || echo "make-secrets: no node certificates yet; name the nodes: $0 NODE..." >&2

cat > kustomization.yaml <<EOF
# Made by deploy/k8s/make-secrets.sh from the files beside it; never committed.
apiVersion: kustomize.config.k8s.io/v1alpha1
kind: Component
secretGenerator:
  - name: llmgw-secrets
    files: [cluster_secret, admin_token]
  - name: llmgw-tls-control
    type: kubernetes.io/tls
    files: [tls.crt=control-control.crt, tls.key=control-control.key, ca.crt]
  - name: llmgw-tls-router
    type: kubernetes.io/tls
    files: [tls.crt=router-router.crt, tls.key=router-router.key, ca.crt]
  - name: llmgw-tls-nodes
    files: [ca.crt$nodes]
EOF
echo "secrets in $dir; nodes:${names:- none}"
