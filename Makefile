# sandwake — make targets. `make test` is what CI runs (.ci/run).
GO                  ?= go
STATICCHECK_VERSION ?= v0.8.2
XCADDY_VERSION      ?= v0.4.5
IMAGE               ?= sandwake:dev

.PHONY: run build image test test-k8s vet lint tools bench bench-engine xcaddy fmt clean clean-demo

## run: build Caddy with sandwake, start it with Caddyfile.example and a demo sandbox
run: build
	scripts/run.sh

## build: bin/caddy (Caddy + standard modules + sandwake)
build:
	$(GO) build -o bin/caddy ./cmd/caddy

## image: the gateway's container image $(IMAGE) (sandwake:dev): static cmd/caddy,
## CA certificates, non-root user, Caddyfile.example; nothing pulled (docs/image.md)
image:
	$(GO) run ./internal/image --tag $(IMAGE) --go $(GO)

## test: formatting, vet, staticcheck, then every test under the race detector
test: tools vet lint
	$(GO) test -count=1 -race -timeout 60m ./...

## test-k8s: the Kubernetes runtime's and the cluster's (backend kubernetes) tests
## on a real single-node cluster built
## here (scripts/kubernetes: Kubernetes from the Go module proxy, Debian's etcd,
## CNI plugins and containerd; the first build takes ~25-30 min on 2 cores and is
## cached in ~/.cache/sandwake/kubernetes, later runs start in seconds); as root;
## the cluster is torn down after, whatever the tests did
# The cluster package's tests of the Kubernetes store: those run on each backend
# (eachBackend; their kubernetes subtests) and the Kubernetes-only ones.
CLUSTER_BACKEND_TESTS = ^Test(ReserveIsUniqueAcrossNodes|PublishFollowsLocalRecords|LostNodeShowsNotLive|DrainRemoveAndPlace|ForgedEntryIsRepaired|KubeStoreForbidden|KubeStoreLeavesForeignLeases|KubeStoreOutageKeepsNodes)$$
test-k8s:
	scripts/kubernetes/up.sh >/dev/null
	set -a; . $${SANDWAKE_K8S_STATE:-/tmp/sandwake-k8s}/env; set +a; \
	export SANDWAKE_KUBECONFIG=$$KUBECONFIG SANDWAKE_REQUIRE_KUBERNETES=1; \
	$(GO) test -count=1 -race -timeout 30m ./lifecycle/kubernetes/ && \
	$(GO) test -count=1 -race -timeout 30m -run '$(CLUSTER_BACKEND_TESTS)/kubernetes$$' ./cluster/ && \
	$(GO) test -count=1 -race -timeout 30m -run '^TestKubernetes' ./caddymodule/; \
	rc=$$?; scripts/kubernetes/down.sh; exit $$rc

## tools: what the tests need beyond Go, from Debian's packages: chromium for
## the browser tests, etcd-server for the cluster tests, prometheus (promtool)
## for the Grafana dashboard's queries
tools:
	@missing=; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v etcd >/dev/null 2>&1 || missing="$$missing etcd-server"; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	if [ -n "$$missing" ]; then \
		if ! command -v apt-get >/dev/null 2>&1; then \
			echo "make test needs$$missing (the browser tests need chromium, the cluster tests etcd 3.4+, the dashboard test promtool);" \
				"this machine has no apt-get: install them with its package manager, then run make test again" >&2; \
			exit 1; \
		fi; \
		echo "installing$$missing (browser, cluster and dashboard tests)"; \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

lint:
	@$(GO) mod tidy -diff >/dev/null || { echo "go.mod and go.sum are not tidy (run go mod tidy):"; $(GO) mod tidy -diff; exit 1; }
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

## bench: side-by-side benchmarks (hot path, wake latency, wake storm, scale, cluster: 3-member etcd + 3 nodes, skipped without etcd; kubernetes with a cluster: SANDWAKE_KUBECONFIG), < 10 min; BENCH_FLAGS=--quick for ~2-3 min, BENCH_FLAGS="--only cluster" for one scenario
bench: build
	$(GO) run ./cmd/sandwake-bench --caddy bin/caddy $(BENCH_FLAGS)

## bench-engine: wake through the Manager vs the raw Docker calls, side by side
bench-engine:
	$(GO) test -run '^$$' -bench . -benchtime 20x ./lifecycle/docker/

## xcaddy: build Caddy with xcaddy from xcaddy.json (xcaddy installed with go install)
xcaddy:
	$(GO) install github.com/caddyserver/xcaddy/cmd/xcaddy@$(XCADDY_VERSION)
	PATH="$$($(GO) env GOPATH)/bin:$$PATH" $$($(GO) run scripts/xcaddy-command.go)

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin

## clean-demo: remove what make run made: the demo sandbox (container, volume,
## network, firewall table), the demo image and data/ (stop make run first)
clean-demo:
	$(GO) run ./internal/demo clean $${SANDWAKE_DEMO_ID:-demo}
	rm -rf data
