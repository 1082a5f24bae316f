//go:build ignore

// xcaddy-command prints the xcaddy build command described by xcaddy.json:
// `make xcaddy` runs what it prints.
package main

import (
	"encoding/json"
	"fmt"
	"os"
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
	args := []string{"xcaddy", "build", m.CaddyVersion}
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
