package api

import (
	"strings"
	"testing"
)

// TestReadyzExclude: exclude names checks one by one or joined by commas;
// a name that is no check is refused, naming the checks.
func TestReadyzExclude(t *testing.T) {
	checks := map[string]string{"store": "ok", "kubernetes": "fail", "cluster": "fail", "boot_reconcile": "ok"}
	got, err := readyzExclude([]string{"kubernetes,cluster", " store "}, checks)
	if err != nil || len(got) != 3 || !got["kubernetes"] || !got["cluster"] || !got["store"] {
		t.Fatalf("exclude kubernetes,cluster and store: %v %v", got, err)
	}
	if got, err := readyzExclude(nil, checks); err != nil || got != nil {
		t.Fatalf("no exclude: %v %v", got, err)
	}
	_, err = readyzExclude([]string{"etcd"}, checks)
	if err == nil || !strings.Contains(err.Error(), "exclude=etcd names no check") || !strings.Contains(err.Error(), "boot_reconcile, cluster, kubernetes, store") {
		t.Fatalf("exclude of no check: %v, want it refused naming the checks", err)
	}
}
