#!/usr/bin/env bash
# smoke.sh [RUNS]: checks a running test cluster (up.sh) end to end, timed:
#  1. RUNS times: a pod from a locally imported image (imagePullPolicy: Never) -> Ready ->
#     first HTTP answer at its pod IP (only after checking the IP is routed over the test
#     cluster's own CNI bridge) -> delete -> gone;
#  2. a PVC on local-path (dynamic provisioning) bound to a pod, data written through HTTP,
#     the pod deleted, a new pod on the same claim reads the data back; then claim deleted
#     and the PV and its directory reclaimed.
# Exits non-zero on any failure. Leaves no object behind.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
RUNS=${1:-1}
[ -f "$STATE/run/up-ok" ] || { echo "smoke.sh: the test cluster is not up (run up.sh)" >&2; exit 1; }
export KUBECONFIG=$KUBECONFIG_OUT
K="$BIN/kubectl"
NS=sandwake-smoke-$$
now() { date +%s.%N; }
cleanup() { $K delete namespace "$NS" --wait=false >/dev/null 2>&1 || true; }
trap cleanup EXIT
$K create namespace "$NS" >/dev/null
until $K -n "$NS" get serviceaccount default >/dev/null 2>&1; do sleep 0.2; done

onbridge() { # only ever send traffic to an address routed over our own bridge
  ip -4 route get "$1" 2>/dev/null | grep -q "dev $BRIDGE " ||
    { echo "smoke.sh: pod IP $1 is not on the test bridge $BRIDGE, not sending to it" >&2; return 1; }
}
podip() { $K -n "$NS" get pod "$1" -o jsonpath='{.status.podIP}'; }
pod() { # name [claim]
  cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, labels: {app: sandwake-smoke}}
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: hello
    image: $IMG_HELLO
    imagePullPolicy: Never
    ports: [{containerPort: 8080}]
    readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
    volumeMounts: [{name: data, mountPath: /data}]
  volumes:
EOF
  if [ -n "${2:-}" ]; then echo "  - {name: data, persistentVolumeClaim: {claimName: $2}}"; else echo "  - {name: data, emptyDir: {}}"; fi
}

# ---- 1. pod -> Ready -> first HTTP -> delete
for i in $(seq 1 "$RUNS"); do
  NAME=smoke-$i
  HTTPF=$(mktemp)
  T0=$(now)
  pod "$NAME" | $K -n "$NS" create -f - >/dev/null
  ( # first HTTP answer as early as possible: poll for the pod IP, then the port
    IP=
    until [ -n "$IP" ]; do IP=$(podip "$NAME" 2>/dev/null || true); [ -n "$IP" ] || sleep 0.05; done
    onbridge "$IP" || exit 1
    until BODY=$(curl -sf --max-time 1 "http://$IP:8080/"); do sleep 0.05; done
    echo "$(now) $IP $BODY" > "$HTTPF"
  ) &
  HP=$!
  $K -n "$NS" wait --for=condition=Ready "pod/$NAME" --timeout=120s >/dev/null
  T1=$(now)
  wait $HP
  read -r T2 IP BODY < "$HTTPF"; rm -f "$HTTPF"
  onbridge "$IP"
  BODY2=$(curl -sf --max-time 2 "http://$IP:8080/")
  case "$BODY2" in "hello from $NAME") ;; *) echo "smoke.sh: unexpected answer from $IP: $BODY2" >&2; exit 1;; esac
  T3=$(now)
  $K -n "$NS" delete pod "$NAME" --wait=true --timeout=120s >/dev/null
  printf 'pod %s ip %s: create->Ready %.2fs, create->first HTTP %.2fs, delete->gone %.2fs (%s)\n' \
    "$NAME" "$IP" "$(echo "$T1 - $T0" | bc)" "$(echo "$T2 - $T0" | bc)" "$(elapsed "$T3")" "$BODY2"
done

# ---- 2. PVC on local-path: bound, data survives the pod's deletion
STAMP=stamp-$$-$RANDOM
$K -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec: {accessModes: [ReadWriteOnce], storageClassName: local-path, resources: {requests: {storage: 64Mi}}}
EOF
T0=$(now)
pod writer data | $K -n "$NS" create -f - >/dev/null
$K -n "$NS" wait --for=jsonpath='{.status.phase}'=Bound pvc/data --timeout=120s >/dev/null
TB=$(elapsed "$T0")
$K -n "$NS" wait --for=condition=Ready pod/writer --timeout=120s >/dev/null
TR=$(elapsed "$T0")
PV=$($K -n "$NS" get pvc data -o jsonpath='{.spec.volumeName}')
IP=$(podip writer); onbridge "$IP"
[ "$(curl -sf --max-time 5 "http://$IP:8080/write?v=$STAMP")" = ok ]
$K -n "$NS" delete pod writer --wait=true --timeout=120s >/dev/null
pod reader data | $K -n "$NS" create -f - >/dev/null
$K -n "$NS" wait --for=condition=Ready pod/reader --timeout=120s >/dev/null
IP=$(podip reader); onbridge "$IP"
GOT=$(curl -sf --max-time 5 "http://$IP:8080/data")
[ "$GOT" = "$STAMP" ] || { echo "smoke.sh: PVC data lost: read '$GOT', wrote '$STAMP'" >&2; exit 1; }
echo "pvc data (local-path, $PV): pod create->claim Bound ${TB}s, ->pod Ready ${TR}s; data survived the writer's deletion"
$K -n "$NS" delete pod reader --wait=true --timeout=120s >/dev/null
$K -n "$NS" delete pvc data --wait=true --timeout=60s >/dev/null
for _ in $(seq 120); do $K get pv "$PV" >/dev/null 2>&1 || break; sleep 0.5; done
$K get pv "$PV" >/dev/null 2>&1 && { echo "smoke.sh: PV $PV not reclaimed" >&2; exit 1; }
echo "pv $PV reclaimed (dirs left in $STATE/var/lpp: $(ls "$STATE/var/lpp" | wc -l))"
$K delete namespace "$NS" --wait=true --timeout=60s >/dev/null
trap - EXIT
echo "SMOKE OK"
