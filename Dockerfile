# Multi-stage build of a static csi-attacher binary on an empty base.
# Build: docker build -t csi-attacher-rs .
FROM rust:1-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl && apt-get update && apt-get install -y --no-install-recommends musl-tools && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --locked --release --target x86_64-unknown-linux-musl --bin csi-attacher

FROM scratch
COPY --from=build /src/target/x86_64-unknown-linux-musl/release/csi-attacher /csi-attacher
USER 65532:65532
ENTRYPOINT ["/csi-attacher"]
