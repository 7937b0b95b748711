# syntax=docker/dockerfile:1
# nodeguard from source with Docker: one static musl binary on an empty (scratch) image, for
# linux/amd64 and linux/arm64.
#   docker buildx build --platform linux/arm64,linux/amd64 -t REGISTRY/nodeguard:0.1.0 --push .
# The released image is not built here: scripts/image assembles it, reproducibly, from the
# binaries the suite builds and tests (docs/release.md). This is the path for Docker users who
# build their own; its digest differs from the release's (BuildKit's own layer tar and times).
# The build stage runs on the builder's own platform and cross-compiles (no emulation); the
# linkers are set in .cargo/config.toml (aarch64) and below (x86_64 from an arm64 builder).
# Checked statically by scripts/ship-check (checkov, stages, build context, cargo auditable); the
# same static builds are made and tested by scripts/cross-test and scripts/release-check.
# Choices: docs/deploy.md ("Image").

ARG RUST_VERSION=1.95
ARG CARGO_AUDITABLE_VERSION=0.7.7

FROM --platform=$BUILDPLATFORM rust:${RUST_VERSION}-slim-bookworm AS build
ARG TARGETARCH
ARG BUILDARCH
ARG CARGO_AUDITABLE_VERSION
# The source revision for nodeguard_build_info{revision} (the build context has no .git):
#   --build-arg NODEGUARD_REVISION=$(git rev-parse --short=12 HEAD)
ARG NODEGUARD_REVISION=
# cargo auditable embeds the dependency list (.dep-v0) so scanners (cargo audit bin, trivy, syft,
# grype) can read what the binary holds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    cargo install --locked "cargo-auditable@${CARGO_AUDITABLE_VERSION}"
# The rust image has the native gcc; a cross build adds the other architecture's gcc as linker.
RUN set -eux; \
    case "$TARGETARCH" in \
      amd64) target=x86_64-unknown-linux-musl; cross=gcc-x86-64-linux-gnu ;; \
      arm64) target=aarch64-unknown-linux-musl; cross=gcc-aarch64-linux-gnu ;; \
      *) echo "unsupported TARGETARCH=$TARGETARCH" >&2; exit 1 ;; \
    esac; \
    if [ "$TARGETARCH" != "$BUILDARCH" ]; then \
      apt-get update; \
      apt-get install -y --no-install-recommends "$cross"; \
      rm -rf /var/lib/apt/lists/*; \
    fi; \
    rustup target add "$target"; \
    echo "$target" > /rust-target
ENV CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_LINKER=x86_64-linux-gnu-gcc
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY .cargo ./.cargo
COPY config ./config
COPY benches ./benches
COPY src ./src
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,id=nodeguard-target-${TARGETARCH} \
    set -eux; \
    target="$(cat /rust-target)"; \
    NODEGUARD_REVISION="$NODEGUARD_REVISION" \
      cargo auditable build --release --locked --target "$target" --bin nodeguard; \
    cp "target/$target/release/nodeguard" /nodeguard

FROM scratch
LABEL org.opencontainers.image.title="nodeguard" \
      org.opencontainers.image.description="Per-node guard for shared kernel resources" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /nodeguard /nodeguard
# Not root by default. The DaemonSet runs it as uid 0 with three capabilities, because reading
# every container's cgroup files, fds and logs needs root (docs/deploy.md, "Image").
USER 65534:65534
EXPOSE 9913
# Kubernetes probes /healthz and /readyz (the DaemonSet); scratch has no tool to run a check.
HEALTHCHECK NONE
ENTRYPOINT ["/nodeguard"]
