package main

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The gateway's user in the image: not root, and no user of the host's
// (65532 is distroless' "nonroot").
const (
	uid      = 65532
	gid      = 65532
	userName = "sandwake"
)

// Paths in the image.
const (
	binaryPath    = "/usr/bin/caddy"
	caddyfilePath = "/etc/caddy/Caddyfile"
	dataDir       = "/data"   // the volume: XDG_DATA_HOME, and the store (./data/sandwake from /)
	configDir     = "/config" // XDG_CONFIG_HOME: Caddy's autosaved config
)

// layerInputs are the host files the image's one layer is made of.
type layerInputs struct {
	Binary        []byte // the static cmd/caddy
	Caddyfile     []byte // Caddyfile.example
	CACertificate []byte // the host's CA bundle
}

// layerEpoch dates every entry, so that the same inputs make the same
// layer, byte for byte, and the same content label.
var layerEpoch = time.Unix(0, 0).UTC()

// buildLayer writes the image's file system as one tar layer: the binary
// (with CAP_NET_ADMIN as a permitted-only file capability, see
// fileCapability), the Caddyfile, the CA bundle, an /etc/passwd and
// /etc/group naming the gateway's user, nsswitch.conf (hosts from
// /etc/hosts first, as glibc does), /tmp, and the data and config
// directories owned by the gateway's user (a new named volume on /data
// takes its owner and mode).
func buildLayer(in layerInputs) ([]byte, error) {
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\n%s:x:%d:%d:sandwake gateway:%s:/sbin/nologin\n", userName, uid, gid, dataDir)
	group := fmt.Sprintf("root:x:0:\n%s:x:%d:\n", userName, gid)
	entries := []struct {
		name  string // a directory's ends in /
		mode  int64
		owner int
		data  []byte
		pax   map[string]string
	}{
		{name: "etc/", mode: 0o755},
		{name: "etc/caddy/", mode: 0o755},
		{name: "etc/ssl/", mode: 0o755},
		{name: "etc/ssl/certs/", mode: 0o755},
		{name: "root/", mode: 0o700},
		{name: "tmp/", mode: 0o1777},
		{name: "usr/", mode: 0o755},
		{name: "usr/bin/", mode: 0o755},
		{name: dataDir[1:] + "/", mode: 0o755, owner: uid},
		{name: configDir[1:] + "/", mode: 0o755, owner: uid},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: in.CACertificate},
		{name: caddyfilePath[1:], mode: 0o644, data: in.Caddyfile},
		{name: binaryPath[1:], mode: 0o755, data: in.Binary, pax: map[string]string{"SCHILY.xattr.security.capability": string(fileCapability())}},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: e.mode, Uid: e.owner, Gid: e.owner,
			Size: int64(len(e.data)), ModTime: layerEpoch, PAXRecords: e.pax, Format: tar.FormatPAX}
		if strings.HasSuffix(e.name, "/") {
			h.Typeflag = tar.TypeDir
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("writing the image layer: %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("writing the image layer: %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("writing the image layer: %w", err)
	}
	return buf.Bytes(), nil
}

// fileCapability is the security.capability extended attribute (struct
// vfs_cap_data, revision 2) granting CAP_NET_ADMIN and
// CAP_NET_BIND_SERVICE (the egress forwarder's port 53) as permitted, not
// effective. A non-root process of the binary holds the capability when
// the container's bounding set has it (cap_add: NET_ADMIN) and the egress
// package makes it effective before it writes nftables; without NET_ADMIN
// the exec still succeeds (with the effective bit it would fail with
// EPERM) and egress reports what is missing.
func fileCapability() []byte {
	const revision2 = 0x02000000 // VFS_CAP_REVISION_2, no VFS_CAP_FLAGS_EFFECTIVE
	b := make([]byte, 20)        // magic_etc, then {permitted, inheritable} × 2
	binary.LittleEndian.PutUint32(b[0:], revision2)
	binary.LittleEndian.PutUint32(b[4:], 1<<unix.CAP_NET_ADMIN|1<<unix.CAP_NET_BIND_SERVICE)
	return b
}
