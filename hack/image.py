#!/usr/bin/env python3
"""The image's expected contents, and the check of a pulled image, for hack/image.sh.

  image.py config --arch ARCH --commit C --user U --epoch E < base-config.json
      Prints the image config for one platform: the base config's rootfs (the
      layer crane appended) with os/architecture, the creation time (E), and
      the Dockerfile's final stage: its labels, USER (U) and ENTRYPOINT.

  image.py check --layout DIR --digest D --commit C --user U --epoch E [--built DATE]
                 [--extract DIR] [--qemu PATH] [--dev]
      Checks an OCI layout pulled from a registry (see the CHECKS list below)
      and exits 1 naming every mismatch. --dev relaxes two checks for the
      linux/amd64 binary only (static linking and the embedded dependency
      list: CI's amd64 input is the test build) and says so in its output.

What the image must be comes from the Dockerfile itself (its final stage), so
the two cannot drift apart: the labels, with ${VERSION} and ${GIT_COMMIT}
expanded (ARG defaults, and the commit), USER (${USER}, default ARG USER),
ENTRYPOINT, and what it copies (/csi-attacher and /LICENSE). A final stage
that does something this script does not mirror fails here, loudly.
"""

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import re
import shlex
import struct
import subprocess
import sys
import tarfile
import zlib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
# ELF e_machine values.
MACHINES = {"amd64": (62, "x86-64"), "arm64": (183, "AArch64")}
# The layer's files: path in the image -> mode (as the Dockerfile's COPY keeps them).
FILES = {"csi-attacher": 0o755, "LICENSE": 0o644}
# Crates that must be in the embedded dependency list (as hack/cross-aarch64.sh checks).
SBOM_CRATES = {"csi-attacher", "tokio", "kube-client", "tonic"}


class Spec:
    """The Dockerfile's final stage, as far as the image is concerned."""

    def __init__(self, path):
        text = open(path, encoding="utf-8").read()
        # Join continuation lines; drop comments (also those inside a continuation).
        lines, cur = [], ""
        for raw in text.splitlines():
            if raw.lstrip().startswith("#"):
                continue
            if raw.rstrip().endswith("\\"):
                cur += raw.rstrip()[:-1] + " "
                continue
            cur += raw
            if cur.strip():
                lines.append(cur.strip())
            cur = ""
        stages, stage = [], None
        for line in lines:
            word, _, rest = line.partition(" ")
            word = word.upper()
            if word == "FROM":
                stage = [("FROM", rest.strip())]
                stages.append(stage)
            elif stage is not None:
                stage.append((word, rest.strip()))
        if not stages:
            sys.exit("image.py: no FROM in the Dockerfile")
        final = stages[-1]
        self.args, self.labels, self.copies = {}, {}, []
        self.user = self.entrypoint = None
        for word, rest in final:
            if word == "FROM":
                if rest != "scratch":
                    sys.exit(f"image.py: the Dockerfile's final stage is FROM {rest}, hack/image.sh builds on an empty base (FROM scratch)")
            elif word == "ARG":
                name, _, default = rest.partition("=")
                self.args[name] = default
            elif word == "LABEL":
                for token in shlex.split(rest):
                    key, _, value = token.partition("=")
                    self.labels[key] = value
            elif word == "COPY":
                self.copies.append(shlex.split(rest)[-1])
            elif word == "USER":
                self.user = rest
            elif word == "ENTRYPOINT":
                self.entrypoint = json.loads(rest)
            else:
                sys.exit(f"image.py: the Dockerfile's final stage has {word} {rest}, which hack/image.sh does not mirror")
        if sorted(self.copies) != sorted("/" + f for f in FILES):
            sys.exit(f"image.py: the Dockerfile's final stage copies {self.copies}, hack/image.sh puts {sorted('/' + f for f in FILES)} in the layer")
        if self.user is None or self.entrypoint is None:
            sys.exit("image.py: the Dockerfile's final stage has no USER or no ENTRYPOINT")

    def expand(self, value, overrides):
        env = dict(self.args, **overrides)

        def sub(m):
            name = m.group(1) or m.group(2)
            if name not in env:
                sys.exit(f"image.py: the Dockerfile uses ${{{name}}}, which is no ARG of its final stage")
            return env[name]

        return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, value)

    def expected(self, commit, user):
        overrides = {"GIT_COMMIT": commit}
        if user:
            overrides["USER"] = user
        return {
            "Entrypoint": self.entrypoint,
            "User": self.expand(self.user, overrides),
            "Labels": {k: self.expand(v, overrides) for k, v in self.labels.items()},
        }


