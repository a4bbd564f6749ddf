# syntax=docker/dockerfile:1
# csi-attacher-rs image: one static binary on an empty base, for linux/amd64
# and linux/arm64.
#
#   docker build --build-arg GIT_COMMIT=$(git rev-parse HEAD) -t csi-attacher-rs:v0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg GIT_COMMIT=$(git rev-parse HEAD) \
#     --build-arg SOURCE_DATE_EPOCH=$(git log -1 --format=%ct) \
#     -t csi-attacher-rs:v0.1.0 .
#   docker build --build-arg USER=65532:65532 -t csi-attacher-rs:v0.1.0-nonroot .
#
# The build stage runs on the builder's own platform and cross-compiles for
# the one asked for (TARGETARCH): no emulation, and the same commands as
# hack/cross-aarch64.sh, which CI runs for arm64 (and runs the result under
# qemu-user). The context has no .git (.dockerignore), so the commit that
# --version and csi_attacher_build_info report comes from GIT_COMMIT.
#
# The binary is a static-pie (glibc, crt-static): no loader, no libc in the
# image; it runs with a read-only root filesystem. cargo-auditable embeds the
# dependency list (name, version, source of every crate) in a `.dep-v0`
# section: `syft`, `trivy` and `cargo audit bin` read it as the SBOM.
#
# The default image runs as root, like upstream's (distroless static, no
# USER): drivers create their socket as root with the default umask
# (srwxr-xr-x root), and connecting to a Unix socket needs write permission
# on it, so a non-root attacher cannot use such a socket. The non-root
# variant is for drivers whose socket is writable for the attacher's user or
# group.
# The builder is pinned to a Rust release (the toolchain CI builds and tests
# with), not the floating `1-bookworm`: a later `docker build` gets the same
# compiler. Pin its digest too where the registry is reachable
# (`rust:1.95.0-bookworm@sha256:...`): this project's machines reach only the
# package registries, not Docker Hub, so no digest is recorded here.
FROM --platform=$BUILDPLATFORM docker.io/library/rust:1.95.0-bookworm AS build
ARG TARGETARCH
ARG BUILDARCH
# The Rust target and Debian's C toolchain for it (ring and mimalloc compile C).
RUN set -eu; \
    case "$TARGETARCH" in \
      amd64) triple=x86_64-unknown-linux-gnu; gnu=x86_64-linux-gnu; cross="gcc-x86-64-linux-gnu libc6-dev-amd64-cross" ;; \
      arm64) triple=aarch64-unknown-linux-gnu; gnu=aarch64-linux-gnu; cross="gcc-aarch64-linux-gnu libc6-dev-arm64-cross" ;; \
      *) echo "unsupported TARGETARCH=$TARGETARCH: linux/amd64 and linux/arm64 are built" >&2; exit 1 ;; \
    esac; \
    if [ "$TARGETARCH" != "$BUILDARCH" ]; then \
      apt-get update; \
      apt-get install -y --no-install-recommends $cross; \
      rm -rf /var/lib/apt/lists/*; \
    fi; \
    rustup target add "$triple"; \
    printf '%s\n' "$triple" > /target-triple; \
    printf '%s\n' "$gnu" > /target-gnu
RUN cargo install --locked cargo-auditable@0.7.7
WORKDIR /src
COPY . .
ARG GIT_COMMIT=
ARG SOURCE_DATE_EPOCH=
RUN set -eu; \
    triple=$(cat /target-triple); gnu=$(cat /target-gnu); \
    env=$(printf '%s' "$triple" | tr 'a-z-' 'A-Z_'); \
    export "CARGO_TARGET_${env}_LINKER=$gnu-gcc" \
           "CARGO_TARGET_${env}_RUSTFLAGS=-C target-feature=+crt-static" \
           "CC_$(printf '%s' "$triple" | tr '-' '_')=$gnu-gcc" \
           "AR_$(printf '%s' "$triple" | tr '-' '_')=$gnu-ar" \
           CSI_ATTACHER_GIT_COMMIT="$GIT_COMMIT" SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH"; \
    cargo auditable build --locked --release --target "$triple" --bin csi-attacher; \
    cp "target/$triple/release/csi-attacher" /csi-attacher

FROM scratch
# uid:gid the attacher runs as; numeric, as scratch has no /etc/passwd.
ARG USER=0:0
# Cargo.toml's version (tests/release.rs keeps them equal).
ARG VERSION=0.1.0
ARG GIT_COMMIT=
LABEL org.opencontainers.image.title="csi-attacher-rs" \
      org.opencontainers.image.description="Kubernetes CSI external-attacher sidecar: makes VolumeAttachments true with ControllerPublish/Unpublish" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${GIT_COMMIT}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /csi-attacher /csi-attacher
COPY LICENSE /LICENSE
USER ${USER}
ENTRYPOINT ["/csi-attacher"]
