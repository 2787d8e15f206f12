# idemd developer entry points. `make test` is what CI runs (.ci/run) and
# what a newcomer runs: it installs what it needs (SDK toolchains'
# dependencies, Cassandra jars) from package registries into ignored caches.
CARGO ?= cargo
# Where cargo puts binaries (CI points CARGO_TARGET_DIR at a cache).
TARGET_DIR := $(abspath $(or $(CARGO_TARGET_DIR),target))
# The server binary the SDK conformance suites start.
IDEMD_BIN ?= $(TARGET_DIR)/debug/idemd
# Certificates of the SDK suites' TLS/mTLS tests, generated fresh by
# examples/test_certs.rs (no private key is committed).
IDEMD_TEST_CERTS ?= $(TARGET_DIR)/test-certs
SDKS := python go typescript java

.PHONY: all build release test fmt-check clippy cargo-test cql-test cql-scale cql-scale-smoke bench-cql-statements observability-test helm-test sdk-test $(addprefix sdk-,$(SDKS)) test-certs fuzz-smoke deny bench bench-middleware bench-proxy bench-startup bench-smoke bench-soak faults faults-smoke run clean

all: build

build:
	$(CARGO) build

release:
	$(CARGO) build --release

## test: everything CI checks, from a fresh machine.
test: fmt-check clippy deny cargo-test cql-test cql-scale-smoke observability-test helm-test sdk-test bench-smoke faults-smoke fuzz-smoke

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --all-targets --all-features -- -D warnings

# The upgrade tests (tests/it/upgrade_embedded.rs) run the previous release
# (tests/previous-release) beside this one: scripts/previous-release.sh
# builds it once into $IDEMD_TOOLS_CACHE (minutes the first time).
cargo-test:
	scripts/test-deps.sh
	previous="$$(scripts/previous-release.sh)" && \
	IDEMD_PREVIOUS_BIN="$$previous" $(CARGO) test --all-targets
	$(CARGO) test --doc

## cql-test: the store and gRPC suites, multi-replica and timeout tests on a
## real Cassandra 5.0 cluster (scripts/cassandra.sh: jars from Maven Central),
## among them the previous release and this one serving one keyspace
## (tests/cql/mixed_fleet_cql.rs; scripts/previous-release.sh builds it);
## then two datacenters of two nodes each (tests/cql_dc: quorum across both,
## local-quorum in each, a datacenter down; one test thread). Both suites run
## one test at a time: several assert bounds on what one Cassandra node answers
## under their own load (cql_cluster: at most 1% UNAVAILABLE among 6,400
## contending Claims), which a neighbour test's load on the same 2-core node
## broke in CI (1,752 of 6,400) while the test alone passed; ~70 s instead of ~40.
cql-test:
	previous="$$(scripts/previous-release.sh)" && \
	IDEMD_PREVIOUS_BIN="$$previous" scripts/with-cassandra.sh -- $(CARGO) test --features cql-tests --test cql -- --test-threads=1
	scripts/with-cassandra.sh --nodes 4 --dcs 2 -- $(CARGO) test --features cql-tests --test cql_dc -- --test-threads=1

## cql-scale: one busy tenant's day on the CQL store (docs/scylla.md, "The
## pending index"): $(CQL_SCALE_PAIRS) Claim+Complete pairs of ONE tenant
## through a release idemd, 64 in flight, on a fresh one-node Cassandra with
## default thresholds; one claim left stale. Fails unless ListPending finds it
## every time with p99 under 100 ms, the gauges show it with no refresh error,
## and no pending_buckets partition received more than the written bound.
## Prints the figures (docs/benchmarks.md); about 6 minutes.
CQL_SCALE_PAIRS ?= 250000
cql-scale:
	scripts/test-deps.sh
	$(CARGO) build --release -p idemd -p idemd-bench
	scripts/with-cassandra.sh -- $(TARGET_DIR)/release/idemd-bench cql-scale \
		--idemd-bin $(TARGET_DIR)/release/idemd --pairs $(CQL_SCALE_PAIRS) \
		--json $(TARGET_DIR)/cql-scale.json

## bench-cql-statements: what idemd sends to the CQL store, table by table,
## counted by Cassandra's own virtual tables: idle (one tenant, then 100 more),
## and per fresh pair under load (bench/scripts/cql-statements.sh; about 3
## minutes; the breakdown in docs/benchmarks.md).
bench-cql-statements:
	$(CARGO) build --release -p idemd
	scripts/with-cassandra.sh -- bench/scripts/cql-statements.sh $(TARGET_DIR)/release/idemd

