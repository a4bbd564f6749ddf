#!/usr/bin/env python3
# Self time of a `perf record` file by category (kernel, allocation, HTTP, JSON, TLS, tokio,
# logging, metrics, queue, kube, attacher logic, other), from `perf report --sort dso,sym`.
# Usage: hack/perf-categories.py FILE.data... (bench/README.md, Profiling).
import collections
import re
import subprocess
import sys


def cats(path):
    out = subprocess.run(["perf","report","-i",path,"--no-children","--sort","dso,sym","-g","none","--stdio","--percent-limit","0"],capture_output=True,text=True).stdout
    c = collections.Counter()
    rows=[]
    for line in out.splitlines():
        m = re.match(r"\s+([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)", line)
        if not m: continue
        pct, dso, kind, sym = float(m[1]), m[2], m[3], m[4]
        s = sym
        if kind == 'k' or dso.startswith('[kernel'): k='kernel (syscalls, TCP, scheduling)'
        elif re.search(r'mi_|mimalloc|_mi_|malloc|free|realloc|memcpy|memmove|memset|__rust_(alloc|dealloc|realloc)|alloc::raw_vec|drop_in_place', s): k='allocation, copies, drops'
        elif re.search(r'serde_json|serde::|serde_core|k8s_openapi.*(deserialize|Deserialize|visit)|Deserialize|Visitor', s): k='JSON (serde)'
        elif re.search(r'rustls|ring::|ring_core|aes|gcm|chacha|sha2|x25519|GFp|fiat_|bn_', s): k='TLS'
        elif re.search(r'hyper|http::|h2::|httparse|http_body|tower', s): k='HTTP'
        elif re.search(r'tonic|prost', s): k='gRPC'
        elif re.search(r'tokio|mio::|futures', s): k='tokio runtime'
        elif re.search(r'tracing|logging|fmt::|core::fmt|gofmt|klog', s): k='logging, formatting'
        elif re.search(r'prometheus|metrics', s): k='metrics'
        elif re.search(r'csi_attacher::controller::queue', s): k='queue'
        elif re.search(r'kube|reflector|watcher', s): k='kube client/runtime'
        elif re.search(r'csi_attacher|attacher::floor', s): k='attacher logic'
        else: k='other'
        c[k]+=pct; rows.append((pct,k,s[:120]))
    return c, rows
for p in sys.argv[1:]:
    c, rows = cats(p)
    print("==", p)
    for k,v in c.most_common(): print(f"  {v:6.2f}%  {k}")
    print("  top other:")
    for pct,k,s in sorted(rows, reverse=True):
        if k in ('other',) and pct>0.4: print(f"    {pct:5.2f} {s}")
