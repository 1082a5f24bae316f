package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"runtime"
	"slices"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"

	"github.com/sandwake/sandwake/lifecycle"
)

// This file makes the image of a group's infra container: the container
// that owns a sandbox's network namespace when the sandbox has services
// (Kubernetes' pause container). Its program is a few instructions that
// wait forever, in a static ELF this package writes itself, imported into
// the engine as a one-file image: nothing is pulled or built.

// infraELF is a static ELF executable for the engine's architecture that
// blocks in a system call forever.
func infraELF(arch string) ([]byte, error) {
	var machine uint16
	var code []byte
	switch arch {
	case "amd64":
		machine = 62 // EM_X86_64
		// loop: mov eax, 34 (pause); syscall; jmp loop
		code = []byte{0xb8, 0x22, 0x00, 0x00, 0x00, 0x0f, 0x05, 0xeb, 0xf7}
	case "arm64":
		machine = 183 // EM_AARCH64
		// loop: x0..x3 = 0; x8 = 73 (ppoll); svc #0; b loop
		for _, w := range []uint32{0xd2800000, 0xd2800001, 0xd2800002, 0xd2800003, 0xd2800928, 0xd4000001, 0x17fffffa} {
			code = binary.LittleEndian.AppendUint32(code, w)
		}
	default:
		return nil, fmt.Errorf("services need an amd64 or arm64 engine (this one is %s)", arch)
	}
	const base = 0x400000
	const hdr = 64 + 56 // ELF header + one program header
	b := make([]byte, hdr, hdr+len(code))
	copy(b, []byte{0x7f, 'E', 'L', 'F', 2, 1, 1}) // 64-bit, little endian, version 1
	le := binary.LittleEndian
	le.PutUint16(b[16:], 2) // ET_EXEC
	le.PutUint16(b[18:], machine)
	le.PutUint32(b[20:], 1)
	le.PutUint64(b[24:], base+hdr) // entry
	le.PutUint64(b[32:], 64)       // program headers at
	le.PutUint16(b[52:], 64)       // header size
	le.PutUint16(b[54:], 56)       // program header size
	le.PutUint16(b[56:], 1)        // one
	p := b[64:]
	le.PutUint32(p[0:], 1) // PT_LOAD
	le.PutUint32(p[4:], 5) // R+X
	le.PutUint64(p[16:], base)
	le.PutUint64(p[24:], base)
	le.PutUint64(p[32:], uint64(hdr+len(code)))
	le.PutUint64(p[40:], uint64(hdr+len(code)))
	le.PutUint64(p[48:], 0x1000)
	return append(b, code...), nil
}

// infraRef is the infra image's reference: its content's hash, so that
// every gateway and version that writes the same program shares it; a
// runtime with extra labels (Options.Labels: a test run) has one of its
// own, which it may remove with its objects.
func infraRef(elf []byte, labels map[string]string) string {
	h := sha256.New()
	h.Write(elf)
	tag := hex.EncodeToString(h.Sum(nil)[:6])
	if len(labels) > 0 {
		for _, k := range slices.Sorted(maps.Keys(labels)) {
			h.Write([]byte(k + "=" + labels[k] + "\x00"))
		}
		tag += "-" + hex.EncodeToString(h.Sum(nil)[:4])
	}
	return "sandwake-infra:" + tag
}

// ensureInfraImage imports the infra image when the engine lacks it and
// returns its reference.
func (r *Runtime) ensureInfraImage(ctx context.Context) (string, error) {
	elf, err := infraELF(runtime.GOARCH)
	if err != nil {
		return "", err
	}
	ref := infraRef(elf, r.opts.Labels)
	if _, err := r.cli.ImageInspect(ctx, ref); err == nil {
		return ref, nil
	} else if !cerrdefs.IsNotFound(err) {
		return "", classify("inspecting image "+ref, err, lifecycle.ErrImageNotFound)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Name: "infra", Mode: 0o555, Size: int64(len(elf)), ModTime: time.Unix(0, 0)}); err != nil {
		return "", err
	}
	tw.Write(elf)
	if err := tw.Close(); err != nil {
		return "", err
	}
	changes := []string{`ENTRYPOINT ["/infra"]`, fmt.Sprintf("LABEL %s=true", LabelManaged)}
	for k, v := range r.opts.Labels {
		changes = append(changes, fmt.Sprintf("LABEL %s=%q", k, v))
	}
	res, err := r.cli.ImageImport(ctx, client.ImageImportSource{Source: &layer, SourceName: "-"}, ref, client.ImageImportOptions{Changes: changes})
	if err != nil {
		return "", classify("importing image "+ref, err, lifecycle.ErrImageNotFound)
	}
	defer res.Close()
	dec := json.NewDecoder(res)
	for {
		var msg struct {
			Error string `json:"error"`
		}
		if err := dec.Decode(&msg); err == io.EOF {
			return ref, nil
		} else if err != nil {
			return "", fmt.Errorf("importing image %s: %w", ref, lifecycle.EngineFailure(err))
		}
		if msg.Error != "" {
			return "", fmt.Errorf("importing image %s: %w", ref, lifecycle.EngineFailure(errors.New(msg.Error)))
		}
	}
}
