#!/usr/bin/env bash
# Runs csi-attacher locally against csi-mock-driver on a temp socket.
# Stops both on Ctrl-C. Extra arguments go to csi-attacher.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cargo build --locked --bins
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
target/debug/csi-mock-driver --endpoint "$dir/csi.sock" --ledger "$dir/ledger.jsonl" --admin-addr 127.0.0.1:0 &
echo "mock driver ledger: $dir/ledger.jsonl" >&2
target/debug/csi-attacher --csi-address "$dir/csi.sock" --termination-log-path "$dir/termination-log" "$@"
