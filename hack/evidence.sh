#!/usr/bin/env bash
# Every result the docs publish, measured at the current commit: unattended,
# and resumable after a failure without redoing the parts already done.
#
#   hack/evidence.sh                 every part not yet done at HEAD (many hours)
#   hack/evidence.sh --list          the parts and whether each is done at HEAD
#   hack/evidence.sh --only a,b      some parts
#
# Parts, in order (each writes its results with their provenance, the commit,
# date, machine and command, through hack/figures.py --provenance):
#   mutants   the full mutation table            docs/mutants-results.md
#   bench     P1-P7, limits, growth, floor, cost  bench/results.{md,json} and charts (3 rounds)
#   lean      P1-P7 of this build against the build before issue 50's cuts
#             (2371ee9), in one run: that build in upstream's place
#             (hack/bench.sh --upstream-binary), 3 rounds  bench/lean/results.{md,json}
#   p8-*      P8 at the charts' flags and at upstream's defaults, 5 rounds (5 distinct
#             seeds per cell), with the azure-disk-fast sensitivity row, in ten parts
#             that each fit a session (the whole is ~4 h): one per profile, or per
#             profile and flag set (chart, defaults), azure-disk's defaults also
#             per cases; each `hack/bench.sh --only p8-<profile> [--p8-flags F]
#             [--p8-cases C] --rounds 5` into bench/p8-parts/<part>/ (committed).
#             A part draws the seeds a whole run's rounds draw (round, flag set
#             and case, not the profile, pick a seed); it runs alone, not beside
#             the other profiles' lanes. `--list` gives each one's estimate
#             (from the committed one-round run's lane times, bench/README.md, × 5)
#   p8        once every p8-* part is done at this commit (else it fails, to be
#             retried): `hack/bench.sh --merge` of their results   bench/p8/
#   chaos-1   a 500-fault chaos run, seed from the commit     docs/chaos-results.md
#   chaos-2   another, the next seed                          docs/chaos-results-2.md
#   soak      two hours                                       docs/soak-results.md
#   fresh     README's two commands on a fresh machine (empty crate registry, Go
#             module and build caches, tool cache, a fresh clone)  bench/fresh-machine.json
#   ci        .ci/run on a clean clone: once alone, then three times in a row with two
#             busy processes beside it (`nice -n 5 sha256sum /dev/zero`)  bench/ci-runs.json
# then `hack/figures.py --write` regenerates every quoted table. Commit the results.
#
# State: bench/evidence/<commit>/<part>.done, committed with the results, so a
# session on a fresh machine finds the parts done in the sessions before it
# (the logs, target/evidence/<commit>/<part>.log, stay with the machine). A part
# that fails leaves no .done and is run again next time; the script goes on
# with the other parts and exits 1 at the end. <commit> is the code's
# (`hack/figures.py --code-commit`: the last commit outside docs/, bench/ and
# Markdown), so committing the results of finished parts between sessions
# redoes none of them; the work tree must not differ from it outside those: a
# figure describes a commit.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

# P8's parts, and each one's minutes at full size (5 rounds) estimated from
# the committed one-round run (bench/README.md, "Time"): a lane's minutes per
# round × 5, split by flag set in the shares of the runs' measured times.
p8_parts=(p8-aws-ebs p8-azure-disk-chart p8-azure-disk-defaults-up-drain
  p8-azure-disk-defaults-gone-oos-noisy p8-gce-pd-chart p8-gce-pd-defaults
  p8-serial-per-node-chart p8-serial-per-node-defaults p8-azure-disk-fast-chart
  p8-azure-disk-fast-defaults)
# The harness's flags of a P8 part (besides --rounds 5 --out DIR), and its estimate.
p8_args() {
  case "$1" in
    p8-aws-ebs) echo "--only p8-aws-ebs" ;;
    p8-azure-disk-defaults-up-drain) echo "--only p8-azure-disk --p8-flags defaults --p8-cases up,drain" ;;
    p8-azure-disk-defaults-gone-oos-noisy) echo "--only p8-azure-disk --p8-flags defaults --p8-cases gone,oos,noisy" ;;
    *-chart) echo "--only ${1%-chart} --p8-flags chart" ;;
    *-defaults) echo "--only ${1%-defaults} --p8-flags defaults" ;;
  esac
}
p8_minutes() {
  case "$1" in
    p8-aws-ebs) echo 70 ;;
    p8-azure-disk-chart) echo 90 ;;
    p8-azure-disk-defaults-up-drain) echo 90 ;;
    p8-azure-disk-defaults-gone-oos-noisy) echo 55 ;;
    p8-gce-pd-chart) echo 75 ;;
    p8-gce-pd-defaults) echo 70 ;;
    p8-serial-per-node-chart) echo 45 ;;
    p8-serial-per-node-defaults) echo 85 ;;
    p8-azure-disk-fast-chart) echo 60 ;;
    p8-azure-disk-fast-defaults) echo 90 ;;
  esac
}