## cql-scale-smoke: the same check, short (debug build, 10,000 pairs), with
## a ListPending bound for a debug build on a busy CI machine (500 ms: it
## catches a 10x regression, not a slow day).
cql-scale-smoke:
	scripts/test-deps.sh
	$(CARGO) build -p idemd -p idemd-bench
	scripts/with-cassandra.sh -- $(TARGET_DIR)/debug/idemd-bench cql-scale \
		--idemd-bin $(TARGET_DIR)/debug/idemd --pairs 10000 --list-calls 50 --list-p99-max 500ms

## observability-test: promtool check/test of deploy/prometheus (installs
## Debian's prometheus package), then a real Prometheus scraping a real idemd.
observability-test:
	deploy/prometheus/test.sh
	$(CARGO) test --features prometheus-tests --test prometheus_e2e

## helm-test: Dockerfile lint, helm lint/template of every scenario and every
## example in docs/deploy.md, strict validation against the Kubernetes types.
helm-test:
	helm/test.sh

## sdk-test: the four client SDKs against a live idemd (shared conformance suite).
sdk-test: $(addprefix sdk-,$(SDKS))

$(addprefix sdk-,$(SDKS)): build test-certs
	IDEMD_BIN=$(IDEMD_BIN) IDEMD_TEST_CERTS=$(IDEMD_TEST_CERTS) IDEMD_METRICS_LISTEN=off clients/$(@:sdk-%=%)/test.sh

## test-certs: a CA, idemd's server certificate and two client certificates
## (tenants alice and bob) for the SDK suites' TLS and mTLS tests.
## Generated once per target directory (rcgen's certificates do not expire
## before 4096), so concurrent suites never see them change under them.
test-certs: $(IDEMD_TEST_CERTS)/client-tenants.txt

$(IDEMD_TEST_CERTS)/client-tenants.txt:
	$(CARGO) run --quiet --example test_certs -- $(IDEMD_TEST_CERTS)

## fuzz-smoke: every fuzz target (fuzz/, cargo-fuzz + libFuzzer) for a short
## interval from its seed corpus; fails on any crash, timeout or OOM.
FUZZ_SMOKE_SECONDS ?= 15
fuzz-smoke:
	fuzz/run.sh $(FUZZ_SMOKE_SECONDS)

## deny: cargo deny check licenses bans sources (deny.toml; offline-capable).
deny:
	scripts/deny.sh

## bench: the comparison of issue 7 (docs/benchmarks.md): idemd against a
## no-op gRPC server, Postgres and Redis (Debian packages, installed when
## missing) and raw CQL LWTs on a local Cassandra; 3 runs round-robin,
## medians, ratios for P1-P5; then one request in flight through the Rust
## client, ghz and the Go SDK (bench/scripts/tools.sh installs ghz and
## builds the loop); writes bench/results/<time>.{md,json,png}. Then idemd
## beside svix/diom (`idemd-bench peers`, bench/results/<time>-peers.md):
## IDEMD_DIOM names diom's source (tarball or directory) or a built
## diom-server, built once into the tools cache by bench/scripts/diom.sh;
## without it diom is skipped, and the run says so.
BENCH_ARGS ?= --runs 3 --pin
PEERS_ARGS ?= --rounds 3
bench:
	$(CARGO) build --release -p idemd -p idemd-bench
	bench/scripts/postgres.sh >/dev/null
	bench/scripts/redis.sh >/dev/null
	tools="$$(bench/scripts/tools.sh | tail -n 1)" && \
	scripts/with-cassandra.sh -- $(TARGET_DIR)/release/idemd-bench compare \
		--require-cql --out-dir bench/results \
		--ghz "$$tools/ghz" --go-sdk-loop "$$tools/bench-go-loop" $(BENCH_ARGS) && \
	diom="$$(bench/scripts/diom.sh | tail -n 1)" && \
	$(TARGET_DIR)/release/idemd-bench peers --peer-load "$$tools/peer-load" \
		$${diom:+--diom-bin "$$diom"} --out-dir bench/results $(PEERS_ARGS)

## bench-proxy: the overhead of `idemd proxy` against calling its upstream
## directly, with wrk (installed from Debian), at 1 and 64 in flight.
## bench-startup: restart time of the embedded store at 10^5, 10^6 and 10^7
## records (filled in-process), warm and with the page cache dropped (needs
## root; skipped and said otherwise), after a clean stop and after kill -9
## under load; then `idemd backup` of the 10^7 store under load. Needs ~8 GB
## of disk under $(STARTUP_DIR) (kept: a second run skips the fill).
STARTUP_DIR ?= $(TARGET_DIR)/startup-store
bench-startup:
	$(CARGO) build --release -p idemd -p idemd-bench
	$(TARGET_DIR)/release/idemd-bench startup --idemd-bin $(TARGET_DIR)/release/idemd \
		--sizes 100000,1000000,10000000 --dir $(STARTUP_DIR) --backup \
		--json $(TARGET_DIR)/bench-startup.json

