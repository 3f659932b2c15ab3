SHELL := /bin/bash
GO ?= go
GOTEST_FLAGS ?= -count=1 -timeout 12m
STACK := scripts/stack.sh

# ENGINE is the engine of the stack that stack-up, test's whole suite, bench
# and drill use (scripts/stack.sh lists them; the first is the default).
# ENGINES are the others `make test` runs the engine-facing tests on, one
# after the other: all of them unless given, e.g. ENGINES=opensearch-2, or
# ENGINES= for none.
ENGINE ?= $(firstword $(shell $(STACK) engines))
ENGINES ?= $(filter-out $(ENGINE),$(shell $(STACK) engines))
export ENGINE

# The engine-facing tests, those whose outcome depends on the engine's own
# answers: the search handler and the engine probe, the classifier on the
# engine's answers (and every engine's captures), the ledger against
# forgotten tombstones, TLS with credentials, the replicas where the engine
# refuses, is down, throttles or a leader dies mid-bulk, the readiness gate
# on the engine and the replays it drives, verify's reading and repair of
# the index (its Postgres-side interleavings run once, in the whole suite),
# the harness's own index cleanup (Elasticsearch 8 refuses deletes by
# wildcard), the engine node list, migrations that build indexes
# concurrently and follow a host list, and projections files. The leader's
# and Postgres' own behaviour (elections, fencing, Postgres topologies,
# metrics, the drill, the CLI's wiring) does not change with the engine and
# runs once, on ENGINE.
ENGINE_TEST_PKGS := ./e2e ./cli ./projection ./classify ./consume ./internal/testkit/harness ./verify ./migrations
ENGINE_TEST_RUN := ^Test(Engine|Search|Identify|ItemResult|Captured|NewElasticClient|LateReplay|RetryAfterTheDelete|TLS|Replicas(DeterministicFailures|EngineDownThenBack|HonourRetryAfter|Kill9LeaderMidStream)|Operate(ReadyzEngineGate|AutoReplay|ReplayAfterMappingFix)|DeleteIndex|Verify(FindsEachKind|FindsDocumentsWritten|Fingerprints|InSmallPages|RepairPutsEveryKind|ScheduledRunDeletes|CleanIndex)|TopologyEngine|ConcurrentBuild|RerunRebuildsInvalidIndex|UpGuards|Projection|EnsureIndexWith)

# What `wlproj --version`, /metrics and the package say about the build
# (scripts/version.sh: the nearest tag, else 0.0.0-g<commit>; -dirty with
# changes). The commit is stamped too: Go records none in a git worktree.
VERSION ?= $(shell scripts/version.sh)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
BUILD_DATE ?= $(shell date -u $${SOURCE_DATE_EPOCH:+-d @$$SOURCE_DATE_EPOCH} +%Y-%m-%dT%H:%M:%SZ)
BUILDINFO := github.com/wlproj/wlproj/internal/buildinfo
LDFLAGS = -X $(BUILDINFO).version=$(VERSION) -X $(BUILDINFO).revision=$(REVISION) \
	-X $(BUILDINFO).dirty=$(if $(filter %-dirty,$(VERSION)),true,false) -X $(BUILDINFO).buildDate=$(BUILD_DATE)

# make deb writes $(DEB_DIR)/wlproj_$(DEB_VERSION)_$(DEB_ARCH).deb
# (deploy/deb/nfpm.yaml says what is in it). DEB_ARCH is Go's GOARCH, which
# names amd64 and arm64 as Debian does.
DEB_DIR ?= bin
DEB_VERSION ?= $(shell scripts/version.sh --deb)
DEB_ARCH ?= $(shell $(GO) env GOARCH)
DEB_STAGE := $(DEB_DIR)/deb-stage

.PHONY: build deb image test test-go test-binary test-k8s test-engine engine-run test-engines capture stack-up stack-down lint demo bench drill clean

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/wlproj .

# The package's binary links no C library (CGO_ENABLED=0: it runs on any
# glibc), is position-independent (ASLR, and lintian's static-binary check
# passes) and stripped, as Debian wants; its Go build info stays readable.
deb:
	@mkdir -p $(DEB_STAGE)
	CGO_ENABLED=0 GOARCH=$(DEB_ARCH) $(GO) build -buildmode=pie -trimpath -ldflags '$(LDFLAGS) -s -w' -o $(DEB_STAGE)/wlproj .
	gzip -9n < deploy/deb/changelog > $(DEB_STAGE)/changelog.gz
	@nfpm=$$(scripts/tools.sh nfpm) && DEB_VERSION=$(DEB_VERSION) DEB_ARCH=$(DEB_ARCH) DEB_STAGE=$(DEB_STAGE) \
		$$nfpm package --config deploy/deb/nfpm.yaml --packager deb --target $(DEB_DIR)/wlproj_$(DEB_VERSION)_$(DEB_ARCH).deb
	@rm -rf $(DEB_STAGE)