all=(mutants bench lean "${p8_parts[@]}" p8 chaos-1 chaos-2 soak fresh ci)
parts=("${all[@]}")
list=false
while [ $# -gt 0 ]; do
  case "$1" in
    --list) list=true ;;
    --only) IFS=, read -r -a parts <<<"$2"; shift ;;
    --only=*) IFS=, read -r -a parts <<<"${1#*=}" ;;
    *) echo "usage: hack/evidence.sh [--list] [--only PART,...]" >&2; exit 2 ;;
  esac
  shift
done
for p in "${parts[@]}"; do
  [[ " ${all[*]} " == *" $p "* ]] || { echo "evidence: no part $p (parts: ${all[*]})" >&2; exit 2; }
done

# The code's commit (hack/figures.py: the last commit outside docs/, bench/
# and Markdown): committing the results of finished parts keeps them done.
commit=$(python3 hack/figures.py --code-commit)
state=target/evidence/$commit
done_dir=bench/evidence/$commit
mkdir -p "$state" "$done_dir"
if $list; then
  for p in "${all[@]}"; do
    if [ -e "$done_dir/$p.done" ]; then
      echo "$p: done at $commit ($(cat "$done_dir/$p.done"))"
    elif [[ $p == p8-* ]]; then
      echo "$p: to do (~$(p8_minutes "$p") min and the release build: hack/bench.sh $(p8_args "$p") --rounds 5)"
    elif [[ $p == p8 ]]; then
      echo "$p: to do (merges the p8-* parts into bench/p8/ once all are done at $commit)"
    else
      echo "$p: to do"
    fi
  done
  exit 0
fi
if [[ $commit == *-dirty ]]; then
  echo "evidence: the work tree differs from ${commit%-dirty} outside docs/, bench/ and Markdown: commit first" >&2
  exit 1
fi