bench-proxy:
	$(CARGO) build --release -p idemd -p idemd-bench
	CARGO_TARGET_DIR=$(TARGET_DIR) bench/scripts/proxy.sh $(PROXY_BENCH_DURATION)

## bench-middleware: what each SDK's HTTP middleware costs: per framework the
## same app without and with it, fresh keys and replays at 1 and 64 in flight,
## with wrk (installed from Debian) against a release idemd
## (bench/scripts/middleware.sh; FRAMEWORKS="nethttp express" for a subset).
bench-middleware:
	$(CARGO) build --release -p idemd
	IDEMD_BIN=$(TARGET_DIR)/release/idemd bench/scripts/middleware.sh

## bench-smoke: builds the bench and runs a few seconds of idemd-embedded and
## the no-op server (fresh, conflict) and a short one-in-flight phase through
## the Rust client, ghz (via reflection) and the Go SDK loop; fails on any
## error or on a key with two winners. No Cassandra; results go to
## $(TARGET_DIR).
bench-smoke:
	$(CARGO) build -p idemd -p idemd-bench
	tools="$$(bench/scripts/tools.sh | tail -n 1)" && \
	$(TARGET_DIR)/debug/idemd-bench compare --systems noop,idemd-embedded \
		--workloads fresh,conflict --runs 1 --duration 3s --warmup 1s \
		--p5-inflight 0 --no-open-loop --idemd-bin $(TARGET_DIR)/debug/idemd \
		--ghz "$$tools/ghz" --go-sdk-loop "$$tools/bench-go-loop" --client-calls 50 --ghz-duration 3s \
		--out-dir $(TARGET_DIR)/bench-smoke && \
	diom="$$(bench/scripts/diom.sh | tail -n 1)" && \
	$(TARGET_DIR)/debug/idemd-bench peers --peer-load "$$tools/peer-load" \
		$${diom:+--diom-bin "$$diom"} --idemd-bin $(TARGET_DIR)/debug/idemd \
		--rounds 1 --duration 1s --warmup 1s --out-dir $(TARGET_DIR)/bench-smoke

## faults-smoke: the short fault-injection profile (faults/, docs/reliability.md):
## 10 kill -9 cycles, 2 SIGSTOP pauses, a torn log tail, a damaged database
## file, 10 disk images (ext4 on a loop device: needs root), kills inside
## the file's resizes and a full disk (a tmpfs in a mount namespace of its own, `unshare
## -rm`) under careful clients, checked for double execution, lost writes and
## claims, wrong replays and unanswered calls; then, on a 3-node Cassandra
## cluster, one replica's clock moved ±3 s and the three partitions (inside a
## user and network namespace of the suite's own, cut with nftables), 6 s
## each; then two datacenters of two nodes cut from each other. About 5
## minutes.
faults-smoke:
	scripts/test-deps.sh
	$(CARGO) test -p idemd-faults
	$(CARGO) build -p idemd -p idemd-faults
	$(TARGET_DIR)/debug/idemd-faults --profile short --idemd-bin $(TARGET_DIR)/debug/idemd

## faults: the full profile (release build): 100 kill -9 cycles, 3 full disks, 12 clients,
## then a 3-node Cassandra cluster (scripts/cassandra.sh) under two idemd
## replicas (commitlog_sync: batch): a node killed and restarted, a node
## paused (SIGSTOP) past the request timeout, one replica's clock moved ±3 s
## (libfaketime), the previous release and this one serving together
## through a rolling update (cql-mixed-fleet), quorum lost and regained three
## times in a row, the whole cluster SIGKILLed and restarted three times;
## then the partitions (a node cut off, a replica cut from a quorum, a
## majority/minority split; 10 s each) on a cluster in a network namespace of
## the suite's own. The figures of docs/reliability.md come from it. About 13
## minutes.
faults:
	scripts/test-deps.sh
	$(CARGO) build --release -p idemd -p idemd-faults
	previous="$$(scripts/previous-release.sh)" && \
	$(TARGET_DIR)/release/idemd-faults --profile full --idemd-bin $(TARGET_DIR)/release/idemd \
		--previous-bin "$$previous" --json $(TARGET_DIR)/faults.json

## bench-soak: P5's soak: idemd-embedded, mixed workload, open loop at 50% of
## the measured maximum for $(SOAK); fails on errors or RSS growth.
SOAK ?= 10m
bench-soak:
	$(CARGO) build --release -p idemd -p idemd-bench
	$(TARGET_DIR)/release/idemd-bench soak --pin --soak $(SOAK) \
		--json $(TARGET_DIR)/bench-soak.json

run:
	$(CARGO) run --release

clean:
	$(CARGO) clean
