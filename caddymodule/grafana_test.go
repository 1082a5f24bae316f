package caddymodule

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestGrafanaDashboardQueriesExportedMetrics: every metric the dashboard
// (docs/grafana-dashboard.json) queries is one the gateway exports (a
// histogram's _bucket, _sum and _count included) and is named in the
// metrics table of docs/operations.md; every panel has a query, and
// promtool parses each.
func TestGrafanaDashboardQueriesExportedMetrics(t *testing.T) {
	exported := map[string]bool{}
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, c := range allCollectors() {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			if m := fq.FindStringSubmatch(d.String()); m != nil {
				exported[m[1]] = true
			}
		}
	}
	if len(exported) < 10 {
		t.Fatalf("only %d metrics described: %v", len(exported), exported)
	}
	raw, err := os.ReadFile(filepath.Join("..", "docs", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("docs/grafana-dashboard.json: %v", err)
	}
	name := regexp.MustCompile(`caddy_sandwake_[a-z_]+`)
	queried := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range name.FindAllString(tg.Expr, -1) {
				queried++
				base := m
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(m, suf); ok && exported[b] {
						base = b
					}
				}
				if !exported[base] {
					t.Errorf("panel %q queries %s, which the gateway does not export", p.Title, m)
				}
				if !strings.Contains(string(readme), "`"+base+"`") {
					t.Errorf("panel %q queries %s, which the metrics table of docs/operations.md does not name", p.Title, base)
				}
			}
		}
	}
	if queried == 0 {
		t.Fatal("the dashboard queries no sandwake metric")
	}

	// Prometheus's own parser (promtool, from Debian's prometheus, which
	// make tools installs) checks every query as a recording rule.
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("SANDWAKE_REQUIRE_DOCKER") == "1" {
			t.Fatal("promtool not found: make tools installs Debian's prometheus package")
		}
		t.Skip("promtool not found (make tools installs it)")
	}
	var rules strings.Builder
	rules.WriteString("groups:\n- name: dashboard\n  rules:\n")
	for i, p := range dash.Panels {
		for j, tg := range p.Targets {
			q, _ := json.Marshal(tg.Expr) // a JSON string is a YAML string
			fmt.Fprintf(&rules, "  - record: sandwake:panel%d_%d\n    expr: %s\n", i, j, q)
		}
	}
	file := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(file, []byte(rules.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules on the dashboard's queries: %v\n%s", err, out)
	}
}
