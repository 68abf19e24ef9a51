"""pyinfra operations that serve a recipe: each reads facts, then yields commands or a noop
saying why nothing was needed. They never print or connect themselves."""

from __future__ import annotations

import hashlib
import posixpath
import shlex
from collections.abc import Generator
from io import StringIO
from typing import Any

from pyinfra.api.command import FileUploadCommand, StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host

from tensorless_deploy.facts.deployed import FileSha256, HttpStatus, ImagePresent, ModelBlob
from tensorless_deploy.hub import CachePaths
from tensorless_deploy.launch.render import UnitFile

SECRETS_DIR = "/run/tensorless"
# Hash with OpenSSL where the host has it: six times faster than coreutils sha256sum (FIELD.md).
HASH = '(openssl dgst -sha256 -r "$1" 2>/dev/null || sha256sum "$1") | cut -d" " -f1'
DOWNLOAD_ATTEMPTS = 5

Commands = Generator[Any, None, None]


def _sh(script: str, **params: str | int) -> StringCommand:
    """A POSIX-sh script with its parameters bound as shell variables, each one quoted."""
    binds = "".join(f"{k}={shlex.quote(str(v))}\n" for k, v in params.items())
    return StringCommand("sh -c " + shlex.quote("set -u\n" + binds + script))


_LOAD = """
id=$("$engine" pull -q "oci-archive:$archive" 2>&1) || {
  echo "loading the pushed image failed: $id" >&2; rm -f "$archive"; exit 1; }
got=$("$engine" image inspect --format '{{.Digest}}' "$id")
rm -f "$archive"
if [ "$got" != "$digest" ]; then
  "$engine" rmi -f "$id" >/dev/null 2>&1
  echo "the pushed image has digest $got, not $digest: refused and removed" >&2
  exit 1
fi
# an archive carries no repository name: name it, so image@digest resolves without a pull
"$engine" tag "$id" "$repo"
"$engine" image exists "$image" || {
  echo "the pushed image loaded but $image does not resolve to it" >&2; exit 1; }
echo "loaded the pushed image $digest"
"""


@operation(is_idempotent=True)
def image_pulled(engine_bin: str, image: str, archive: str | None = None) -> Commands:
    """The engine image, by digest: pulled once, noop when the engine has it. With archive
    (pushed by the controller), loaded from it and refused unless its digest is the recipe's."""
    if host.get_fact(ImagePresent, engine_bin=engine_bin, image=image):
        host.noop(f"image {image.rpartition('@')[2][:19]} already present")
        return
    if archive:
        repo, _, digest = image.partition("@")
        yield _sh(_LOAD, engine=engine_bin, archive=archive, digest=digest, repo=repo, image=image)
        return
    yield StringCommand(shlex.quote(engine_bin), "pull", "-q", shlex.quote(image))


_VERIFY = """
hashit() { @HASH@; }
got=$(hashit "$blob")
if [ "$got" != "$sha" ]; then
  rm -f "$blob" "$stamp"
  echo "model file $blob has sha256 $got, not $sha: removed it; run deploy again" >&2
  exit 1
fi
""".replace("@HASH@", HASH)

# A complete partial file (downloaded or pushed) is admitted only with the recipe's sha256:
# otherwise it is deleted, never renamed into place. $what names it in the message.
_ADMIT = """
hashit() { @HASH@; }
got=$(hashit "$partial")
if [ "$got" != "$sha" ]; then
  rm -f "$partial"
  echo "$what has sha256 $got, not $sha: refused and deleted" >&2
  exit 1
fi
mv -f "$partial" "$blob"
""".replace("@HASH@", HASH)

_DOWNLOAD = """
umask 022
mkdir -p "$(dirname "$blob")" "$(dirname "$stamp")" "$(dirname "$snapshot")"
have=$(stat -c %s "$partial" 2>/dev/null || echo 0)
[ "$have" -le "$size" ] || { rm -f "$partial"; have=0; }
start=$have
n=0
while [ "$have" -lt "$size" ] && [ "$n" -lt @ATTEMPTS@ ]; do
  n=$((n + 1))
  if [ -n "$auth" ]; then
    curl -fsSL --connect-timeout 10 --speed-limit 1024 --speed-time 60 -C - -H "@$auth" \\
      -o "$partial" "$url" || echo "curl exit $? (attempt $n), resuming" >&2
  else
    curl -fsSL --connect-timeout 10 --speed-limit 1024 --speed-time 60 -C - \\
      -o "$partial" "$url" || echo "curl exit $? (attempt $n), resuming" >&2
  fi
  have=$(stat -c %s "$partial" 2>/dev/null || echo 0)
done
[ -n "$auth" ] && rm -f "$auth"
if [ "$have" -ne "$size" ]; then
  echo "download of $url stopped at $have of $size bytes after $n attempts;" \
    "run deploy again to resume" >&2
  exit 1
fi
what="downloaded file"
@ADMIT@
echo "downloaded $((size - start)) bytes (resumed from $start), sha256 verified"
"""