def rfc3339(epoch):
    return datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def cmd_config(a):
    spec = Spec(a.dockerfile)
    base = json.load(sys.stdin)
    created = rfc3339(a.epoch)
    config = {
        "architecture": a.arch,
        "os": "linux",
        "created": created,
        "config": spec.expected(a.commit, a.user),
        "rootfs": base["rootfs"],
        "history": [{"created": created, "created_by": "COPY csi-attacher LICENSE / # hack/image.sh"}],
    }
    if len(base["rootfs"]["diff_ids"]) != 1:
        sys.exit(f"image.py: expected one layer in the base config, got {base['rootfs']}")
    sys.stdout.write(json.dumps(config, sort_keys=True, separators=(",", ":")))


class Checker:
    def __init__(self):
        self.failures = []

    def expect(self, cond, what):
        if not cond:
            self.failures.append(what)
        return cond


def elf_facts(data):
    """(machine, has PT_INTERP, DT_NEEDED count, {section name: bytes}) of a 64-bit little-endian ELF."""
    if data[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (machine,) = struct.unpack_from("<H", data, 18)
    phoff, shoff = struct.unpack_from("<QQ", data, 32)
    phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", data, 54)
    interp, needed = False, 0
    for i in range(phnum):
        p_type, _flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 3:  # PT_INTERP
            interp = True
        elif p_type == 2:  # PT_DYNAMIC: (d_tag, d_val) pairs
            for off in range(p_offset, p_offset + p_filesz, 16):
                (tag,) = struct.unpack_from("<q", data, off)
                if tag == 1:  # DT_NEEDED
                    needed += 1
                elif tag == 0:
                    break
    sections = {}
    if shoff and shnum:
        headers = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
        strtab = headers[shstrndx]
        names = data[strtab[4] : strtab[4] + strtab[5]]
        for name_off, sh_type, _flags, _addr, offset, size in headers:
            name = names[name_off : names.index(b"\0", name_off)].decode()
            sections[name] = data[offset : offset + size] if sh_type != 8 else b""  # 8: SHT_NOBITS
    return machine, interp, needed, sections


def cmd_check(a):
    spec = Spec(a.dockerfile)
    want = spec.expected(a.commit, a.user)
    created = rfc3339(a.epoch)
    c = Checker()
    layout = a.layout

    def blob(desc, what):
        digest = desc["digest"]
        algo, _, hexd = digest.partition(":")
        path = os.path.join(layout, "blobs", algo, hexd)
        if not c.expect(algo == "sha256" and os.path.isfile(path), f"{what}: blob {digest} missing from the layout"):
            return None
        data = open(path, "rb").read()
        c.expect(hashlib.sha256(data).hexdigest() == hexd, f"{what}: blob {digest} does not hash to its digest")
        c.expect(len(data) == desc["size"], f"{what}: blob {digest} is {len(data)} bytes, its descriptor says {desc['size']}")
        return data

    top = json.load(open(os.path.join(layout, "index.json")))
    if not c.expect(len(top.get("manifests", [])) == 1, f"index.json: expected one entry, got {top.get('manifests')}"):
        return c
    entry = top["manifests"][0]
    c.expect(entry["digest"] == a.digest, f"the index pulled is {entry['digest']}, the one pushed {a.digest}")
    c.expect(entry.get("mediaType") == INDEX, f"the image is {entry.get('mediaType')}, not an OCI image index")
    raw = blob(entry, "index")
    if raw is None:
        return c
    index = json.loads(raw)
    c.expect(index.get("mediaType") == INDEX, f"index: mediaType {index.get('mediaType')}")
    platforms = [(m.get("platform") or {}) for m in index["manifests"]]
    got = sorted(f"{p.get('os')}/{p.get('architecture')}" for p in platforms)
    c.expect(got == ["linux/amd64", "linux/arm64"], f"index: platforms {got}, expected linux/amd64 and linux/arm64 once each")
    print(f"image.py: index {a.digest}: {', '.join(got)}")

    for m in index["manifests"]:
        p = m.get("platform") or {}
        arch = p.get("architecture")
        what = f"{p.get('os')}/{arch}"
        if arch not in MACHINES:
            c.expect(False, f"{what}: unexpected platform")
            continue
        c.expect(m.get("mediaType") == MANIFEST, f"{what}: manifest mediaType {m.get('mediaType')}")
        raw = blob(m, f"{what} manifest")
        if raw is None:
            continue
        manifest = json.loads(raw)
        c.expect(manifest["config"]["mediaType"] == CONFIG, f"{what}: config mediaType {manifest['config']['mediaType']}")
        config = json.loads(blob(manifest["config"], f"{what} config") or b"{}")
        c.expect(config.get("os") == "linux" and config.get("architecture") == arch,
                 f"{what}: the config says {config.get('os')}/{config.get('architecture')}")
        c.expect(config.get("created") == created, f"{what}: created {config.get('created')}, expected {created} (the commit's time or SOURCE_DATE_EPOCH)")
        cc = config.get("config", {})
        for key in ("Entrypoint", "User"):
            c.expect(cc.get(key) == want[key], f"{what}: {key} is {json.dumps(cc.get(key))}, the Dockerfile makes it {json.dumps(want[key])}")
        labels = cc.get("Labels") or {}
        for key in sorted(set(labels) | set(want["Labels"])):
            c.expect(labels.get(key) == want["Labels"].get(key),
                     f"{what}: label {key} is {json.dumps(labels.get(key))}, the Dockerfile makes it {json.dumps(want['Labels'].get(key))}")
        extra = sorted(set(cc) - {"Entrypoint", "User", "Labels"})
        c.expect(not extra, f"{what}: config has {extra}, which the Dockerfile does not set")
        layers = manifest.get("layers", [])
        if not c.expect(len(layers) == 1 and layers[0]["mediaType"] == LAYER, f"{what}: expected one gzip layer, got {layers}"):
            continue
        gz = blob(layers[0], f"{what} layer")
        if gz is None:
            continue
        tar = gzip.decompress(gz)
        c.expect(config.get("rootfs", {}).get("diff_ids") == ["sha256:" + hashlib.sha256(tar).hexdigest()],
                 f"{what}: rootfs.diff_ids does not name the layer's uncompressed digest")
        members = {}
        with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
            for ti in tf.getmembers():
                members[ti.name] = ti
                c.expect(ti.isfile(), f"{what}: layer entry {ti.name} is not a regular file")
                c.expect(ti.uid == 0 and ti.gid == 0, f"{what}: {ti.name} is owned by {ti.uid}:{ti.gid}, not 0:0")
                c.expect(ti.mtime == int(a.epoch), f"{what}: {ti.name} has mtime {ti.mtime}, not {a.epoch}")
                if ti.name in FILES:
                    c.expect(ti.mode == FILES[ti.name], f"{what}: {ti.name} has mode {oct(ti.mode)}, not {oct(FILES[ti.name])}")
            c.expect(sorted(members) == sorted(FILES), f"{what}: layer holds {sorted(members)}, expected {sorted(FILES)}")
            if "LICENSE" in members:
                c.expect(tf.extractfile(members["LICENSE"]).read() == open(os.path.join(REPO, "LICENSE"), "rb").read(),
                         f"{what}: /LICENSE is not the repository's LICENSE")
            if "csi-attacher" not in members:
                continue
            binary = tf.extractfile(members["csi-attacher"]).read()
        check_binary(c, a, arch, what, binary)
    return c


def check_binary(c, a, arch, what, binary):
    relaxed = a.dev and arch == "amd64"
    try:
        machine, interp, needed, sections = elf_facts(binary)
    except (ValueError, struct.error, IndexError) as e:
        c.expect(False, f"{what}: /csi-attacher: {e}")
        return
    want_machine, machine_name = MACHINES[arch]
    c.expect(machine == want_machine, f"{what}: /csi-attacher has ELF machine {machine}, expected {want_machine} ({machine_name})")
    static = not interp and needed == 0
    if relaxed and not static:
        print(f"image.py: {what}: RELAXED (--dev): /csi-attacher is dynamically linked ({'a program interpreter, ' if interp else ''}{needed} NEEDED); the full mode requires static")
    else:
        c.expect(not interp, f"{what}: /csi-attacher has a program interpreter (dynamically linked, not static)")
        c.expect(needed == 0, f"{what}: /csi-attacher needs {needed} shared libraries (not static)")
    crates = None
    if ".dep-v0" in sections:
        try:
            deps = json.loads(zlib.decompress(sections[".dep-v0"]))
            names = {p["name"] for p in deps["packages"]}
            c.expect(SBOM_CRATES <= names, f"{what}: the embedded dependency list lacks {sorted(SBOM_CRATES - names)}")
            crates = len(deps["packages"])
        except (zlib.error, ValueError, KeyError) as e:
            c.expect(False, f"{what}: the embedded dependency list (.dep-v0) does not read back: {e}")
    elif relaxed:
        print(f"image.py: {what}: RELAXED (--dev): /csi-attacher has no .dep-v0 (not built by cargo auditable); the full mode requires it")
    else:
        c.expect(False, f"{what}: /csi-attacher has no .dep-v0 section (cargo auditable did not embed the dependency list)")
    if a.extract:
        path = os.path.join(a.extract, f"csi-attacher-{arch}")
        with open(path, "wb") as f:
            f.write(binary)
        os.chmod(path, 0o755)
        run = None
        if arch == "amd64" and os.uname().machine == "x86_64":
            run = [path]
        elif arch == "arm64" and a.qemu:
            run = [a.qemu, path]
        elif arch == "arm64" and os.uname().machine == "aarch64":
            run = [path]
        if run is None:
            print(f"image.py: {what}: not run (no way to run {arch} here)")
        else:
            try:
                out = subprocess.run(run + ["--version"], capture_output=True, text=True, timeout=60)
                rc, version, err = out.returncode, out.stdout.strip(), out.stderr.strip()
            except (OSError, subprocess.TimeoutExpired) as e:
                rc, version, err = None, "", str(e)
            m = re.match(r"^\S+ (\S+) \(commit (\S+), built ([^,]+),", version)
            if c.expect(rc == 0 and m, f"{what}: `/csi-attacher --version` did not run as expected (exit {rc}): {version!r} {err!r}"):
                c.expect(m.group(1) == a.version, f"{what}: --version says version {m.group(1)}, the image's label says {a.version}")
                c.expect(m.group(2) == a.commit, f"{what}: --version says commit {m.group(2)}, expected {a.commit}")
                if a.built:
                    c.expect(m.group(3) == a.built, f"{what}: --version says built {m.group(3)}, expected {a.built}")
                print(f"image.py: {what}: --version: {version}{' (under ' + os.path.basename(run[0]) + ')' if len(run) > 1 else ''}")
    actual = {m: n for m, n in MACHINES.values()}.get(machine, f"machine {machine}")
    facts = f"ELF {actual}, {'static' if static else 'dynamic'}, {len(binary)} bytes"
    facts += f", {crates} crates in .dep-v0" if crates is not None else ", no .dep-v0"
    print(f"image.py: {what}: /csi-attacher: {facts}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("config", "check"):
        s = sub.add_parser(name)
        s.add_argument("--dockerfile", default=os.path.join(REPO, "Dockerfile"))
        s.add_argument("--commit", required=True)
        s.add_argument("--user", default="", help="the USER build argument (default: the Dockerfile's ARG USER)")
        s.add_argument("--epoch", required=True, type=int)
    s = sub.choices["config"]
    s.add_argument("--arch", required=True, choices=sorted(MACHINES))
    s = sub.choices["check"]
    s.add_argument("--layout", required=True)
    s.add_argument("--digest", required=True)
    s.add_argument("--built", help="the build date --version must print (only when the script built the binaries)")
    s.add_argument("--extract", help="write the binaries here and run --version")
    s.add_argument("--qemu", help="qemu-aarch64, to run the arm64 binary")
    s.add_argument("--dev", action="store_true")
    a = p.parse_args()
    if a.cmd == "config":
        cmd_config(a)
        return
    a.version = Spec(a.dockerfile).expected(a.commit, a.user)["Labels"].get("org.opencontainers.image.version")
    c = cmd_check(a)
    if c.failures:
        print("image.py: FAILED:", file=sys.stderr)
        for f in c.failures:
            print(f"  - {f}", file=sys.stderr)
        sys.exit(1)
    print(f"image.py: ok: {a.digest}")


if __name__ == "__main__":
    main()
