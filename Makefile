SHELL := /bin/bash
GO ?= go
GOTEST_FLAGS ?= -count=1 -timeout 12m
STACK := scripts/stack.sh

.PHONY: build test test-go stack-up stack-down lint demo bench drill clean

build:
	$(GO) build -o bin/wlproj .

stack-up:
	@$(STACK) up

stack-down:
	@$(STACK) down

# Brings the stack up if it is not up, runs the tests against it, and takes it
# down again only if it was this target that started it.
test:
	@scripts/tools.sh
	@started=0; \
	if ! $(STACK) status >/dev/null 2>&1; then $(STACK) up || exit 1; started=1; fi; \
	rc=0; $(MAKE) --no-print-directory test-go || rc=$$?; \
	if [ $$started = 1 ]; then $(STACK) down; fi; \
	exit $$rc

test-go:
	@set -a; . .stack/env; set +a; $(GO) test $(GOTEST_FLAGS) ./...

demo:
	@scripts/demo.sh

# Benchmarks (not tests): BENCH_SMOKE=1 runs every step on tiny sizes; the
# smoke mode also runs inside `make test` (bench/bench_test.go).
BENCH_OUT ?= bench/results.json
bench:
	@started=0; \
	if ! $(STACK) status >/dev/null 2>&1; then $(STACK) up || exit 1; started=1; fi; \
	rc=0; (set -a; . .stack/env; set +a; BENCH_OUT=$(BENCH_OUT) BENCH_SMOKE=$(BENCH_SMOKE) $(GO) run ./bench $(BENCH_FLAGS)) || rc=$$?; \
	if [ $$started = 1 ]; then $(STACK) down; fi; \
	exit $$rc

# Unattended failover drill on the real stack; writes drill/report.json.
drill:
	@scripts/tools.sh
	@started=0; \
	if ! $(STACK) status >/dev/null 2>&1; then $(STACK) up || exit 1; started=1; fi; \
	rc=0; (set -a; . .stack/env; set +a; $(GO) run ./drill $(DRILL_FLAGS)) || rc=$$?; \
	if [ $$started = 1 ]; then $(STACK) down; fi; \
	exit $$rc

lint:
	@fmt=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$fmt" ]; then echo "gofmt needed:"; echo "$$fmt"; exit 1; fi
	$(GO) vet ./...
	@if command -v staticcheck >/dev/null || $(GO) install honnef.co/go/tools/cmd/staticcheck@latest; then \
		PATH="$$PATH:$$($(GO) env GOPATH)/bin" staticcheck ./...; fi

clean:
	rm -rf bin