CSI_ATTACHER_TOOLS_BIN=$(bash hack/build-controlplane.sh | tail -n1)
export CSI_ATTACHER_TOOLS_BIN
# Two seeds from the commit: new ones at every commit, the same on a re-run.
seed=$(( 16#${commit:0:7} ))

# README's two commands on a fresh machine: empty CARGO_HOME, Go module and
# build caches, tool cache and a fresh clone, timed one after the other.
fresh() {
  local dir t0 t1 t2
  dir=$(mktemp -d "${TMPDIR:-/tmp}/evidence-fresh.XXXXXX")
  git clone -q "$root" "$dir/repo" || return 1
  (
    cd "$dir/repo" || exit 1
    export CARGO_HOME=$dir/cargo GOMODCACHE=$dir/gomod GOCACHE=$dir/gocache GOPATH=$dir/gopath \
      CSI_ATTACHER_CACHE=$dir/tools
    unset CSI_ATTACHER_TOOLS_BIN
    t0=$(date +%s)
    hack/demo.sh || exit 1
    t1=$(date +%s)
    hack/test.sh || exit 1
    t2=$(date +%s)
    python3 - "$root/bench/fresh-machine.json" "$((t1 - t0))" "$((t2 - t1))" <<'EOF'
import json, os, sys
out, demo, test = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
provenance = json.loads(os.environ["CSI_ATTACHER_PROVENANCE"])
json.dump({"provenance": provenance, "demo_s": demo, "test_s": test, "total_s": demo + test},
          open(out, "w"), indent=2)
open(out, "a").write("\n")
EOF
  )
  local rc=$?
  rm -rf "$dir"
  return $rc
}

# .ci/run on a clean clone, alone and then three times beside two busy
# processes; every run's wall time and result in bench/ci-runs.json. Fails
# when a run fails.
ci_runs() {
  local runs=() load rc=0 dir t0 status i
  for load in 0 2 2 2; do
    dir=$(mktemp -d "${TMPDIR:-/tmp}/evidence-ci.XXXXXX")
    git clone -q "$root" "$dir/repo" || return 1
    local busy=()
    for ((i = 0; i < load; i++)); do
      nice -n 5 sha256sum /dev/zero &
      busy+=($!)
    done
    t0=$(date +%s)
    (cd "$dir/repo" && bash .ci/run) >"$dir/ci.log" 2>&1
    status=$?
    if ((${#busy[@]})); then
      kill "${busy[@]}" 2>/dev/null
      wait "${busy[@]}" 2>/dev/null
    fi
    runs+=("{\"busy\": $load, \"seconds\": $(($(date +%s) - t0)), \"rc\": $status}")
    echo "ci: busy $load, rc $status, $(($(date +%s) - t0)) s (log: $state/ci-${#runs[@]}.log)"
    # Each run's whole log is kept: a failed run's report (a chaos run's
    # findings, say) is what the next person needs.
    cp "$dir/ci.log" "$root/$state/ci-${#runs[@]}.log"
    rm -rf "$dir"
    ((status == 0)) || rc=1
  done
  python3 - "$root/bench/ci-runs.json" "${runs[@]}" <<'EOF'
import json, os, sys
runs = [json.loads(r) for r in sys.argv[2:]]
json.dump({"provenance": json.loads(os.environ["CSI_ATTACHER_PROVENANCE"]), "runs": runs},
          open(sys.argv[1], "w"), indent=2)
open(sys.argv[1], "a").write("\n")
EOF
  return $rc
}

# P8's parts merged into bench/p8/, once each is done at this commit; the
# merge fails when their commit, machine or sizes differ.
p8_merge() {
  local sub missing=() dirs=()
  for sub in "${p8_parts[@]}"; do
    [ -e "$done_dir/$sub.done" ] || missing+=("$sub")
    dirs+=("bench/p8-parts/$sub")
  done
  if ((${#missing[@]})); then
    echo "p8: merges its parts once each is done at $commit; not yet: ${missing[*]}" >&2
    return 1
  fi
  hack/bench.sh --merge "${dirs[@]}" --out bench/p8
}

# The commit before issue 50's cuts (lean core): P1-P7 must not be worse than
# at it beyond the run's spread. Built once, in a worktree under target/.
lean_base=2371ee98d93618bcc93a51a7ba2c3d65d5202b97
lean() {
  local wt=$root/target/evidence/lean-base
  if [ ! -x "$wt/target/release/csi-attacher" ]; then
    rm -rf "$wt" && git worktree prune && git worktree add --detach "$wt" "$lean_base" &&
      (cd "$wt" && cargo build --locked --release --bin csi-attacher) || return 1
  fi
  hack/bench.sh --only p1,p2,p3,p4,p5,p6,p7 --upstream-binary "$wt/target/release/csi-attacher" --out bench/lean
}

run_part() {
  local part=$1
  CSI_ATTACHER_PROVENANCE=$(python3 hack/figures.py --provenance "hack/evidence.sh --only $part")
  export CSI_ATTACHER_PROVENANCE
  case "$part" in
    mutants) python3 hack/mutants.py --in-place --table docs/mutants-results.md ;;
    bench) hack/bench.sh --only limit,p1,p2,p3,p4,p5,p6,p1-workers,p4-load,p7,growth,floor,cost --out bench ;;
    lean) lean ;;
    p8-*)
      rm -rf "bench/p8-parts/${part:?}"
      # shellcheck disable=SC2046 # p8_args's words are flags
      hack/bench.sh $(p8_args "$part") --rounds 5 --out "bench/p8-parts/$part"
      ;;
    p8) p8_merge ;;
    chaos-1) CHAOS_REPORT=$root/docs/chaos-results.md hack/chaos.sh --full --seed "$seed" ;;
    chaos-2) CHAOS_REPORT=$root/docs/chaos-results-2.md hack/chaos.sh --full --seed "$((seed + 1))" ;;
    soak) hack/soak.sh ;;
    fresh) fresh ;;
    ci) ci_runs ;;
  esac
}

failed=()
for part in "${parts[@]}"; do
  if [ -e "$done_dir/$part.done" ]; then
    echo "evidence: $part done at $commit, skipped"
    continue
  fi
  echo "evidence: $part (log: $state/$part.log)"
  started=$(date +%s)
  if run_part "$part" >"$state/$part.log" 2>&1; then
    echo "$(date -u +%FT%TZ), $(( $(date +%s) - started )) s" >"$done_dir/$part.done"
    echo "evidence: $part done in $(( $(date +%s) - started )) s"
  else
    echo "evidence: $part FAILED (see $state/$part.log)" >&2
    failed+=("$part")
  fi
done
python3 hack/figures.py --write
if [ ${#failed[@]} -gt 0 ]; then
  echo "evidence: failed: ${failed[*]}; run hack/evidence.sh again to retry them" >&2
  exit 1
fi
echo "evidence: every part done at $commit; commit the results"