# make image builds the container image IMAGE from the checkout with Debian's
# podman (deploy/image/Containerfile says what is in it) and writes it to
# $(IMAGE_DIR)/wlproj_$(VERSION)_$(IMAGE_ARCH).image.tar too, for `podman
# load`, `docker load` or `skopeo copy` on another machine. Nothing is
# pulled: the image is FROM scratch, its root staged here. The binary is
# built as for make deb but not position-independent: a PIE Go binary asks
# for the dynamic loader, which an empty root does not have. A rebuild
# that changes the image removes the one IMAGE named before, unless a
# container or another tag still uses it, so builds leave no dangling image.
IMAGE ?= localhost/wlproj:$(VERSION)
IMAGE_DIR ?= bin
IMAGE_ARCH ?= $(shell $(GO) env GOARCH)
IMAGE_STAGE := $(IMAGE_DIR)/image-stage
PODMAN := CONTAINERS_CONF=$(CURDIR)/deploy/image/containers.conf podman
# IMAGE_EPOCH is the one time the image carries (its creation time, every
# file's mtime, the binary's build date and the created label), so that the
# same sources give the same image id: SOURCE_DATE_EPOCH, else the commit's
# time; outside a checkout, now (and then no two builds are alike).
IMAGE_EPOCH ?= $(or $(SOURCE_DATE_EPOCH),$(shell git log -1 --format=%ct 2>/dev/null),$(shell date +%s))

image: BUILD_DATE = $(shell date -u -d @$(IMAGE_EPOCH) +%Y-%m-%dT%H:%M:%SZ)
image:
	@scripts/tools.sh podman
	@rm -rf $(IMAGE_STAGE) && mkdir -p $(IMAGE_STAGE)/root/usr/bin $(IMAGE_STAGE)/root/usr/libexec/wlproj $(IMAGE_STAGE)/root/etc/ssl/certs
	CGO_ENABLED=0 GOARCH=$(IMAGE_ARCH) $(GO) build -trimpath -ldflags '$(LDFLAGS) -s -w' -o $(IMAGE_STAGE)/root/usr/bin/wlproj .
	CGO_ENABLED=0 GOARCH=$(IMAGE_ARCH) $(GO) build -trimpath -ldflags '-s -w' -o $(IMAGE_STAGE)/root/usr/libexec/wlproj/healthcheck ./deploy/image/healthcheck
	install -m 0644 /etc/ssl/certs/ca-certificates.crt $(IMAGE_STAGE)/root/etc/ssl/certs/
	install -m 0644 deploy/image/passwd deploy/image/group $(IMAGE_STAGE)/root/etc/
	@# podman 4.3's --timestamp dates the layer's files but not the digest of
	@# the COPY source in the image's history, which hashes their mtimes.
	find $(IMAGE_STAGE)/root -exec touch --no-dereference --date=@$(IMAGE_EPOCH) {} +
	@# podman build's image is an intermediate: normalize blanks the two
	@# fields podman 4.3 fills from its random build container, and the
	@# archive it writes is the image loaded under IMAGE and shipped.
	$(PODMAN) build --quiet --layers=false --format docker --platform linux/$(IMAGE_ARCH) --file deploy/image/Containerfile \
		--timestamp $(IMAGE_EPOCH) --iidfile $(IMAGE_STAGE)/built.iid \
		--build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) --build-arg CREATED=$(BUILD_DATE) \
		$(IMAGE_STAGE) >/dev/null
	$(PODMAN) save --quiet --format docker-archive -o $(IMAGE_STAGE)/built.tar $$(cat $(IMAGE_STAGE)/built.iid)
	$(PODMAN) rmi $$(cat $(IMAGE_STAGE)/built.iid) >/dev/null
	@rm -f $(IMAGE_DIR)/wlproj_$(VERSION)_$(IMAGE_ARCH).image.tar
	$(GO) run ./deploy/image/normalize -tag $(IMAGE) $(IMAGE_STAGE)/built.tar $(IMAGE_DIR)/wlproj_$(VERSION)_$(IMAGE_ARCH).image.tar
	@previous=$$($(PODMAN) image inspect --format '{{.Id}}' $(IMAGE) 2>/dev/null); \
	$(PODMAN) load --quiet --input $(IMAGE_DIR)/wlproj_$(VERSION)_$(IMAGE_ARCH).image.tar >/dev/null && \
	if [ -n "$$previous" ] && [ "$$previous" != "$$($(PODMAN) image inspect --format '{{.Id}}' $(IMAGE))" ]; then \
		$(PODMAN) rmi "$$previous" >/dev/null 2>&1 || true; \
	fi
	@rm -rf $(IMAGE_STAGE)
	@$(PODMAN) image inspect --format '{{.RepoTags}} {{.Size}} bytes' $(IMAGE)

