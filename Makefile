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

lint:
	@fmt=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$fmt" ]; then echo "gofmt needed:"; echo "$$fmt"; exit 1; fi
	$(GO) vet ./...
	@if command -v staticcheck >/dev/null || $(GO) install honnef.co/go/tools/cmd/staticcheck@latest; then \
		PATH="$$PATH:$$($(GO) env GOPATH)/bin" staticcheck ./...; fi

clean:
	rm -rf bin
