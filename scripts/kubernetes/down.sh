#!/usr/bin/env bash
# Stop the test cluster up.sh started and undo what it changed on the host:
#   processes: only the PIDs up.sh recorded (checked against their executable), the
#     containerd shims of OUR containerd socket and the processes in the kubepods cgroups;
#   mounts under the state dir and the cni-* netns our containerd made; the CNI bridge and
#     its veths; KUBE-* iptables chains that were not there before; the FORWARD rule;
#     the kubelet's kubepods cgroups; the sysctls the kubelet changed; the dirs the kubelet
#     and containerd create outside the state dir (/var/lib/cni, /var/log/containers, ...)
#     when they did not exist before; then the state dir itself.
# Keeps the cache (binaries, images, Debian packages). Safe to run twice, and after a
# failed or partial up.sh. SANDWAKE_K8S_KEEP_STATE=1 keeps the state dir (logs, etcd data).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
[ "$(id -u)" = 0 ] || { echo "down.sh: must run as root" >&2; exit 1; }
if [ ! -d "$STATE" ]; then echo "down: nothing to do ($STATE does not exist)"; exit 0; fi
exec 8<"$STATE"
flock -w "${SANDWAKE_K8S_LOCK_WAIT:-300}" 8 || echo "down: WARNING: $STATE still locked after ${SANDWAKE_K8S_LOCK_WAIT:-300}s, going on"
RUN=$STATE/run HS=$STATE/run/host-state
CTR="ctr -a $CRI_SOCK -n k8s.io"
K="$BIN/kubectl --kubeconfig $KUBECONFIG_OUT --request-timeout=10s"
say() { printf 'down [%5.1fs]: %s\n' "$(echo "$(date +%s.%N) - $_T0" | bc)" "$*"; }