# PG_STANDBY=1 adds a streaming standby of Postgres (scripts/stack.sh).
stack-up:
	@PG_STANDBY=$(PG_STANDBY) $(STACK) up

stack-down:
	@$(STACK) down

# The whole suite on ENGINE, then the engine-facing tests on each of ENGINES.
# Each engine's stack is brought up if it is not up, and taken down again
# only if this target started it (`stack.sh with`); stack.sh prints each
# one's wall time.
# At the end, tools/testsummary prints the runs at a glance from the
# go test -json files gotestsum kept in $(TEST_JSON): each run's counts,
# the failed tests by name, the slowest packages and tests.
# The engines of `make test` compile with C1 only (ENGINE_JAVA_OPTS, which
# stack.sh records for the nodes tests start beside the stack): their JVMs
# were the suite's largest CPU consumer (797 of some 2,100 CPU-seconds on two
# cores), mostly C2 compiling code a short test run never repays. Measured
# on Elasticsearch 7: its start 11.9 -> 5.3 CPU-s, the projection and verify
# packages' engine CPU 38.5 -> 25.2 s, their wall 48.6 -> 46.7 s. Benchmarks
# and the drill keep the JVM's default, as does a stack brought up by
# make stack-up (which make test then uses as it is).
TEST_ENGINE_JAVA_OPTS ?= -XX:TieredStopAtLevel=1
test: export ENGINE_JAVA_OPTS = $(TEST_ENGINE_JAVA_OPTS)
test:
	@scripts/tools.sh
	@rm -rf $(TEST_JSON)
	@rc=0; \
	$(STACK) with $(MAKE) --no-print-directory -k -j2 test-go test-k8s || rc=$$?; \
	$(MAKE) --no-print-directory test-engines || rc=$$?; \
	$(GO) run ./tools/testsummary $(TEST_JSON)/*.json || true; \
	exit $$rc

# gotestsum runs go test and prints its usual output (standard-quiet),
# keeping the -json events beside it for the summary: a well-kept tool for
# exactly that, instead of a tee and a re-render of our own.
TEST_JSON := .cache/test
GOTESTSUM = $(shell scripts/tools.sh gotestsum) --format standard-quiet

# The whole suite against ENGINE's stack, which must be up, two packages
# at a time (go test's one per core here). The packages mostly wait (the
# suite used 7 of its 25 CPU-minutes on two cores), and four at once took
# 411 s where two took 518 s; but the packages share one Postgres, and at
# four the checks that VACUUM removes what a step deleted met another
# package's hold on the horizon (the drill's smoke, a rebuild test) in two
# clean-clone runs of three. GOTEST_PACKAGES=4 for a faster local run.
GOTEST_PACKAGES ?= 2
# go test starts packages in the order it is given them: the longest first,
# so that no long one starts last beside an idle slot (tools/bench started
# at 416 s of 543 and ran alone for its last 46 s). The slowest packages
# are in the summary at the end of each make test.
GOTEST_FIRST := ./e2e ./tools/bench ./console ./outbox ./consume ./cli
test-go: test-binary
	@mkdir -p $(TEST_JSON)
	@$(STACK) exec env WLPROJ_TEST_BINARY=$(CURDIR)/$(TEST_BINARY) $(GOTESTSUM) --jsonfile $(TEST_JSON)/$(ENGINE).json -- $(GOTEST_FLAGS) -p $(GOTEST_PACKAGES) $(GOTEST_FIRST) ./...

# The binary every test process of a run drives (harness.Binary), built
# once: each process linking its own cost about 20 links a run.
TEST_BINARY := .cache/bin/wlproj-test
test-binary:
	@mkdir -p $(dir $(TEST_BINARY))
	@$(GO) build -o $(TEST_BINARY) .

# The Kubernetes manifests' checks: deploy/k8s is a Go module of its own
# (the Kubernetes API types and kustomize stay out of wlproj's go.mod),
# which ./... does not reach. Offline but one: TestPodUnderPodman builds the
# image and runs the pod under podman against ENGINE's stack, which must be
# up (test runs it inside `stack.sh with`, beside test-go: make -j2).
test-k8s:
	@cd deploy/k8s && $(GO) test $(GOTEST_FLAGS) ./...

# The engine-facing tests against ENGINE's stack, which must be up.
test-engine: test-binary engine-run
engine-run:
	@mkdir -p $(TEST_JSON)
	@$(STACK) exec env WLPROJ_TEST_BINARY=$(CURDIR)/$(TEST_BINARY) $(GOTESTSUM) --jsonfile $(TEST_JSON)/$(ENGINE)-engine-facing.json -- $(GOTEST_FLAGS) -run '$(ENGINE_TEST_RUN)' $(ENGINE_TEST_PKGS)

# The engine-facing tests on each of ENGINES at once, each on a stack of
# its own (its own Postgres and engine node: no test sees another's), each
# one's output printed whole when it ends. They mostly wait on the engines
# (timeouts, retries, restarts): on fresh clones, side by side the three
# took 126 and 136 s where one after the other they took 199 s in the same
# sitting.
# The distributions are fetched one after the other first: Maven's local
# repository is not for concurrent writers. The test binary is built once.
test-engines: test-binary
	@for e in $(ENGINES); do ENGINE=$$e $(STACK) fetch || exit 1; done
	@mkdir -p $(TEST_JSON); engines=($(ENGINES)); pids=(); rc=0; \
	[ $${#engines[@]} = 0 ] || echo "engine-facing runs of $${engines[*]} at once; each one's output follows when it ends"; \
	for e in "$${engines[@]}"; do \
		ENGINE=$$e $(STACK) with $(MAKE) --no-print-directory engine-run >$(TEST_JSON)/$$e.log 2>&1 & pids+=($$!); \
	done; \
	for i in "$${!engines[@]}"; do \
		wait $${pids[$$i]} || rc=$$?; echo "--- $${engines[$$i]}:"; cat $(TEST_JSON)/$${engines[$$i]}.log; \
	done; exit $$rc

# Rewrites testdata/$(ENGINE)/, the engine's answers the classifier relies
# on. It lowers a node-wide circuit breaker for a moment: give it a stack of
# its own, WLPROJ_STACK_ENV=.stack/capture.env make capture ENGINE=….
capture:
	@$(STACK) with $(GO) test -count=1 -run '^TestEngineResponses$$' ./classify -update

demo:
	@scripts/demo.sh

# Benchmarks (not tests): every step that runs wlproj under load runs two
# replicas, a leader and a standby, with the database's health beside its
# figures; the soak step alone takes 30 minutes
# (BENCH_FLAGS='-steps soak -soak-duration 5m' is shorter). BENCH_SMOKE=1
# runs every step on tiny sizes; the smoke mode also runs inside `make test`
# (tools/bench/bench_test.go). A run that is not a smoke run then rewrites
# the README's headline table and the soak picture from every results file
# (results.json among them: commit the run under a name of its own).
BENCH_OUT ?= tools/bench/results/results.json
bench:
	@$(STACK) with env BENCH_OUT=$(BENCH_OUT) BENCH_SMOKE=$(BENCH_SMOKE) $(GO) run ./tools/bench $(BENCH_FLAGS)
	@if [ "$(BENCH_SMOKE)" != 1 ]; then $(GO) run ./tools/bench -headline README.md tools/bench/results/*.json; fi

# Unattended failover drill on the real stack, two replicas throughout, a
# 3-minute soak at 1,000 events/s first (DRILL_FLAGS='-scenarios soak' runs
# it alone); writes tools/drill/report.json.
# Its stack has a Postgres standby (PG_STANDBY=1), which postgres-failover
# promotes.
# Then the model test (consume/model_test.go) on MODEL_SEEDS random seeds,
# each printed so a failing one can be run alone (WLPROJ_MODEL_SEED=n).
MODEL_SEEDS ?= 200
# The drill's stack is an engine cluster, for engine-node-loss (a stack
# already up is used as it is).
DRILL_ENGINE_NODES ?= 3
drill:
	@scripts/tools.sh
	@PG_STANDBY=1 ENGINE_NODES=$(DRILL_ENGINE_NODES) $(STACK) with $(GO) run ./tools/drill $(DRILL_FLAGS)
	@$(STACK) with env WLPROJ_MODEL_SEEDS=$(MODEL_SEEDS) $(GO) test -count=1 -timeout 30m -run '^TestModelRandomHistories$$' ./consume

lint:
	@fmt=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$fmt" ]; then echo "gofmt needed:"; echo "$$fmt"; exit 1; fi
	$(GO) vet ./...
	@if command -v staticcheck >/dev/null || $(GO) install honnef.co/go/tools/cmd/staticcheck@latest; then \
		PATH="$$PATH:$$($(GO) env GOPATH)/bin" staticcheck ./...; fi

clean:
	rm -rf bin