_ARRIVED = """
have=$(stat -c %s "$partial" 2>/dev/null || echo 0)
if [ "$have" -ne "$size" ]; then
  echo "the pushed model is $have of $size bytes; run deploy again to resume" >&2
  exit 1
fi
what="the pushed model"
@ADMIT@
echo "pushed model verified: sha256 $sha"
"""
_DOWNLOAD = _DOWNLOAD.replace("@ADMIT@", _ADMIT).replace("@ATTEMPTS@", str(DOWNLOAD_ATTEMPTS))
_ARRIVED = _ARRIVED.replace("@ADMIT@", _ADMIT)

_STAMP_AND_LINK = """
mkdir -p "$(dirname "$stamp")" "$(dirname "$snapshot")"
ln -sfn "$target" "$snapshot"
echo "$(stat -c '%s %Y' "$blob")" > "$stamp.tmp" && mv -f "$stamp.tmp" "$stamp"
"""


@operation(is_idempotent=True)
def model_file(
    paths: CachePaths,
    url: str,
    sha256: str,
    size: int,
    token: str | None = None,
    pushed: bool = False,
) -> Commands:
    """The GGUF in the Hugging Face cache layout: downloaded with resume through a partial
    file, sha256-verified before it is renamed into place, not hashed again while its size and
    mtime match the stamp left by the last verification."""
    state = host.get_fact(ModelBlob, blob=paths.blob, stamp=paths.stamp, snapshot=paths.snapshot)
    params: dict[str, str | int] = dict(
        blob=paths.blob,
        stamp=paths.stamp,
        snapshot=paths.snapshot,
        target=paths.link_target,
        partial=paths.partial,
        sha=sha256,
        size=size,
        url=url,
    )
    if state.verified:
        if state.link == paths.link_target:
            host.noop(f"model {sha256[:12]} verified earlier; size and mtime unchanged")
            return
        yield _sh(_STAMP_AND_LINK, **params)
        return
    if state.exists:
        yield _sh(_VERIFY + _STAMP_AND_LINK, **params)
        return
    if pushed:  # the controller sent the bytes into the partial file: verify on arrival
        yield _sh(_ARRIVED + _STAMP_AND_LINK, **params)
        return
    auth = ""
    if token:
        # The token travels as a file read by curl -H @file: never in argv, units or logs.
        auth = posixpath.join(SECRETS_DIR, f"hf-auth-{sha256[:16]}")
        yield StringCommand("install", "-d", "-m", "700", SECRETS_DIR)
        yield FileUploadCommand(StringIO(f"Authorization: Bearer {token}\n"), auth)
        yield StringCommand("chmod", "600", auth)
    yield _sh(_DOWNLOAD + _STAMP_AND_LINK, auth=auth, **params)


@operation(is_idempotent=True)
def unit_installed(unit: UnitFile, quadlet_bin: str | None = None) -> Commands:
    """Write the unit only when its content changed: to a temporary name, checked by quadlet
    -dryrun where it is a quadlet, the old one kept for a restore, then renamed into place."""
    want = hashlib.sha256(unit.content.encode()).hexdigest()
    if host.get_fact(FileSha256, path=unit.path) == want:
        host.noop(f"{unit.path} unchanged")
        return
    directory, name = posixpath.split(unit.path)
    new = posixpath.join(directory, f".{name}.tensorless-new")
    yield StringCommand("mkdir", "-p", directory)
    yield FileUploadCommand(StringIO(unit.content), new)
    if unit.kind == "quadlet" and quadlet_bin:
        yield _sh(
            'd=$(mktemp -d) && cp "$new" "$d/$name" && '
            'QUADLET_UNIT_DIRS="$d" "$quadlet" -dryrun >/dev/null 2>"$d/err"; rc=$?\n'
            'if [ $rc -ne 0 ]; then cat "$d/err" >&2; rm -rf "$d" "$new"; '
            'echo "quadlet refused the new unit; the old one is untouched" >&2; exit 1; fi\n'
            'rm -rf "$d"',
            new=new,
            name=name,
            quadlet=quadlet_bin,
        )
    yield _sh(
        'if [ -f "$path" ]; then cp -p "$path" "$path.tensorless-prev"; '
        'else rm -f "$path.tensorless-prev"; fi\nmv -f "$new" "$path"',
        path=unit.path,
        new=new,
    )