pid_of() { # name -> pid, only if that PID still runs the recorded executable
  local f=$PIDS/$1.pid pid exe
  [ -f "$f" ] || return 1
  read -r pid exe < "$f" || return 1
  [ -n "$pid" ] && running "$pid" || return 1
  [ -z "$exe" ] || [ "$(readlink -f "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$exe")" ] || return 1
  echo "$pid"
}
stop() { # timeout-seconds name...: SIGTERM to all of them, SIGKILL what is left after the timeout
  local to=$1 n pid; shift
  local -A p=()
  for n; do pid=$(pid_of "$n") && kill -TERM "$pid" 2>/dev/null && p[$n]=$pid; done
  for _ in $(seq $((to * 10))); do
    for n in "${!p[@]}"; do running "${p[$n]}" || { say "stopped $n (${p[$n]})"; unset "p[$n]"; }; done
    [ ${#p[@]} = 0 ] && break; sleep 0.1
  done
  for n in "${!p[@]}"; do
    kill -KILL "${p[$n]}" 2>/dev/null; say "killed -9 $n (${p[$n]}) after ${to}s"
    for _ in $(seq 50); do running "${p[$n]}" || break; sleep 0.1; done
  done
  for n; do rm -f "$PIDS/$n.pid"; done
}

# 1. let the kubelet tear pods down (CNI DEL, unmounts) while the control plane still runs
if pid_of kube-apiserver >/dev/null && pid_of kubelet >/dev/null; then
  $K delete pods --all --all-namespaces --grace-period=1 --wait=true --timeout=60s >/dev/null 2>&1 || true
  if pid_of containerd >/dev/null; then
    for _ in $(seq 60); do [ -z "$($CTR tasks ls -q 2>/dev/null)" ] && break; sleep 0.5; done
  fi
fi
# a throw-away cluster: no need to wait out the apiserver's graceful shutdown (~15 s)
stop 10 local-path-provisioner kubelet
stop 3 kube-scheduler kube-controller-manager kube-apiserver
stop 10 etcd

# 2. leftover tasks and containers in OUR containerd (never Docker's)
if pid_of containerd >/dev/null; then
  for t in $($CTR tasks ls -q 2>/dev/null); do $CTR tasks kill -a -s KILL "$t" >/dev/null 2>&1; done
  for _ in $(seq 10); do
    left=
    for t in $($CTR tasks ls -q 2>/dev/null); do $CTR tasks rm -f "$t" >/dev/null 2>&1 || left=1; done
    [ -z "$left" ] && break; sleep 0.5
  done
  for c in $($CTR containers ls -q 2>/dev/null); do $CTR containers rm "$c" >/dev/null 2>&1; done
fi
stop 15 containerd

# 3. processes still in the kubelet's kubepods cgroups (containers whose shim died), then
#    the shims of our containerd (matched on our socket path, exactly), then the cgroups
kubepods_new() { [ -f "$HS" ] || return 0; for h in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
  [ -d "${h}kubepods" ] && ! grep -qx "cgroup ${h}kubepods" "$HS" 2>/dev/null && echo "${h}kubepods"; done; }
for cg in $(kubepods_new); do
  for p in $(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u); do
    kill -KILL "$p" 2>/dev/null && say "killed pod process $p"
  done
done
for p in $(ls /proc | grep -E '^[0-9]+$'); do
  cmd=$(tr '\0' ' ' 2>/dev/null < "/proc/$p/cmdline") || continue
  case "$cmd" in *containerd-shim*" -address $CRI_SOCK "*|*containerd-shim*" -address $CRI_SOCK") kill -KILL "$p" 2>/dev/null && say "killed shim $p";; esac
done
sleep 0.2
for cg in $(kubepods_new); do
  find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null
  [ -d "$cg" ] && say "WARNING: could not remove cgroup $cg" || say "removed cgroup $cg"
done

# 4. mounts under the state dir (deepest first)
for _ in 1 2 3; do
  ms=$(awk '{print $2}' /proc/mounts | grep -E "^$STATE(/|$)" | sort -r)
  [ -z "$ms" ] && break
  for m in $ms; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
done
[ -n "$(awk '{print $2}' /proc/mounts | grep -E "^$STATE(/|$)")" ] && say "WARNING: mounts left under $STATE"

# 5. network: netns our containerd made, veths on our bridge, the bridge
if [ -f "$HS" ]; then
  left=
  for ns in $(ls /run/netns 2>/dev/null | grep '^cni-'); do
    grep -qx "netns $ns" "$HS" && continue
    ip netns del "$ns" 2>/dev/null || { umount "/run/netns/$ns" 2>/dev/null; rm -f "/run/netns/$ns" 2>/dev/null; }
    if [ -e "/run/netns/$ns" ]; then left="$left $ns"; else say "removed netns $ns"; fi
  done
  # A netns mounted before /run/netns became a bind mount of itself
  # (iproute2 makes it one on first use: another test's `ip netns add`) is
  # hidden under that mount, its file busy. With nothing but ours left in
  # /run/netns, lift the bind mount and remove them from beneath it.
  if [ -n "$left" ] && mountpoint -q /run/netns &&
    [ -z "$(ls -A /run/netns | grep -vxF -e "$(printf '%s\n' $left)")" ]; then
    umount /run/netns
    for ns in $left; do
      umount "/run/netns/$ns" 2>/dev/null
      rm -f "/run/netns/$ns" && say "removed netns $ns (hidden under /run/netns's bind mount)"
    done
  fi
  for ns in $left; do [ -e "/run/netns/$ns" ] && say "WARNING: netns $ns left (in use?)"; done
fi
# (only when up.sh got as far as recording the host state: the bridge is then ours)
if [ -f "$HS" ] && ip link show "$BRIDGE" >/dev/null 2>&1; then
  for v in $(ip -o link show master "$BRIDGE" | awk -F': ' '{print $2}' | cut -d@ -f1); do ip link del "$v" 2>/dev/null && say "removed veth $v"; done
  ip link del "$BRIDGE" && say "removed bridge $BRIDGE"
fi
[ -f "$HS" ] && while iptables -D FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT -m comment --comment "$FWD_COMMENT" 2>/dev/null; do say "removed FORWARD rule $FWD_COMMENT"; done

# 6. KUBE-* chains the kubelet made (only ones that were not there before up.sh)
if [ -f "$HS" ]; then
  for fam in 4 6; do
    ipt=iptables; [ $fam = 6 ] && ipt=ip6tables
    for t in filter nat mangle raw; do
      for c in $($ipt -t $t -S 2>/dev/null | awk '$1=="-N" && $2 ~ /^KUBE-/ {print $2}'); do
        grep -qx "chain$fam $t $c" "$HS" && continue
        # drop the jumps to it first, then the chain
        $ipt -t $t -S 2>/dev/null | grep -E -- "-j $c( |$)" | sed 's/^-A /-D /' | while read -r rule; do eval "$ipt -t $t $rule" 2>/dev/null; done
        $ipt -t $t -F "$c" 2>/dev/null; $ipt -t $t -X "$c" 2>/dev/null && say "removed ip${fam}tables $t/$c"
      done
    done
  done
fi

# 7. sysctls back to what they were; dirs made outside the state dir
if [ -f "$HS" ]; then
  while read -r kind a b; do
    [ "$kind" = sysctl ] || continue
    [ "$(sysctl -n "$a" 2>/dev/null)" = "$b" ] || { sysctl -qw "$a=$b" && say "restored $a=$b"; }
  done < "$HS"
  for d in /var/lib/cni /var/log/pods /var/log/containers /var/lib/kubelet /etc/kubernetes; do
    [ -e "$d" ] && ! grep -qx "existed $d" "$HS" && rm -rf "$d" && say "removed $d"
  done
  # /run/netns can become a bind mount of itself (CNI/iproute2 make it shared); only when empty
  if ! grep -qx "existed /run/netns" "$HS" && [ -d /run/netns ] && [ -z "$(ls -A /run/netns)" ]; then
    mountpoint -q /run/netns && umount /run/netns 2>/dev/null
    rmdir /run/netns 2>/dev/null && say "removed /run/netns"
  fi
  if ! grep -qx "existed /run/containerd/runc" "$HS"; then
    rmdir /run/containerd/runc/k8s.io /run/containerd/runc 2>/dev/null && say "removed /run/containerd/runc"
  fi
fi

# 8. the state dir
if [ -n "${SANDWAKE_K8S_KEEP_STATE:-}" ]; then
  rm -f "$RUN/up-ok" "$PIDS"/*.pid; say "kept $STATE"
else
  rm -rf "$STATE" && say "removed $STATE"
fi
say "complete"
