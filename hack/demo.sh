#!/usr/bin/env bash
# Demo: a local control plane (etcd + kube-apiserver), csi-mock-driver and two
# csi-attacher replicas with leader election. Creates CSINode, PV and a
# VolumeAttachment the way kube-controller-manager would, shows it attached,
# deletes it, shows it detached, then cleans up (logs are kept and printed).
# Non-interactive; exits non-zero if any step does not happen in time.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
for tool in openssl curl jq python3; do
  command -v "$tool" >/dev/null || { echo "demo: $tool is required" >&2; exit 1; }
done

# The pinned kube-apiserver and etcd (the only Go tools the demo runs; cached
# after the first build) build in the background while cargo builds ours.
go_log=$(mktemp)
hack/build-controlplane.sh kube-apiserver etcd >"$go_log" 2>&1 &
go_pid=$!

# CSI_ATTACHER_DEMO_BIN=<dir>: run the csi-attacher and csi-mock-driver already
# built there instead of building them (CI: the ones hack/test.sh just built).
# Otherwise they are built as the tests build them (`cargo test --workspace
# --test binaries`: the two binaries, the attacher's and tools/csi-mock-driver's,
# with the test build's dependency features, and a check that both start), so
# that hack/test.sh afterwards compiles only its test binaries, not the
# dependencies a second time.
if [ -n "${CSI_ATTACHER_DEMO_BIN:-}" ]; then
  step "Using csi-attacher and csi-mock-driver from $CSI_ATTACHER_DEMO_BIN; building the pinned kube-apiserver and etcd"
  bin=$(cd "$CSI_ATTACHER_DEMO_BIN" && pwd)
  for b in csi-attacher csi-mock-driver; do
    [ -x "$bin/$b" ] || { echo "demo: no $bin/$b" >&2; exit 1; }
  done
else
  step "Building csi-attacher and csi-mock-driver, and the pinned kube-apiserver and etcd beside them"
  cargo test --locked --workspace --test binaries
  bin="$repo/target/debug"
fi
if ! wait "$go_pid"; then
  cat "$go_log" >&2
  echo "demo: building kube-apiserver and etcd failed" >&2
  exit 1
fi
tools=$(tail -n 1 "$go_log")
rm -f "$go_log"

work=$(mktemp -d /tmp/csi-attacher-demo.XXXXXX)
pids=()
stop() { # stop <pid>: SIGTERM, then SIGKILL after 5 s
  kill "$1" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$1" 2>/dev/null || true
}
cleanup() {
  # Newest first: attachers release the Lease while the API server is still up.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do stop "${pids[i]}"; done
  rm -rf "$work/etcd" "$work/csi.sock"
  echo
  echo "Logs: $work/*.log (attacher replicas: $work/attacher-1.log, $work/attacher-2.log)"
}
trap cleanup EXIT
cd "$work"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

