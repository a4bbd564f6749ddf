#!/usr/bin/env bash
# Builds the csi-attacher-rs image (an OCI image index for linux/amd64 and
# linux/arm64) without a container engine, pushes it to a registry on
# loopback, pulls it back and checks it. What the image is comes from the
# Dockerfile's final stage (hack/image.py reads it): /csi-attacher and
# /LICENSE on an empty base, its labels, USER and ENTRYPOINT.
#
#   hack/image.sh                          release static binaries, built here as the Dockerfile does
#   hack/image.sh --bin-amd64 P --bin-arm64 P   binaries built already (checked as strictly)
#   hack/image.sh --dev                    CI's binaries (see below), two checks relaxed for amd64
#   ... --user 65532:65532                 the non-root variant (tag v<version>-nonroot)
#   ... --tag TAG                          the tag (default v<version>, from the Dockerfile's ARG VERSION)
#   ... --push-to REF                      after the checks pass, push the index to REF
#                                          (log in first: crane auth login REGISTRY -u USER -p ...)
#
# Tools: crane (go-containerregistry v0.22.1, hack/tools-crane, built by
# hack/build-gotool.sh from the Go module proxy and cached), python3, GNU tar.
#
# Steps:
# 1. Inputs. Without flags: `cargo auditable build --release` for
#    x86_64-unknown-linux-gnu with +crt-static (the Dockerfile's build line;
#    this host must be x86_64), and hack/cross-aarch64.sh for arm64 (which
#    checks its own output and runs it under qemu-user); both with
#    CSI_ATTACHER_GIT_COMMIT and SOURCE_DATE_EPOCH set, as the Dockerfile's
#    build arguments do.
#    --dev takes what CI built already: target/debug/csi-attacher (the test
#    build: dev profile, dynamically linked, no cargo-auditable) and
#    target/cross-aarch64/aarch64-unknown-linux-gnu/debug/csi-attacher.stripped
#    (hack/cross-aarch64.sh --dev with CARGO_TARGET_DIR=target/cross-aarch64),
#    unless --bin-amd64/--bin-arm64 name others; it strips copies of them, as
#    the release profile does (strip = true). The only checks it relaxes: the
#    amd64 binary may be dynamically linked and may lack the embedded
#    dependency list (it says so in its output). Everything else is checked
#    as in the full mode.
# 2. One layer per platform: /csi-attacher (0755) and /LICENSE (0644), owner
#    0:0, mtime SOURCE_DATE_EPOCH (else the commit's time), sorted: a
#    reproducible tarball. crane appends it to an empty OCI base in an
#    assembly registry on 127.0.0.1; the config is written whole
#    (hack/image.py config: os/architecture, created = that same time, the
#    Dockerfile's labels, USER and ENTRYPOINT) with `crane edit config`;
#    `crane index append` makes the index, pulled into an OCI layout.
# 3. A second `crane registry serve` on 127.0.0.1 (a free port): the layout is
#    pushed there, pulled back into ${CARGO_TARGET_DIR:-target}/image/oci,
#    and checked (hack/image.py check): the pulled index's digest is the one
#    pushed, every blob hashes to its digest; linux/amd64 and linux/arm64
#    once each, every config's os/architecture, created, Entrypoint, User and
#    Labels exactly as the Dockerfile makes them (with the commit as
#    revision, and nothing else in the config); each layer holds exactly
#    /csi-attacher and /LICENSE (the repository's), owned by 0:0, with the
#    fixed mtime and modes; each binary's ELF machine (x86-64, AArch64), that
#    it is static (no interpreter, no NEEDED), its .dep-v0 dependency list;
#    the amd64 binary taken from the pulled layer runs and `--version` prints
#    the label's version and the commit (and the build date, when this
#    script built it); the arm64 one too under qemu-aarch64 when installed.
#    Any mismatch exits 1 and names it. The registries are stopped on exit.
#
# The commit is CSI_ATTACHER_GIT_COMMIT if set, else `git rev-parse HEAD`; the
# binaries must report that commit.
#
# Not done: signing. cosign (github.com/sigstore/cosign) is not on the list of
# Go modules known to build from the module proxy on this project's machines,
# so it was not tried, and no signature is made or checked here; sign the
# pushed digest with a cosign of your own (`cosign sign --key ... REF@DIGEST`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() {
  echo "usage: hack/image.sh [--dev] [--bin-amd64 PATH --bin-arm64 PATH] [--user UID:GID] [--tag TAG] [--push-to REF]" >&2
  exit 2
}
die() { echo "image: $*" >&2; exit 1; }

