#!/usr/bin/env bash
# Cross-compiles the release binary for linux/arm64 exactly as the Dockerfile
# does for TARGETARCH=arm64 (static glibc, crt-static; dependency list
# embedded by cargo-auditable), checks what it produced, and runs
# `--version` under qemu-user.
#
#   hack/cross-aarch64.sh        → target/aarch64-unknown-linux-gnu/release/csi-attacher
#   hack/cross-aarch64.sh --dev  → target/aarch64-unknown-linux-gnu/debug/csi-attacher (CI)
#
# What both check: the cross toolchain links a static (crt-static glibc, no
# interpreter, no NEEDED) AArch64 ELF; cargo-auditable embedded the dependency
# list (.dep-v0, read back, and still there after `strip`); the binary starts
# on arm64 and prints the expected `--version` (qemu-user).
# What --dev does not check: the release profile's code generation for arm64
# (opt-level 3, thin LTO, codegen-units, strip = true), i.e. the Dockerfile's
# exact build. It compiles the dev profile instead (no optimisation, several
# times cheaper; host build scripts and proc macros are those the tests built)
# and strips a copy with binutils for the .dep-v0 check.
#
# Installs what is missing: Debian's gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross and qemu-user; rustup's aarch64 standard library;
# cargo-auditable (pinned).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target=aarch64-unknown-linux-gnu
profile=release
case "${1:-}" in
  "") ;;
  --dev) profile=dev ;;
  *) echo "usage: hack/cross-aarch64.sh [--dev]" >&2; exit 2 ;;
esac
auditable_version=0.7.7

packages=()
command -v aarch64-linux-gnu-gcc >/dev/null || packages+=(gcc-aarch64-linux-gnu)
[ -f /usr/aarch64-linux-gnu/lib/libc.a ] || packages+=(libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || command -v qemu-aarch64-static >/dev/null || packages+=(qemu-user)
command -v readelf >/dev/null && command -v objcopy >/dev/null || packages+=(binutils)
if ((${#packages[@]})); then
  echo "cross-aarch64: installing ${packages[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi
rustup target list --installed | grep -qx "$target" || rustup target add "$target"
if ! cargo install --list | grep -qx "cargo-auditable v$auditable_version:"; then
  nice -n 10 cargo install --locked --quiet "cargo-auditable@$auditable_version"
fi

# The Dockerfile's build line, for arm64.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static"
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
nice -n 10 cargo auditable build --locked --profile "$profile" --target "$target" --bin csi-attacher
dir=$profile; [ "$profile" = dev ] && dir=debug
bin=${CARGO_TARGET_DIR:-target}/$target/$dir/csi-attacher

fail() { echo "cross-aarch64: $bin: $*" >&2; exit 1; }
if [ "$profile" = dev ]; then
  # The release profile strips (strip = true); strip this build the same way
  # (all symbols) so the checks below see what a stripped binary keeps.
  aarch64-linux-gnu-strip --strip-all -o "$bin.stripped" "$bin"
  bin=$bin.stripped
fi
headers=$(readelf --file-header --program-headers --section-headers --wide "$bin")
grep -q 'Machine:.*AArch64' <<<"$headers" || fail "not an AArch64 binary"
# Static: no program interpreter, no shared libraries to load.
! grep -q 'INTERP' <<<"$headers" || fail "has a program interpreter (dynamically linked)"
! readelf --dynamic "$bin" | grep -q NEEDED || fail "needs shared libraries"
# cargo-auditable's compressed dependency list (the binary's SBOM).
grep -q '\.dep-v0' <<<"$headers" || fail "has no .dep-v0 section (cargo auditable did not embed the dependency list)"
# Read it back: zlib-compressed JSON, one entry per crate in the binary.
sbom=$(mktemp)
trap 'rm -f "$sbom" "$sbom.elf"' EXIT
aarch64-linux-gnu-objcopy --dump-section ".dep-v0=$sbom" "$bin" "$sbom.elf" && rm -f "$sbom.elf"
crates=$(python3 -c 'import json,sys,zlib; d=json.loads(zlib.decompress(open(sys.argv[1],"rb").read())); n={p["name"] for p in d["packages"]}; assert {"csi-attacher","tokio","kube-client","tonic"} <= n, n; print(len(d["packages"]))' "$sbom") \
  || fail "the embedded dependency list does not read back"

qemu=$(command -v qemu-aarch64 || command -v qemu-aarch64-static)
version=$("$qemu" "$bin" --version)
echo "cross-aarch64: $version"
[[ $version == "$bin $(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "csi-attacher"))') (commit "* ]] \
  || fail "unexpected --version output: $version"
echo "cross-aarch64: ok ($(stat -c %s "$bin") bytes, static, AArch64, $crates crates in the embedded dependency list, runs under $(basename "$qemu"))"