step "Certificates (a throw-away CA, serving cert, admin client cert, service-account key)"
ec() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null; }
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.crt -days 1 -subj "/CN=demo-ca" 2>/dev/null
ec apiserver "/CN=kube-apiserver"
openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 1 \
  -extfile <(printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth') 2>/dev/null
ec admin "/O=system:masters/CN=admin"
openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out admin.crt -days 1 \
  -extfile <(printf 'extendedKeyUsage=clientAuth') 2>/dev/null
openssl ecparam -name prime256v1 -genkey -noout -out sa.key 2>/dev/null
openssl ec -in sa.key -pubout -out sa.pub 2>/dev/null

step "Starting etcd and kube-apiserver on 127.0.0.1"
etcd_port=$(free_port); peer_port=$(free_port); api_port=$(free_port)
"$tools/etcd" --name=demo --data-dir="$work/etcd" \
  --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
  --listen-peer-urls="http://127.0.0.1:$peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
  --initial-cluster="demo=http://127.0.0.1:$peer_port" --unsafe-no-fsync=true --log-level=warn > etcd.log 2>&1 &
pids+=($!)
"$tools/kube-apiserver" --etcd-servers="http://127.0.0.1:$etcd_port" --bind-address=127.0.0.1 \
  --advertise-address=127.0.0.1 --secure-port="$api_port" --cert-dir="$work/certs" \
  --tls-cert-file=apiserver.crt --tls-private-key-file=apiserver.key --client-ca-file=ca.crt \
  --service-account-key-file=sa.pub --service-account-signing-key-file=sa.key \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local --authorization-mode=RBAC \
  --service-cluster-ip-range=10.0.0.0/24 --endpoint-reconciler-type=none \
  --enable-priority-and-fairness=false --profiling=false > kube-apiserver.log 2>&1 &
pids+=($!)
api="https://127.0.0.1:$api_port"
k() { curl -sS --cacert ca.crt --cert admin.crt --key admin.key "$@"; }
wait_for() { # wait_for <seconds> <description> <command...>
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then echo "demo: timed out waiting for $what" >&2; exit 1; fi
    sleep 0.2
  done
}
wait_for 120 "kube-apiserver /readyz" bash -c "[ \"\$(curl -s --cacert ca.crt --cert admin.crt --key admin.key $api/readyz)\" = ok ]"
b64() { base64 -w0 "$1"; }
cat > kubeconfig <<KUBECONFIG
apiVersion: v1
kind: Config
clusters: [{name: demo, cluster: {server: "$api", certificate-authority-data: $(b64 ca.crt)}}]
users: [{name: admin, user: {client-certificate-data: $(b64 admin.crt), client-key-data: $(b64 admin.key)}}]
contexts: [{name: demo, context: {cluster: demo, user: admin}}]
current-context: demo
KUBECONFIG
echo "API server at $api (kubeconfig: $work/kubeconfig)"

step "Starting csi-mock-driver and two csi-attacher replicas (leader election on)"
driver=mock.csi.example.com
"$bin/csi-mock-driver" --endpoint "$work/csi.sock" --name "$driver" --ledger "$work/ledger.jsonl" \
  --admin-addr 127.0.0.1:0 > mock-driver.banner 2> mock-driver.log &
pids+=($!)
wait_for 20 "the driver socket" test -S "$work/csi.sock"
http_ports=()
for i in 1 2; do
  port=$(free_port); http_ports+=("$port")
  "$bin/csi-attacher" --csi-address="$work/csi.sock" --kubeconfig="$work/kubeconfig" \
    --leader-election --leader-election-namespace=default --leader-election-identity="replica-$i" \
    --http-endpoint="127.0.0.1:$port" --termination-log-path="$work/attacher-$i.termination-log" \
    --v=2 > "attacher-$i.log" 2>&1 &
  pids+=($!)
done
lease="external-attacher-leader-${driver//./-}"
wait_for 30 "a leader" bash -c "curl -s --cacert ca.crt --cert admin.crt --key admin.key $api/apis/coordination.k8s.io/v1/namespaces/default/leases/$lease | jq -e '.spec.holderIdentity | length > 0'"
echo "Leader: $(k "$api/apis/coordination.k8s.io/v1/namespaces/default/leases/$lease" | jq -r .spec.holderIdentity)"

step "Creating a CSINode, a PersistentVolume and its VolumeAttachment (as kube-controller-manager would)"
node=node-1; handle=vol-0001; pv=pv-demo
va="csi-$(printf '%s%s%s' "$handle" "$driver" "$node" | sha256sum | cut -d' ' -f1)"
k -X POST -H 'Content-Type: application/json' "$api/apis/storage.k8s.io/v1/csinodes" \
  -d "{\"metadata\":{\"name\":\"$node\"},\"spec\":{\"drivers\":[{\"name\":\"$driver\",\"nodeID\":\"$node-id\"}]}}" > /dev/null
k -X POST -H 'Content-Type: application/json' "$api/api/v1/persistentvolumes" \
  -d "{\"metadata\":{\"name\":\"$pv\"},\"spec\":{\"capacity\":{\"storage\":\"1Gi\"},\"accessModes\":[\"ReadWriteOnce\"],\"csi\":{\"driver\":\"$driver\",\"volumeHandle\":\"$handle\",\"fsType\":\"ext4\"}}}" > /dev/null
k -X POST -H 'Content-Type: application/json' "$api/apis/storage.k8s.io/v1/volumeattachments" \
  -d "{\"metadata\":{\"name\":\"$va\"},\"spec\":{\"attacher\":\"$driver\",\"nodeName\":\"$node\",\"source\":{\"persistentVolumeName\":\"$pv\"}}}" > /dev/null
echo "VolumeAttachment $va created"
vapath="$api/apis/storage.k8s.io/v1/volumeattachments/$va"
wait_for 30 "the VolumeAttachment to be attached" bash -c "curl -s --cacert ca.crt --cert admin.crt --key admin.key $vapath | jq -e '.status.attached == true'"
echo "Attached:"
k "$vapath" | jq '{finalizers: .metadata.finalizers, annotations: .metadata.annotations, status: .status}'
echo "Driver ledger:"
jq -c 'select(.method == "ControllerPublishVolume") | {method, volume_id, node_id, capability, code}' ledger.jsonl

step "Deleting the VolumeAttachment"
k -X DELETE "$vapath" > /dev/null
wait_for 30 "the VolumeAttachment to be gone" bash -c "[ \"\$(curl -s -o /dev/null -w '%{http_code}' --cacert ca.crt --cert admin.crt --key admin.key $vapath)\" = 404 ]"
echo "Detached and gone. Driver ledger:"
jq -c 'select(.method == "ControllerUnpublishVolume") | {method, volume_id, node_id, code}' ledger.jsonl
echo "Published volumes left on the driver: $(curl -s "http://$(jq -r .admin mock-driver.banner)/published")"

step "Metrics of the leader (excerpt)"
for port in "${http_ports[@]}"; do
  curl -s "http://127.0.0.1:$port/metrics" | grep -E '^(leader_election_master_status|csi_sidecar_operations_seconds_count\{.*Controller|csi_attacher_attach_latency_seconds_count)' || true
done
step "Done"
