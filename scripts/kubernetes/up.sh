#!/usr/bin/env bash
# Start a real single-node Kubernetes v1.37.2 for sandwake's tests: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, a PRIVATE containerd (own config, root,
# state, socket; never Docker's) and rancher's local-path-provisioner (StorageClass
# "local-path", the default). Nothing is pulled: images are imported from local tarballs
# and every image reference must use imagePullPolicy: Never (pulls go to 127.0.0.1:9).
#
# Binaries come from build.sh's cache; etcd, CNI plugins and busybox are Debian packages
# fetched with apt-get download and extracted into the cache (nothing installed).
# All runtime state is under $SANDWAKE_K8S_STATE (default /tmp/sandwake-k8s).
# Prints the admin kubeconfig path ($STATE/admin.kubeconfig) on stdout; $STATE/env holds
# the other facts tests need (kubectl path, containerd socket, bridge, images).
# Idempotent: when the cluster is already up it says so and exits 0. A failed start is
# cleaned up with down.sh (SANDWAKE_K8S_KEEP_ON_FAIL=1 keeps it for debugging).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
[ "$(id -u)" = 0 ] || { echo "up.sh: must run as root (kubelet, containerd, CNI)" >&2; exit 1; }
T0=$(date +%s.%N)
K="$BIN/kubectl --kubeconfig $KUBECONFIG_OUT"
CTR="ctr -a $CRI_SOCK -n k8s.io"

mkdir -p "$STATE"
exec 8<"$STATE"                 # one up/down at a time per state dir
flock -w 600 8 || { echo "up.sh: $STATE is locked by another up.sh/down.sh" >&2; exit 1; }

ALL="containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet local-path-provisioner"
if [ -f "$STATE/run/up-ok" ]; then
  ok=1; for n in $ALL; do alive "$n" || ok=; done
  if [ -n "$ok" ] && $K get --raw /readyz >/dev/null 2>&1; then
    ts "already up (state $STATE)"
    echo "$KUBECONFIG_OUT"; exit 0
  fi
fi
if [ -n "$(ls -A "$STATE" 2>/dev/null)" ]; then
  ts "stale or partial state in $STATE: cleaning it with down.sh first"
  flock -u 8; "$HERE/down.sh" >&2; mkdir -p "$STATE"; exec 8<"$STATE"; flock 8
fi

on_exit() {
  local rc=$?
  [ $rc = 0 ] && return
  ts "up.sh FAILED (exit $rc); last log lines:"
  for f in "$LOGS"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 15 "$f" >&2; }; done
  if [ -z "${SANDWAKE_K8S_KEEP_ON_FAIL:-}" ]; then flock -u 8; "$HERE/down.sh" >&2 || true; fi
}
trap on_exit EXIT

