# idemd developer entry points. `make test` is what CI runs (.ci/run).
CARGO ?= cargo

.PHONY: all build release test fmt-check clippy cargo-test run clean

all: build

build:
	$(CARGO) build

release:
	$(CARGO) build --release

## test: everything CI checks, from a fresh machine.
test: fmt-check clippy cargo-test

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --all-targets -- -D warnings

cargo-test:
	$(CARGO) test --all-targets
	$(CARGO) test --doc

run:
	$(CARGO) run --release

clean:
	$(CARGO) clean