dev=false bin_amd64= bin_arm64= user= tag= push_to=
while (($#)); do
  case "$1" in
    --dev) dev=true ;;
    --bin-amd64) [ $# -ge 2 ] || usage; bin_amd64=$2; shift ;;
    --bin-arm64) [ $# -ge 2 ] || usage; bin_arm64=$2; shift ;;
    --user) [ $# -ge 2 ] || usage; user=$2; shift ;;
    --tag) [ $# -ge 2 ] || usage; tag=$2; shift ;;
    --push-to) [ $# -ge 2 ] || usage; push_to=$2; shift ;;
    *) usage ;;
  esac
  shift
done
if ! $dev && { [ -n "$bin_amd64" ] || [ -n "$bin_arm64" ]; } && { [ -z "$bin_amd64" ] || [ -z "$bin_arm64" ]; }; then
  die "--bin-amd64 and --bin-arm64 go together (or neither: the script builds both)"
fi
[ -z "$user" ] || [[ $user =~ ^[0-9]+(:[0-9]+)?$ ]] || die "--user $user: numeric UID[:GID] (the image has no /etc/passwd)"
for tool in python3 tar go; do
  command -v "$tool" >/dev/null || die "$tool is required but missing"
done

target_dir=${CARGO_TARGET_DIR:-target}
commit=${CSI_ATTACHER_GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null)} || die "no commit: not in a git checkout and CSI_ATTACHER_GIT_COMMIT is unset"
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null)} || die "no time: not in a git checkout and SOURCE_DATE_EPOCH is unset"
[[ $epoch =~ ^[0-9]+$ ]] || die "SOURCE_DATE_EPOCH=$epoch is not a number of seconds"
version=$(sed -n 's/^ARG VERSION=//p' Dockerfile | tail -n 1)
[ -n "$version" ] || die "no ARG VERSION in the Dockerfile"
if [ -z "$tag" ]; then
  tag=v$version
  [ -z "$user" ] || [ "$user" = 0:0 ] || tag=$tag-nonroot
fi

crane=$(hack/build-gotool.sh tools-crane crane github.com/google/go-containerregistry/cmd/crane | tail -n 1)

work=$(mktemp -d)
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# crane's progress lines go to a log, shown when a step fails.
c() {
  if ! "$crane" "$@" 2>>"$work/crane.log"; then
    tail -n 20 "$work/crane.log" >&2
    die "crane $1 failed"
  fi
}

# --- 1. Inputs --------------------------------------------------------------
built=
if $dev; then
  bin_amd64=${bin_amd64:-$target_dir/debug/csi-attacher}
  bin_arm64=${bin_arm64:-target/cross-aarch64/aarch64-unknown-linux-gnu/debug/csi-attacher.stripped}
  [ -f "$bin_amd64" ] || die "--dev: $bin_amd64 missing (the test build makes it: hack/test.sh, or cargo build --bin csi-attacher)"
  [ -f "$bin_arm64" ] || die "--dev: $bin_arm64 missing (CARGO_TARGET_DIR=target/cross-aarch64 hack/cross-aarch64.sh --dev makes it)"
  echo "image: --dev: the linux/amd64 input ($bin_amd64) need not be static nor carry the dependency list; every other check as in the full mode"
elif [ -z "$bin_amd64" ]; then
  [ "$(uname -m)" = x86_64 ] || die "the full mode builds amd64 natively and runs it: this host is $(uname -m) (give --bin-amd64 and --bin-arm64)"
  export CSI_ATTACHER_GIT_COMMIT=$commit SOURCE_DATE_EPOCH=$epoch
  echo "image: building linux/arm64 (hack/cross-aarch64.sh, release)"
  hack/cross-aarch64.sh
  echo "image: building linux/amd64 (release, static)"
  export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER=x86_64-linux-gnu-gcc
  export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static"
  export CC_x86_64_unknown_linux_gnu=x86_64-linux-gnu-gcc AR_x86_64_unknown_linux_gnu=x86_64-linux-gnu-ar
  nice -n 10 cargo auditable build --locked --release --target x86_64-unknown-linux-gnu --bin csi-attacher
  bin_amd64=$target_dir/x86_64-unknown-linux-gnu/release/csi-attacher
  bin_arm64=$target_dir/aarch64-unknown-linux-gnu/release/csi-attacher
  built=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
fi
for f in "$bin_amd64" "$bin_arm64"; do [ -f "$f" ] || die "$f: no such file"; done

