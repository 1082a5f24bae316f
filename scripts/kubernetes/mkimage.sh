#!/usr/bin/env bash
# mkimage.sh REF BINARY OUT.tar : a single-layer docker-archive image holding one static
# binary as its entrypoint, without Docker; import it with import-image.sh.
# The rootfs has /tmp (1777) and /data; env DATA_DIR=/data. LINKS="sh mkdir rm" adds
# /bin/<link> -> /<binary> (for busybox). Deterministic: same binary, same image ID.
set -euo pipefail
REF=${1:?image ref}; BINARY=${2:?static binary}; OUT=${3:?output tar}
NAME=$(basename "$BINARY")
D=$(mktemp -d); trap 'rm -rf "$D"' EXIT
mkdir -p "$D/rootfs" "$D/img"
install -m 0755 "$BINARY" "$D/rootfs/$NAME"
mkdir -p "$D/rootfs/tmp" "$D/rootfs/data"; chmod 1777 "$D/rootfs/tmp"
for l in ${LINKS:-}; do mkdir -p "$D/rootfs/bin"; ln -s "/$NAME" "$D/rootfs/bin/$l"; done
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='2020-01-01 00:00Z' -C "$D/rootfs" -cf "$D/layer.tar" .
LSHA=$(sha256sum "$D/layer.tar" | cut -d' ' -f1)
mkdir -p "$D/img/$LSHA"; mv "$D/layer.tar" "$D/img/$LSHA/layer.tar"
cat > "$D/config.json" <<JSON
{"architecture":"amd64","os":"linux","created":"2020-01-01T00:00:00Z","config":{"Entrypoint":["/$NAME"],"Env":["PATH=/bin:/","DATA_DIR=/data"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:$LSHA"]},"history":[{"created":"2020-01-01T00:00:00Z","created_by":"sandwake scripts/kubernetes/mkimage.sh"}]}
JSON
CSHA=$(sha256sum "$D/config.json" | cut -d' ' -f1)
mv "$D/config.json" "$D/img/$CSHA.json"
echo "[{\"Config\":\"$CSHA.json\",\"RepoTags\":[\"$REF\"],\"Layers\":[\"$LSHA/layer.tar\"]}]" > "$D/img/manifest.json"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='2020-01-01 00:00Z' -C "$D/img" -cf "$OUT.tmp" .
mv -f "$OUT.tmp" "$OUT"
echo "built $REF -> $OUT"