_ACTIVATE = """
poll() {  # until /health answers 200, the unit fails, or the deadline passes
  deadline=$(( $(date +%s) + $1 ))
  while :; do
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$url" 2>/dev/null || true)
    [ "$code" = 200 ] && return 0
    st=$(systemctl is-active "$svc" 2>/dev/null || true)
    if [ "$st" = failed ]; then last="unit failed"; return 1; fi
    # llama-server never exits while it loads: a restart means it died (bad flag, bad file)
    nr=$(systemctl show -p NRestarts --value "$svc" 2>/dev/null || echo 0)
    if [ "${nr:-0}" -gt 0 ]; then last="the server exited and systemd restarted it"; return 1; fi
    last="HTTP ${code:-000} (${st})"
    [ "$(date +%s)" -ge "$deadline" ] && return 1
    sleep 1
  done
}
t0=$(date +%s)
last=""
systemctl daemon-reload
[ "$kind" = service ] && systemctl enable -q "$svc" 2>/dev/null
# Blocking: the old instance is gone before the first poll (with Notify=healthy, the start
# job itself waits for the container's health check).
if timeout "$timeout" systemctl "$verb" "$svc" 2>/dev/null && poll "$timeout"; then
  rm -f "$path.tensorless-prev"
  echo "$svc healthy after $(( $(date +%s) - t0 )) s at $url"
  exit 0
fi
echo "$svc not healthy within $timeout s: ${last:-the start job failed}." \
  "Last journal lines:" >&2
journalctl -u "$svc" -n 30 --no-pager -o cat 2>&1 | sed 's/^/  | /' >&2
if [ "$verb" = start ]; then
  exit 1  # the unit did not change: nothing to restore, nothing to remove
fi
if [ -f "$path.tensorless-prev" ]; then
  mv -f "$path.tensorless-prev" "$path"
  systemctl daemon-reload
  timeout "$timeout" systemctl restart "$svc" 2>/dev/null
  if poll "$timeout"; then
    echo "restored the previous unit; it is healthy again" >&2
  else
    echo "restored the previous unit, but it is not healthy either: $last" >&2
  fi
else
  systemctl stop "$svc" 2>/dev/null
  [ "$kind" = service ] && systemctl disable -q "$svc" 2>/dev/null
  rm -f "$path"
  systemctl daemon-reload
  echo "removed the new unit: nothing served here before it" >&2
fi
exit 1
"""


@operation()
def serving(unit: UnitFile, health_url: str, timeout_s: int, restart: bool) -> Commands:
    """The service running and answering /health with 200 (503 "Loading model" and a refused
    connection mean "still loading"); a new unit that fails is replaced by the previous one."""
    if not restart:
        code = host.get_fact(HttpStatus, url=health_url)
        if code == 200:
            host.noop(f"{unit.service} healthy at {health_url}")
            return
    yield _sh(
        _ACTIVATE,
        svc=unit.service,
        url=health_url,
        timeout=timeout_s,
        path=unit.path,
        kind=unit.kind,
        verb="restart" if restart else "start",
    )


_REMOVE = """
if [ -f "$path" ]; then
  timeout 60 systemctl stop "$svc" 2>/dev/null
  [ "$kind" = service ] && systemctl disable -q "$svc" 2>/dev/null
  rm -f "$path" "$path.tensorless-prev"
  systemctl daemon-reload
  systemctl reset-failed "$svc" 2>/dev/null
  echo "stopped $svc and removed $path"
fi
if [ "$purge" = yes ]; then
  rm -f "$blob" "$partial" "$stamp" "$snapshot"
  find "$repo_dir" -depth -type d -empty -delete 2>/dev/null
  echo "removed the model file $blob"
fi
true
"""


@operation(is_idempotent=True)
def unit_removed(
    unit_name: str, unit_paths: tuple[str, ...], paths: CachePaths | None = None
) -> Commands:
    """The unit stopped and its file removed (both kinds); with paths, the model file too."""
    present = [p for p in unit_paths if host.get_fact(FileSha256, path=p) is not None]
    blob = (
        host.get_fact(ModelBlob, blob=paths.blob, stamp=paths.stamp, snapshot=paths.snapshot)
        if paths
        else None
    )
    if not present and (blob is None or (not blob.exists and blob.link is None)):
        host.noop(f"{unit_name} is not deployed here")
        return
    for path in present or [unit_paths[0]]:
        yield _sh(
            _REMOVE,
            path=path if present else "/nonexistent",
            svc=f"{unit_name}.service",
            kind="quadlet" if path.endswith(".container") else "service",
            purge="yes" if paths else "no",
            blob=paths.blob if paths else "",
            partial=paths.partial if paths else "",
            stamp=paths.stamp if paths else "",
            snapshot=paths.snapshot if paths else "",
            repo_dir=paths.repo_dir if paths else "",
        )
