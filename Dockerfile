# csi-attacher-rs image: one static binary on an empty base.
#   docker build -t csi-attacher-rs:v0.1.0 .
#   docker build --build-arg USER=65532:65532 -t csi-attacher-rs:v0.1.0-nonroot .
# The binary is a static-pie (glibc, crt-static): no loader, no libc in the
# image; it runs with a read-only root filesystem.
#
# The default image runs as root, like upstream's (distroless static, no
# USER): drivers create their socket as root with the default umask
# (srwxr-xr-x root), and connecting to a Unix socket needs write permission
# on it, so a non-root attacher cannot use such a socket. The non-root
# variant is for drivers whose socket is writable for the attacher's user or
# group.
FROM docker.io/library/rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --locked --release --target x86_64-unknown-linux-gnu --bin csi-attacher \
 && cp target/x86_64-unknown-linux-gnu/release/csi-attacher /csi-attacher

FROM scratch
# uid:gid the attacher runs as; numeric, as scratch has no /etc/passwd.
ARG USER=0:0
COPY --from=build /csi-attacher /csi-attacher
USER ${USER}
ENTRYPOINT ["/csi-attacher"]
