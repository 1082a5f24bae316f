//go:build ignore

// xcaddy-command prints the xcaddy build command described by xcaddy.json:
// `make xcaddy` runs what it prints.
//
// The command runs under `env GOPROXY=<the proxies>|off`. xcaddy runs `go get
// github.com/sandwake/sandwake` after writing its replace; a proxy that does
// not know the module answers 404 on the public proxy (Go then uses the
// replacement) but 403 on some mirrors, which Go treats as a failure. With
// "|off" after each proxy, any failure falls through to "off", which Go reads
// as "not found", so the replacement is used either way. "direct" is left out:
// a build of this checkout needs no version control.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

type manifest struct {
	CaddyVersion string `json:"caddy_version"`
	Plugins      []struct {
		Module  string `json:"module"`
		Version string `json:"version"`
		Replace string `json:"replace"`
	} `json:"plugins"`
	Output string `json:"output"`
}

func main() {
	b, err := os.ReadFile("xcaddy.json")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		fmt.Fprintln(os.Stderr, "xcaddy.json:", err)
		os.Exit(1)
	}
	args := []string{"env", "GOPROXY=" + goproxy(), "xcaddy", "build", m.CaddyVersion}
	for _, p := range m.Plugins {
		w := p.Module
		if p.Version != "" {
			w += "@" + p.Version
		}
		if p.Replace != "" {
			w += "=" + p.Replace
		}
		args = append(args, "--with", w)
	}
	if m.Output != "" {
		args = append(args, "--output", m.Output)
	}
	fmt.Println(strings.Join(args, " "))
}

// goproxy is the go command's GOPROXY with every proxy followed by "|" and
// "off" at the end, "direct" and "off" dropped.
func goproxy() string {
	out, err := exec.Command("go", "env", "GOPROXY").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "go env GOPROXY:", err)
		os.Exit(1)
	}
	var proxies []string
	for _, p := range strings.FieldsFunc(strings.TrimSpace(string(out)), func(r rune) bool { return r == ',' || r == '|' }) {
		if p != "direct" && p != "off" {
			proxies = append(proxies, p)
		}
	}
	return strings.Join(append(proxies, "off"), "|")
}
