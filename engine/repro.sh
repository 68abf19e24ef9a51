#!/bin/bash
# Reproducibility check (slow, never CI): build ARCH a second time from the same pins into a work
# directory of its own, reusing only the download cache, and compare the image digest with an
# earlier build's. When the digests differ, name the cause: the config, or which files of the
# image differ (and whether the compiled outputs already differed before packaging).
#   engine/repro.sh ARCH [REFERENCE_WORK]    REFERENCE_WORK default /var/tmp/tensorless-engine/build-ARCH
# Env: REPRO_WORK (default /var/tmp/tensorless-engine/repro-ARCH), ENGINE_CACHE (the download
#   cache, build.sh's default unless set: pass the reference's), and what engine/build.sh reads.
# Exit 0 same digest, 1 different (the report says what differs) or failed, 2 usage.
set -euo pipefail
HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
die() { echo "repro.sh: $*" >&2; exit 1; }
[[ $# -ge 1 && $# -le 2 ]] || { sed -n '6s/^#  //p' "$0" >&2; exit 2; }
ARCH=$1 REF=${2:-/var/tmp/tensorless-engine/build-$1}
NEW=${REPRO_WORK:-/var/tmp/tensorless-engine/repro-$ARCH}
[[ -s $REF/oci.txt && -d $REF/oci ]] || die "no finished build in $REF (engine/build.sh $ARCH first)"
[ "$(readlink -f "$REF")" != "$(readlink -f "$NEW")" ] || die "REPRO_WORK must differ from the reference $REF"
ref_digest=$(sed -n 's/^manifest=\(sha256:[0-9a-f]*\) .*/\1/p' "$REF/oci.txt")
# the reference's release, from its own config (the version label is part of the digest)
release=$(python3 - "$REF/oci" <<'PY'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
blob = lambda d: root / "blobs/sha256" / d.split(":")[1]
m = json.loads(blob(json.loads((root / "index.json").read_text())["manifests"][0]["digest"]).read_text())
print(json.loads(blob(m["config"]["digest"]).read_text())["config"]["Labels"]["org.opencontainers.image.version"])
PY
)
args=("$ARCH"); [ "$release" = unreleased ] || args+=(--release "$release")
echo "repro.sh: reference $REF: $ref_digest (release $release); rebuilding into $NEW (log: $NEW.log)"
start=$(date +%s)
ENGINE_WORK=$NEW ENGINE_CACHE=${ENGINE_CACHE:-/var/tmp/tensorless-engine/cache} \
  "$HERE/build.sh" "${args[@]}" >"$NEW.log" 2>&1 || { tail -20 "$NEW.log" >&2; die "the rebuild failed; read $NEW.log"; }
new_digest=$(sed -n 's/^manifest=\(sha256:[0-9a-f]*\) .*/\1/p' "$NEW/oci.txt")
echo "repro.sh: rebuild took $(( $(date +%s) - start ))s"
echo "repro.sh: reference $ref_digest"
echo "repro.sh: rebuild   $new_digest"
if [ "$ref_digest" = "$new_digest" ]; then
  echo "repro.sh: $ARCH: reproducible, the same digest from a second build"
  exit 0
fi
# Name the difference: config first, then the files of each tree (path, type, mode, owner, size,
# sha256), then the compiled outputs before packaging.
python3 - "$REF" "$NEW" <<'PY'
import hashlib, json, os, stat, sys
from pathlib import Path
ref, new = Path(sys.argv[1]), Path(sys.argv[2])
def cfg(work):
    root = work / "oci"
    blob = lambda d: root / "blobs/sha256" / d.split(":")[1]
    m = json.loads(blob(json.loads((root / "index.json").read_text())["manifests"][0]["digest"]).read_text())
    return json.loads(blob(m["config"]["digest"]).read_text())
a, b = cfg(ref), cfg(new)
a.pop("rootfs"); b.pop("rootfs")
if a != b:
    print("repro.sh: the image configs differ (besides the layer):")
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            print(f"  {k}: {json.dumps(a.get(k))[:200]} != {json.dumps(b.get(k))[:200]}")
def tree(root):
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            st = os.lstat(p)
            rel = str(p.relative_to(root))
            if stat.S_ISREG(st.st_mode):
                h = hashlib.sha256(p.read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                h = "-> " + os.readlink(p)
            else:
                h = ""
            out[rel] = (stat.filemode(st.st_mode), st.st_uid, st.st_gid, st.st_size, h)
    return out
for label, sub in (("image tree", "runtime-root"), ("compiled outputs", "build-root/out")):
    ta, tb = tree(ref / sub), tree(new / sub)
    only_a, only_b = sorted(set(ta) - set(tb)), sorted(set(tb) - set(ta))
    changed = sorted(k for k in set(ta) & set(tb) if ta[k] != tb[k])
    print(f"repro.sh: {label} ({sub}): {len(changed)} files differ, {len(only_a)} only in the reference, {len(only_b)} only in the rebuild")
    for k in changed[:40]:
        what = [n for n, x, y in zip(("mode", "uid", "gid", "size", "content"), ta[k], tb[k]) if x != y]
        print(f"  differs ({', '.join(what)}): {k}")
    for k in only_a[:10]:
        print(f"  only in reference: {k}")
    for k in only_b[:10]:
        print(f"  only in rebuild: {k}")
PY
echo "repro.sh: $ARCH: NOT reproducible: the files above differ"
exit 1
