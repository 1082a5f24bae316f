#!/usr/bin/env bash
# Build what the Kubernetes test cluster needs, from the Go module proxy only, into a
# cache outside the checkout (see lib.sh):
#   $BIN/{kube-apiserver,kube-controller-manager,kube-scheduler,kubelet,kubectl}
#       k8s.io/kubernetes v1.37.2 through a wrapper module that replaces every staging
#       module (k8s.io/api, apiserver, client-go, ...) with its published v0.37.2
#   $BIN/local-path-provisioner   rancher v0.0.30 (go install)
#   $IMAGES/{pause,hello}.tar      from src/pause, src/hello (docker-archive, no Docker)
# Anything already built for this version is skipped, so a warm run takes well under a
# second. Built at nice 19 with go build -p 1 (a cold build is 20-25 min on 2 cores).
# FORCE=1 rebuilds the Kubernetes binaries.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"

MINOR=$(echo "$K8S_VERSION" | cut -d. -f2)
PATCH=$(echo "$K8S_VERSION" | cut -d. -f3)
WRAP=$VC/wrap
mkdir -p "$BIN" "$IMAGES" "$WRAP"
TIMES=$VC/build-times.txt

# one build at a time per cache (two test runners may start together)
exec 9>"$CACHE_ROOT/.build.lock"
flock 9

src_sum() { (cd "$HERE" && cat "src/$1/go.mod" "src/$1/main.go" mkimage.sh) | sha256sum | cut -c1-16; }
need_k8s=
for c in $K8S_COMPONENTS; do [ -x "$BIN/$c" ] && [ -z "${FORCE:-}" ] || need_k8s="$need_k8s $c"; done
need_img=
for d in pause hello; do [ -f "$IMAGES/$d.tar" ] && [ "$(cat "$IMAGES/$d.sum" 2>/dev/null)" = "$(src_sum $d)" ] || need_img="$need_img $d"; done
if [ -z "$need_k8s" ] && [ -x "$BIN/local-path-provisioner" ] && [ -z "$need_img" ]; then
  ts "all built for v$K8S_VERSION in $BIN"
  exit 0
fi

# Go toolchain: only the local one (GOTOOLCHAIN=local), our own module and build caches.
# -modcacherw keeps the module cache deletable with a plain rm -rf.
export GOMODCACHE=$CACHE_ROOT/go/mod GOCACHE=$CACHE_ROOT/go/build GOTOOLCHAIN=local \
  GOFLAGS="-buildvcs=false -modcacherw" CGO_ENABLED=0 GOWORK=off GO111MODULE=on
now() { date +%s.%N; }
log() { echo "$(date -u +%FT%TZ) $*" | tee -a "$TIMES" >&2; }

if [ -n "$need_k8s" ]; then
  t0=$(now)
  if [ ! -f "$WRAP/.tidy-ok" ]; then
    go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" > "$WRAP/dl.json"
    KMOD=$GOMODCACHE/cache/download/k8s.io/kubernetes/@v/v$K8S_VERSION.mod
    GOLINE=$(grep -m1 '^go ' "$KMOD")
    GODEBUG_LINE=$(grep -m1 '^godebug' "$KMOD" || true)
    STAGING=$(grep -E '=> \./staging/src/' "$KMOD" | awk '{print $1}' | sort -u)
    [ -n "$STAGING" ] || { echo "no staging replaces found in $KMOD" >&2; exit 1; }
    {
      echo "module sandwake.local/k8s-wrap"
      echo
      echo "$GOLINE"
      [ -n "$GODEBUG_LINE" ] && echo "$GODEBUG_LINE"
      echo
      echo "require k8s.io/kubernetes v$K8S_VERSION"
      echo
      echo "replace ("
      for m in $STAGING; do echo "	$m => $m v0.$MINOR.$PATCH"; done
      echo ")"
    } > "$WRAP/go.mod"
    {
      echo "//go:build tools"
      echo
      echo "package tools"
      echo
      echo "import ("
      for c in $K8S_COMPONENTS; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
      echo ")"
    } > "$WRAP/tools.go"
    (cd "$WRAP" && nice -n 19 go mod tidy > "$WRAP/tidy.log" 2>&1) || { cat "$WRAP/tidy.log" >&2; exit 1; }
    touch "$WRAP/.tidy-ok"
    log "modules for k8s v$K8S_VERSION: $(elapsed "$t0") s (download + tidy)"
  fi
  LDF="-s -w"
  BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LDF="$LDF -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$MINOR -X $p.gitTreeState=clean -X $p.buildDate=$BUILD_DATE"
  done
  for c in $need_k8s; do
    s=$(now)
    ts "building $c v$K8S_VERSION"
    if ! (cd "$WRAP" && nice -n 19 go build -p 1 -trimpath -ldflags "$LDF" -o "$BIN/.$c.tmp" "k8s.io/kubernetes/cmd/$c") > "$VC/$c.build.log" 2>&1; then
      cat "$VC/$c.build.log" >&2; log "BUILD FAILED: $c"; rm -f "$BIN/.$c.tmp"; exit 1
    fi
    mv -f "$BIN/.$c.tmp" "$BIN/$c"     # only complete binaries ever carry the final name
    log "$c v$K8S_VERSION: $(elapsed "$s") s, $(stat -c %s "$BIN/$c") bytes"
  done
  log "kubernetes total: $(elapsed "$t0") s"
fi

if [ ! -x "$BIN/local-path-provisioner" ]; then
  s=$(now); ts "building local-path-provisioner $LPP_VERSION"
  rm -rf "$VC/lpp-gobin"; mkdir -p "$VC/lpp-gobin"
  GOBIN=$VC/lpp-gobin nice -n 19 go install -p 1 -trimpath -ldflags '-s -w' "github.com/rancher/local-path-provisioner@$LPP_VERSION" > "$VC/lpp.build.log" 2>&1 ||
    { cat "$VC/lpp.build.log" >&2; log "BUILD FAILED: local-path-provisioner"; exit 1; }
  mv -f "$VC/lpp-gobin/local-path-provisioner" "$BIN/local-path-provisioner"; rmdir "$VC/lpp-gobin"
  log "local-path-provisioner $LPP_VERSION: $(elapsed "$s") s"
fi

declare -A REF=([pause]=$IMG_PAUSE [hello]=$IMG_HELLO)
for d in $need_img; do
  (cd "$HERE/src/$d" && nice -n 19 go build -p 1 -trimpath -ldflags '-s -w' -o "$IMAGES/$d" .)
  "$HERE/mkimage.sh" "${REF[$d]}" "$IMAGES/$d" "$IMAGES/$d.tar" >/dev/null
  rm -f "$IMAGES/$d"; src_sum "$d" > "$IMAGES/$d.sum"
  ts "image ${REF[$d]} -> $IMAGES/$d.tar"
done
ts "all built for v$K8S_VERSION in $BIN"