# --- 2. Layers, configs, the index -------------------------------------------
start_registry() { # start_registry NAME: sets port
  local log="$work/registry-$1.log" i
  "$crane" registry serve --address 127.0.0.1:0 >"$log" 2>&1 &
  pids+=($!)
  for i in $(seq 100); do
    port=$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$log")
    [ -z "$port" ] || return 0
    kill -0 "${pids[-1]}" 2>/dev/null || { cat "$log" >&2; die "crane registry serve ($1) exited"; }
    sleep 0.1
  done
  die "crane registry serve ($1) did not say its port within 10 s"
}
start_registry assembly
assembly=127.0.0.1:$port/csi-attacher-rs

for arch in amd64 arm64; do
  src=bin_$arch
  src=${!src}
  root=$work/root-$arch
  mkdir -p "$root"
  cp "$src" "$root/csi-attacher"
  if $dev; then
    strip_tool=strip
    [ "$arch" = arm64 ] && strip_tool=aarch64-linux-gnu-strip
    if command -v "$strip_tool" >/dev/null; then
      "$strip_tool" --strip-all "$root/csi-attacher" 2>"$work/strip.log" \
        || die "--dev: $strip_tool cannot strip the linux/$arch input $src (not an ELF binary for $arch?): $(cat "$work/strip.log")"
    else
      echo "image: --dev: $strip_tool missing, the $arch binary goes in unstripped"
    fi
  fi
  cp LICENSE "$root/LICENSE"
  chmod 0755 "$root/csi-attacher"
  chmod 0644 "$root/LICENSE"
  tar --create --file "$work/layer-$arch.tar" --directory "$root" --format=ustar \
    --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
    LICENSE csi-attacher
  c append --oci-empty-base --new_layer "$work/layer-$arch.tar" --new_tag "$assembly:layer-$arch" >/dev/null
  c config "$assembly:layer-$arch" >"$work/base-$arch.json"
  python3 hack/image.py config --arch "$arch" --commit "$commit" --epoch "$epoch" ${user:+--user "$user"} \
    <"$work/base-$arch.json" >"$work/config-$arch.json"
  c edit config "$assembly:layer-$arch" --tag "$assembly:$tag-$arch" <"$work/config-$arch.json" >/dev/null
  manifest=$(c digest "$assembly:$tag-$arch")
  echo "image: linux/$arch: $manifest ($(stat -c %s "$root/csi-attacher") bytes of binary)"
done
c index append --manifest "$assembly:$tag-amd64" --manifest "$assembly:$tag-arm64" --tag "$assembly:$tag" >/dev/null
digest=$(c digest "$assembly:$tag")
c pull --format oci "$assembly:$tag" "$work/built"
echo "image: index $digest"

# --- 3. Push to a registry on loopback, pull back, check ---------------------
start_registry check
ref=127.0.0.1:$port/csi-attacher-rs:$tag
pushed=$(c push "$work/built" "$ref")
[ "${pushed##*@}" = "$digest" ] || die "pushed $pushed, expected the index built, $digest"
c pull --format oci "$ref" "$work/pulled"
[ "$(c digest "$ref")" = "$digest" ] || die "the registry serves $(c digest "$ref") for $ref, $digest was pushed"
check=(--layout "$work/pulled" --digest "$digest" --commit "$commit" --epoch "$epoch" --extract "$work")
[ -z "$user" ] || check+=(--user "$user")
[ -z "$built" ] || check+=(--built "$built")
qemu=$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)
[ -z "$qemu" ] || check+=(--qemu "$qemu")
! $dev || check+=(--dev)
python3 hack/image.py check "${check[@]}" \
  || die "the image pulled back from $ref does not check out (above)"
# Only a checked image is left behind.
out=$target_dir/image
rm -rf "$out"
mkdir -p "$out"
mv "$work/pulled" "$out/oci"
echo "$digest" >"$out/digest"
echo "image: ok: csi-attacher-rs:$tag@$digest, pushed to and pulled back from a registry on loopback; OCI layout in $out/oci"

if [ -n "$push_to" ]; then
  echo "image: pushing to $push_to"
  pushed=$(c push "$out/oci" "$push_to")
  [ "${pushed##*@}" = "$digest" ] || die "pushed $pushed, expected $digest"
  [ "$(c digest "$push_to")" = "$digest" ] || die "$push_to serves $(c digest "$push_to"), $digest was pushed"
  echo "image: pushed $push_to@$digest"
fi
