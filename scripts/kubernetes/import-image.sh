#!/usr/bin/env bash
# import-image.sh TAR...: import image tarballs (docker-archive or OCI layout, e.g. from
# mkimage.sh) into the test cluster's own containerd, namespace k8s.io, so pods can use
# them with imagePullPolicy: Never. Never touches Docker's containerd.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
[ $# -gt 0 ] || { echo "usage: import-image.sh IMAGE.tar..." >&2; exit 2; }
[ -S "$CRI_SOCK" ] || { echo "import-image.sh: the test cluster's containerd is not running ($CRI_SOCK); run up.sh" >&2; exit 1; }
for t in "$@"; do
  [ -f "$t" ] || { echo "import-image.sh: no such file: $t" >&2; exit 1; }
  ctr -a "$CRI_SOCK" -n k8s.io images import "$t"
done