# ---- 0. binaries and images (no-op when built), Debian packages (extracted, not installed)
"$HERE/build.sh"
if [ ! -x "$HOSTROOT/usr/lib/cni/bridge" ] || [ ! -x "$HOSTROOT/usr/bin/etcd" ] || [ ! -x "$HOSTROOT/bin/busybox" ]; then
  ts "fetching Debian packages (apt-get download + dpkg-deb -x into $HOSTROOT)"
  rm -rf "$VC/debs"; mkdir -p "$VC/debs" "$HOSTROOT"
  pkgs="containernetworking-plugins etcd-server busybox-static"
  (cd "$VC/debs" && apt-get download $pkgs >/dev/null 2>&1) ||
    { apt-get update -qq >/dev/null && (cd "$VC/debs" && apt-get download $pkgs >/dev/null); }
  for f in "$VC"/debs/*.deb; do dpkg-deb -x "$f" "$HOSTROOT"; done
fi
if [ ! -f "$IMAGES/busybox.tar" ]; then
  cp "$HOSTROOT/bin/busybox" "$IMAGES/busybox"
  LINKS="sh mkdir rm" "$HERE/mkimage.sh" "$IMG_BUSYBOX" "$IMAGES/busybox" "$IMAGES/busybox.tar" >/dev/null
  rm -f "$IMAGES/busybox"
fi
ETCD=$HOSTROOT/usr/bin/etcd
CNI_BIN=$HOSTROOT/usr/lib/cni

NODE_IP=${SANDWAKE_K8S_NODE_IP:-$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')}
[ -n "$NODE_IP" ] || NODE_IP=$(ip -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1 | head -1)
[ -n "$NODE_IP" ] || { echo "up.sh: no global IPv4 address for the node (set SANDWAKE_K8S_NODE_IP)" >&2; exit 1; }
r=$(ip -4 route get "${POD_CIDR%/*}" 2>/dev/null || true)   # must not be a local or on-link network other than ours
if [ -n "$r" ] && ! echo "$r" | grep -q " via " && ! echo "$r" | grep -q "dev $BRIDGE "; then
  echo "up.sh: pod CIDR $POD_CIDR collides with a network on this machine ($r); set SANDWAKE_K8S_POD_CIDR" >&2; exit 1
fi

# another cluster (or anything else) on our bridge or ports: refuse before touching anything
if ip link show "$BRIDGE" >/dev/null 2>&1; then
  echo "up.sh: network interface $BRIDGE already exists (another test cluster? set SANDWAKE_K8S_BRIDGE)" >&2; exit 1
fi
# trap: the kubelet's device-plugin socket is always /var/lib/kubelet/device-plugins/kubelet.sock
# (whatever --root-dir says) and the kubepods cgroups are global: one kubelet per machine
if ss -Hlx | grep -q '/var/lib/kubelet/device-plugins/kubelet.sock'; then
  echo "up.sh: another kubelet is running on this machine (/var/lib/kubelet/device-plugins/kubelet.sock); one per machine" >&2; exit 1
fi
for port in $ETCD_PORT $ETCD_PEER_PORT $APISERVER_PORT $KCM_PORT $SCHED_PORT $KUBELET_PORT $KUBELET_HEALTHZ_PORT; do
  if ss -Hltn "sport = :$port" | grep -q .; then
    echo "up.sh: TCP port $port is already in use (another test cluster? see SANDWAKE_K8S_*_PORT in lib.sh)" >&2; exit 1
  fi
done

ETC=$STATE/etc VAR=$STATE/var RUN=$STATE/run
mkdir -p "$LOGS" "$PIDS" "$ETC/cni/net.d" "$ETC/containerd" "$ETC/lpp" "$RUN/containerd" \
  "$VAR"/{etcd,kubelet,pod-logs,cni/networks,kubelet-plugins/volume/exec,lpp}
chmod 700 "$VAR/etcd"
# certs only depend on node name, IP and port: made once per combination in the cache
PKI_CACHE=$CACHE_ROOT/pki/$NODE_NAME-$NODE_IP-$APISERVER_PORT
[ -f "$PKI_CACHE/kubeconfig/kubelet.conf" ] || { rm -rf "$PKI_CACHE"; "$HERE/certs.sh" "$PKI_CACHE" "$NODE_NAME" "$NODE_IP" "$APISERVER_PORT"; }
cp -a "$PKI_CACHE/pki" "$PKI_CACHE/kubeconfig" "$STATE/"
cp "$STATE/kubeconfig/admin.conf" "$KUBECONFIG_OUT"; chmod 600 "$KUBECONFIG_OUT"

# ---- host state the kubelet, containerd and CNI change: recorded once, restored by down.sh
if [ ! -f "$RUN/host-state" ]; then
  { for k in vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys \
             kernel.keys.root_maxbytes net.ipv4.ip_forward net.ipv6.conf.all.forwarding \
             net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables; do
      v=$(sysctl -n "$k" 2>/dev/null) && echo "sysctl $k $v"; done
    for d in /var/lib/cni /var/log/pods /var/log/containers /var/lib/kubelet /run/containerd/runc /run/netns /etc/kubernetes; do
      [ -e "$d" ] && echo "existed $d"; done
    for n in $(ls /run/netns 2>/dev/null); do echo "netns $n"; done
    for t in filter nat mangle raw; do
      for c in $(iptables -t $t -S 2>/dev/null | awk '$1=="-N" && $2 ~ /^KUBE-/ {print $2}'); do echo "chain4 $t $c"; done
      for c in $(ip6tables -t $t -S 2>/dev/null | awk '$1=="-N" && $2 ~ /^KUBE-/ {print $2}'); do echo "chain6 $t $c"; done
    done
    for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do [ -d "${h}kubepods" ] && echo "cgroup ${h}kubepods"; done
  } > "$RUN/host-state"
fi

start() { # name exe args...   (setsid execs in place: the recorded PID is the daemon's)
  local name=$1; shift
  # 8<&-: the daemons must not inherit the lock's fd, or they would hold the lock for life
  setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null 8<&- &
  echo "$! $1" > "$PIDS/$name.pid"
  ts "started $name (pid $!)"
}
waitfor() { # desc timeout-seconds cmd...
  local desc=$1 to=$2; shift 2; local end; end=$(( $(date +%s) + to ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || { ts "TIMEOUT ($to s) waiting for $desc"; return 1; }
    sleep 0.2
  done
  ts "$desc ok"
}

# ---- 1. containerd: our own instance
cat > "$ETC/containerd/config.toml" <<EOF
# sandwake test cluster's own containerd (never Docker's): config, root, state, socket here
version = 2
root = "$VAR/containerd"
state = "$RUN/containerd"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "$CRI_SOCK"
[ttrpc]
  address = "$CRI_SOCK.ttrpc"
[debug]
  address = ""
  level = "info"
[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$VAR/containerd-opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "$IMG_PAUSE"
    disable_apparmor = true
    enable_selinux = false
    max_container_log_line_size = 16384
    # trap 1: no CAP_SYS_RESOURCE here, runc cannot lower oom_score_adj below its own
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          BinaryName = "/usr/sbin/runc"
          # trap 3: the default runc root is /run/containerd/runc/k8s.io
          Root = "$RUN/runc"
          SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "$CNI_BIN"
      conf_dir = "$ETC/cni/net.d"
      max_conf_num = 1
    [plugins."io.containerd.grpc.v1.cri".registry]
      # nothing is ever pulled; a pull would hit a closed local port (no DNS, no egress)
      [plugins."io.containerd.grpc.v1.cri".registry.mirrors."*"]
        endpoint = ["http://127.0.0.1:9"]
EOF
cat > "$ETC/cni/net.d/10-sandwake.conflist" <<EOF
{ "cniVersion": "0.4.0", "name": "sandwake-k8s",
  "plugins": [ { "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": { "type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "dataDir": "$VAR/cni/networks" } } ] }
EOF
start containerd /usr/bin/containerd --config "$ETC/containerd/config.toml"
waitfor "containerd" 30 ctr -a "$CRI_SOCK" version
"$HERE/import-image.sh" "$IMAGES/pause.tar" "$IMAGES/hello.tar" "$IMAGES/busybox.tar" >/dev/null
ts "images imported: $($CTR images ls -q | grep -c '^sandwake.local/')"

# ---- 2. etcd
start etcd "$ETCD" --name sandwake-k8s --data-dir "$VAR/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster "sandwake-k8s=http://127.0.0.1:$ETCD_PEER_PORT" --initial-cluster-state new \
  --listen-metrics-urls "" --logger zap --log-level warn
waitfor "etcd" 60 curl -sf "http://127.0.0.1:$ETCD_PORT/health"

# ---- 3. kube-apiserver
P=$STATE/pki KC=$STATE/kubeconfig
start kube-apiserver "$BIN/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
  --bind-address=127.0.0.1 --secure-port="$APISERVER_PORT" --advertise-address="$NODE_IP" \
  --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" --client-ca-file="$P/ca.crt" \
  --kubelet-client-certificate="$P/apiserver-kubelet-client.crt" --kubelet-client-key="$P/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types=InternalIP \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
  --service-cluster-ip-range=10.96.0.0/16 \
  --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
  --allow-privileged=true --profiling=false --v=1
waitfor "kube-apiserver /readyz" 180 curl -sf --cacert "$P/ca.crt" --cert "$P/admin.crt" --key "$P/admin.key" "https://127.0.0.1:$APISERVER_PORT/readyz"

# ---- 4. controller-manager, scheduler
start kube-controller-manager "$BIN/kube-controller-manager" \
  --kubeconfig="$KC/kcm.conf" --authentication-kubeconfig="$KC/kcm.conf" --authorization-kubeconfig="$KC/kcm.conf" \
  --bind-address=127.0.0.1 --secure-port="$KCM_PORT" --leader-elect=false \
  --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
  --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" \
  --use-service-account-credentials=true --service-cluster-ip-range=10.96.0.0/16 \
  --allocate-node-cidrs=false --profiling=false --v=1
start kube-scheduler "$BIN/kube-scheduler" \
  --kubeconfig="$KC/scheduler.conf" --authentication-kubeconfig="$KC/scheduler.conf" --authorization-kubeconfig="$KC/scheduler.conf" \
  --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" --leader-elect=false --profiling=false --v=1

# ---- 5. kubelet
cat > "$ETC/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $P/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $P/kubelet-serving.crt
tlsPrivateKeyFile: $P/kubelet-serving.key
cgroupDriver: cgroupfs
# trap 2: v1.35+ kubelets refuse cgroup v1 unless told otherwise
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$CRI_SOCK
imageServiceEndpoint: unix://$CRI_SOCK
podLogsDir: $VAR/pod-logs
volumePluginDir: $VAR/kubelet-plugins/volume/exec
resolvConf: /etc/resolv.conf
makeIPTablesUtilChains: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
serializeImagePulls: false
EOF
start kubelet "$BIN/kubelet" --config="$ETC/kubelet-config.yaml" --kubeconfig="$KC/kubelet.conf" \
  --root-dir="$VAR/kubelet" --cert-dir="$VAR/kubelet/pki" \
  --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --v=2
# trap 5: Docker's FORWARD policy is DROP and br_netfilter sends bridged frames through it;
# pod-to-pod on our bridge needs one ACCEPT rule (host-to-pod works without it)
iptables -C FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT -m comment --comment "$FWD_COMMENT" 2>/dev/null ||
  iptables -I FORWARD 1 -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT -m comment --comment "$FWD_COMMENT"

# ---- 6. local-path-provisioner (on the host, out of cluster; helper pods use busybox)
cat > "$ETC/lpp/config.json" <<EOF
{"nodePathMap":[{"node":"DEFAULT_PATH_FOR_NON_LISTED_NODES","paths":["$VAR/lpp"]}]}
EOF
cat > "$ETC/lpp/helperPod.yaml" <<EOF
apiVersion: v1
kind: Pod
metadata: {name: helper-pod}
spec:
  priorityClassName: system-node-critical
  containers:
  - {name: helper-pod, image: $IMG_BUSYBOX, imagePullPolicy: Never}
EOF
printf '#!/bin/sh\nset -eu\nmkdir -m 0777 -p "$VOL_DIR"\n' > "$ETC/lpp/setup"
printf '#!/bin/sh\nset -eu\nrm -rf "$VOL_DIR"\n' > "$ETC/lpp/teardown"
$K apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: local-path-storage}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local-path
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: rancher.io/local-path
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
EOF
$K -n local-path-storage create configmap local-path-config --from-file=config.json="$ETC/lpp/config.json" \
  --from-file=setup="$ETC/lpp/setup" --from-file=teardown="$ETC/lpp/teardown" \
  --from-file=helperPod.yaml="$ETC/lpp/helperPod.yaml" --dry-run=client -o yaml | $K apply -f - >/dev/null
waitfor "local-path-storage serviceaccount" 60 $K -n local-path-storage get serviceaccount default
start local-path-provisioner "$BIN/local-path-provisioner" start --config "$ETC/lpp/config.json" \
  --namespace local-path-storage --helper-image "$IMG_BUSYBOX" --kubeconfig "$KUBECONFIG_OUT" \
  --configmap-name local-path-config --helper-pod-file "$ETC/lpp/helperPod.yaml" --service-account-name default

nodeready() { [ "$($K get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; }
waitfor "node $NODE_NAME Ready" 180 nodeready
waitfor "default serviceaccount" 60 $K -n default get serviceaccount default
waitfor "kube-root-ca.crt configmap" 60 $K -n default get configmap kube-root-ca.crt
sleep 0.3; alive local-path-provisioner || { ts "local-path-provisioner exited"; exit 1; }

# One pod through to Ready and deleted: the CNI plugin makes the pod bridge
# with its gateway address at the first pod, and the tests need both from
# the start (kubetest.ForwardAPIServer reaches the API server from pods
# through the bridge's address); it also proves pods start and get an IP.
$K -n default run sandwake-warmup --image="$IMG_HELLO" --image-pull-policy=Never --restart=Never >/dev/null
podready() { [ "$($K -n default get pod sandwake-warmup -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; }
waitfor "warm-up pod Ready (pod network and $BRIDGE)" 120 podready
$K -n default delete pod sandwake-warmup --grace-period=1 --wait=false >/dev/null

cat > "$STATE/env" <<EOF
KUBECONFIG=$KUBECONFIG_OUT
SANDWAKE_K8S_BIN=$BIN
SANDWAKE_K8S_KUBECTL=$BIN/kubectl
SANDWAKE_K8S_CONTAINERD_SOCK=$CRI_SOCK
SANDWAKE_K8S_BRIDGE=$BRIDGE
SANDWAKE_K8S_POD_CIDR=$POD_CIDR
SANDWAKE_K8S_NODE=$NODE_NAME
SANDWAKE_K8S_NODE_IP=$NODE_IP
SANDWAKE_K8S_IMAGE_HELLO=$IMG_HELLO
SANDWAKE_K8S_IMAGE_BUSYBOX=$IMG_BUSYBOX
SANDWAKE_K8S_STORAGECLASS=local-path
EOF
echo "$K8S_VERSION" > "$RUN/up-ok"
ts "cluster v$K8S_VERSION up in $(elapsed "$T0") s; kubeconfig $KUBECONFIG_OUT"
echo "$KUBECONFIG_OUT"
