package testenv

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/moby/moby/client"
)

// BuildTestApp compiles internal/testapp as a static binary into dir and
// returns its path.
func BuildTestApp(ctx context.Context, dir string) (string, error) {
	out := filepath.Join(dir, "testapp")
	cmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-ldflags=-s -w", "-o", out, "github.com/sandwake/sandwake/internal/testapp")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building testapp: %v\n%s", err, msg)
	}
	return out, nil
}

// goTool is the go command that runs the tests: GOROOT/bin/go as `go test`
// sets GOROOT, else the one on PATH.
func goTool() string {
	if root := os.Getenv("GOROOT"); root != "" {
		if p := filepath.Join(root, "bin", "go"); fileExists(p) {
			return p
		}
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// ImportImage imports a one-file image (FROM scratch, the binary at /testapp)
// into the engine under ref, through the API: nothing is pulled. labels are
// set on the image so that cleanup can find it.
func ImportImage(ctx context.Context, cli *client.Client, binary, ref string, labels map[string]string) error {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	now := time.Now()
	for _, d := range []string{"tmp/", "workspace/"} {
		tw.WriteHeader(&tar.Header{Name: d, Mode: 0o1777, Typeflag: tar.TypeDir, ModTime: now})
	}
	if err := tw.WriteHeader(&tar.Header{Name: "testapp", Mode: 0o755, Size: int64(len(bin)), ModTime: now}); err != nil {
		return err
	}
	tw.Write(bin)
	if err := tw.Close(); err != nil {
		return err
	}
	changes := []string{`CMD ["/testapp"]`, "ENV PORT=8080", "EXPOSE 8080"}
	for k, v := range labels {
		changes = append(changes, fmt.Sprintf("LABEL %s=%q", k, v))
	}
	return ImportLayer(ctx, cli, &layer, ref, changes)
}

// ImportLayer imports one tar layer as an image (FROM scratch) under ref,
// with the Dockerfile instructions changes (CMD, ENTRYPOINT, ENV, EXPOSE,
// LABEL, USER, VOLUME, WORKDIR) as its config: nothing is pulled or built.
func ImportLayer(ctx context.Context, cli *client.Client, layer io.Reader, ref string, changes []string) error {
	res, err := cli.ImageImport(ctx, client.ImageImportSource{Source: layer, SourceName: "-"}, ref, client.ImageImportOptions{Changes: changes})
	if err != nil {
		return fmt.Errorf("importing image %s: %w", ref, err)
	}
	defer res.Close()
	return checkStream(res, "importing image "+ref)
}

// checkStream reads an engine progress stream to its end and returns the
// first error it reports.
func checkStream(r io.Reader, doing string) error {
	dec := json.NewDecoder(r)
	for {
		var msg struct {
			Error string `json:"error"`
		}
		if err := dec.Decode(&msg); err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("%s: reading progress: %w", doing, err)
		}
		if msg.Error != "" {
			return fmt.Errorf("%s: %s", doing, msg.Error)
		}
	}
}
