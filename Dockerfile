# csi-attacher-rs image: one static binary on an empty base, non-root.
#   docker build -t csi-attacher-rs:v0.1.0 .
# The binary is a static-pie (glibc, crt-static): no loader, no libc in the
# image; it runs with a read-only root filesystem.
FROM docker.io/library/rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --locked --release --target x86_64-unknown-linux-gnu --bin csi-attacher \
 && cp target/x86_64-unknown-linux-gnu/release/csi-attacher /csi-attacher

FROM scratch
COPY --from=build /csi-attacher /csi-attacher
USER 65532:65532
ENTRYPOINT ["/csi-attacher"]
