package main

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"io"
	"strings"
	"testing"
)

// TestBuildLayer: the layer holds what the gateway needs and nothing it
// would pull: the binary with CAP_NET_ADMIN as a permitted-only file
// capability, the configuration, the CA bundle, the non-root user, and the
// directories it writes to, owned by that user; the same inputs make the
// same bytes.
func TestBuildLayer(t *testing.T) {
	in := layerInputs{Binary: []byte("\x7fELF binary"), Caddyfile: []byte("{\n}\n"), CACertificate: []byte("-----BEGIN CERTIFICATE-----\n")}
	layer, err := buildLayer(in)
	if err != nil {
		t.Fatal(err)
	}
	again, err := buildLayer(in)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(layer, again) {
		t.Error("the same inputs made two different layers")
	}

	type entry struct {
		hdr  *tar.Header
		data string
	}
	got := map[string]entry{}
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		got[h.Name] = entry{h, string(b)}
	}

	tests := []struct {
		name  string
		mode  int64
		owner int
		data  string // a directory: ""
	}{
		{"usr/bin/caddy", 0o755, 0, string(in.Binary)},
		{"etc/caddy/Caddyfile", 0o644, 0, string(in.Caddyfile)},
		{"etc/ssl/certs/ca-certificates.crt", 0o644, 0, string(in.CACertificate)},
		{"etc/nsswitch.conf", 0o644, 0, "hosts: files dns\n"},
		{"tmp/", 0o1777, 0, ""},
		{"data/", 0o755, uid, ""},
		{"config/", 0o755, uid, ""},
	}
	for _, tt := range tests {
		e, ok := got[tt.name]
		switch {
		case !ok:
			t.Errorf("%s: missing from the layer", tt.name)
		case e.hdr.Mode != tt.mode || e.hdr.Uid != tt.owner || e.hdr.Gid != tt.owner || e.data != tt.data:
			t.Errorf("%s: mode %o owner %d:%d data %q, want mode %o owner %d data %q", tt.name, e.hdr.Mode, e.hdr.Uid, e.hdr.Gid, e.data, tt.mode, tt.owner, tt.data)
		}
	}
	if passwd := got["etc/passwd"].data; !strings.Contains(passwd, "\nsandwake:x:65532:65532:") {
		t.Errorf("etc/passwd names no sandwake user 65532:\n%s", passwd)
	}
	if group := got["etc/group"].data; !strings.Contains(group, "\nsandwake:x:65532:") {
		t.Errorf("etc/group names no sandwake group 65532:\n%s", group)
	}

	// struct vfs_cap_data: revision 2, not effective; permitted = NET_ADMIN (bit 12) and NET_BIND_SERVICE (bit 10).
	fcap := []byte(got["usr/bin/caddy"].hdr.PAXRecords["SCHILY.xattr.security.capability"])
	if len(fcap) != 20 {
		t.Fatalf("caddy's security.capability: %d bytes, want 20", len(fcap))
	}
	magic, permitted, inheritable := binary.LittleEndian.Uint32(fcap[0:]), binary.LittleEndian.Uint32(fcap[4:]), binary.LittleEndian.Uint32(fcap[8:])
	if magic != 0x02000000 || permitted != 1<<12|1<<10 || inheritable != 0 || binary.LittleEndian.Uint64(fcap[12:]) != 0 {
		t.Errorf("caddy's security.capability: magic %#x permitted %#x inheritable %#x (high words %x), want 0x2000000 (revision 2, not effective), 0x1400, 0, 0",
			magic, permitted, inheritable, fcap[12:])
	}
}
