#!/usr/bin/env bash
# certs.sh DIR NODE_NAME NODE_IP APISERVER_PORT: CA, apiserver serving cert, one client cert
# per component, service-account key pair and kubeconfigs under DIR/pki and DIR/kubeconfig.
# ECDSA P-256 keys: the whole set takes a fraction of a second, so up.sh makes a fresh one
# per cluster. Existing files are kept.
set -euo pipefail
DIR=${1:?state dir}; NODE=${2:?node name}; NODE_IP=${3:?node ip}; PORT=${4:?apiserver port}
P=$DIR/pki; K=$DIR/kubeconfig
mkdir -p "$P" "$K"; chmod 700 "$P" "$K"; cd "$P"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; chmod 600 "$1"; }
[ -f ca.crt ] || { key ca.key; openssl req -x509 -new -key ca.key -out ca.crt -days 3650 -subj "/CN=sandwake-k8s-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null; }
[ -f sa.key ] || { key sa.key; openssl pkey -in sa.key -pubout -out sa.pub 2>/dev/null; }
cert() { # name CN O extendedKeyUsage [subjectAltName]
  local name=$1 cn=$2 o=$3 usage=$4 sans=${5:-}
  [ -f "$name.crt" ] && return 0
  local ext; ext=$(mktemp)
  { echo "basicConstraints=CA:FALSE"; echo "keyUsage=critical,digitalSignature,keyEncipherment"; echo "extendedKeyUsage=$usage"
    [ -n "$sans" ] && echo "subjectAltName=$sans"; } > "$ext"
  local subj="/CN=$cn"; [ -n "$o" ] && subj="/O=$o/CN=$cn"
  key "$name.key"
  openssl req -new -key "$name.key" -out "$name.csr" -subj "$subj" 2>/dev/null
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$name.crt" -days 3650 -extfile "$ext" 2>/dev/null
  rm -f "$name.csr" "$ext"
}
cert apiserver kube-apiserver "" serverAuth "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:10.96.0.1,IP:$NODE_IP"
cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters clientAuth
cert admin kubernetes-admin system:masters clientAuth
cert kcm system:kube-controller-manager "" clientAuth
cert scheduler system:kube-scheduler "" clientAuth
cert kubelet "system:node:$NODE" system:nodes clientAuth
cert kubelet-serving "$NODE" "" serverAuth "DNS:$NODE,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP"
kc() { # name user
  local name=$1 user=$2
  umask 077
  cat > "$K/$name.conf" <<KC
apiVersion: v1
kind: Config
clusters:
- name: sandwake-k8s
  cluster:
    server: https://127.0.0.1:$PORT
    certificate-authority-data: $(base64 -w0 "$P/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(base64 -w0 "$P/$name.crt")
    client-key-data: $(base64 -w0 "$P/$name.key")
contexts:
- name: sandwake-k8s
  context: {cluster: sandwake-k8s, user: $user}
current-context: sandwake-k8s
KC
}
kc admin kubernetes-admin; kc kcm system:kube-controller-manager; kc scheduler system:kube-scheduler; kc kubelet "system:node:$NODE"
