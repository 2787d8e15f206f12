# syntax=docker/dockerfile:1
#
# idemd container image: a multi-stage build of the one `idemd` binary onto a
# distroless runtime (glibc + libgcc, no shell, no package manager), run as
# the distroless `nonroot` user (65532). Build from the repository root:
#
#   docker build -t idemd:0.1.0 .
#
# The binary writes nothing but the embedded store's directory
# (IDEMD_DATA_DIR=/var/lib/idemd, owned by 65532), so the container runs with
# a read-only root filesystem. gRPC (and grpc.health.v1) on 50051, Prometheus
# metrics on 9464 (/metrics). `idemd migrate` runs the CQL migrations.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=trixie
ARG DISTROLESS_RELEASE=debian13

FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS build
WORKDIR /src
# Everything the build reads and nothing else (.dockerignore is an allowlist).
# build.rs uses a vendored protoc; aws-lc-sys (rustls) builds with the
# image's gcc (its cc builder, no cmake).
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY migrations ./migrations
COPY src ./src
COPY tests ./tests
COPY examples ./examples
# Registry and target caches persist between builds (BuildKit); the binary is
# copied out of the cache mount so that the next stage can read it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin idemd \
 && mkdir -p /out/data \
 && cp target/release/idemd /out/idemd

FROM gcr.io/distroless/cc-${DISTROLESS_RELEASE}:nonroot AS runtime
LABEL org.opencontainers.image.title="idemd" \
      org.opencontainers.image.description="gRPC service that makes state-changing operations safe to retry" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/idemd /usr/local/bin/idemd
# The embedded store's directory, writable by the runtime user; mount a
# volume here (the Helm chart mounts a PersistentVolumeClaim).
COPY --from=build --chown=65532:65532 /out/data /var/lib/idemd
ENV IDEMD_DATA_DIR=/var/lib/idemd
WORKDIR /var/lib/idemd
USER 65532:65532
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/idemd"]
