# sandwake — make targets. `make test` is what CI runs (.ci/run).
GO        ?= go
GOBIN     ?= $(shell $(GO) env GOPATH)/bin
STATICCHECK_VERSION ?= v0.8.2

# Packages with concurrency run under the race detector.
RACE_PKGS := ./store/... ./lifecycle/...

.PHONY: test vet lint unit race bench-engine fmt

test: vet lint race
	$(GO) test -count=1 ./...

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

lint:
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...

race:
	$(GO) test -count=1 -race $(RACE_PKGS)

# Wake through the Manager vs the raw Docker calls, side by side (issue 2 #8).
bench-engine:
	$(GO) test -run '^$$' -bench . -benchtime 20x ./lifecycle/docker/

fmt:
	gofmt -w $$(git ls-files '*.go')
