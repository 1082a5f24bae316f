# Common settings for scripts/kubernetes/*.sh (sourced, not run).
# Everything built lives in the cache (outside the checkout); everything a running
# cluster needs lives in the state dir. Nothing is installed system-wide.
K8S_VERSION=1.37.2                 # k8s.io/kubernetes; staging modules are v0.37.2
LPP_VERSION=v0.0.30                # github.com/rancher/local-path-provisioner
CACHE_ROOT=${SANDWAKE_K8S_CACHE:-$HOME/.cache/sandwake/kubernetes}
VC=$CACHE_ROOT/v$K8S_VERSION       # per-version cache
BIN=$VC/bin                        # kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl local-path-provisioner
IMAGES=$VC/images                  # pause.tar hello.tar busybox.tar (docker-archive tarballs)
HOSTROOT=$VC/root                  # Debian .debs extracted here (etcd, CNI plugins, busybox)
STATE=${SANDWAKE_K8S_STATE:-/tmp/sandwake-k8s}
KUBECONFIG_OUT=$STATE/admin.kubeconfig
PIDS=$STATE/run/pids
LOGS=$STATE/logs
CRI_SOCK=$STATE/run/containerd/containerd.sock
NODE_NAME=${SANDWAKE_K8S_NODE:-sandwake-k8s-node}
BRIDGE=${SANDWAKE_K8S_BRIDGE:-swk8s0}          # at most 15 characters
POD_CIDR=${SANDWAKE_K8S_POD_CIDR:-10.244.77.0/24}
# ports off the usual ones so a test cluster never collides with other etcd/k8s on the machine
ETCD_PORT=${SANDWAKE_K8S_ETCD_PORT:-12379}
ETCD_PEER_PORT=$((ETCD_PORT + 1))
APISERVER_PORT=${SANDWAKE_K8S_APISERVER_PORT:-16443}
KCM_PORT=20257 SCHED_PORT=20259 KUBELET_PORT=20250 KUBELET_HEALTHZ_PORT=20248
FWD_COMMENT="sandwake-k8s-$BRIDGE"
IMG_PAUSE=sandwake.local/k8s-pause:1
IMG_HELLO=sandwake.local/k8s-hello:1
IMG_BUSYBOX=sandwake.local/k8s-busybox:1

K8S_COMPONENTS="kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl"
_T0=$(date +%s.%N)
ts() { printf '[%6.1fs] %s\n' "$(echo "$(date +%s.%N) - $_T0" | bc)" "$*" >&2; }
elapsed() { echo "$(date +%s.%N) - $1" | bc | awk '{printf "%.2f", $1}'; }
# running PID: a zombie counts as gone (PID 1 on these VMs reaps orphans only every second or two)
running() { local st; st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) && [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]; }
alive() { local pid _; [ -f "$PIDS/$1.pid" ] && read -r pid _ < "$PIDS/$1.pid" && [ -n "$pid" ] && running "$pid"; }
