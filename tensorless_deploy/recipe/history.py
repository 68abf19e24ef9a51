"""A recipes directory inside a git checkout, as it is now and as it was at a base revision: the
two sides `gate check` compares. git runs as a subprocess with argument lists, never a shell;
a file whose bytes are the base's is not read from git at all (its blob id says so)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tensorless_deploy.errors import TensorlessError, UsageError
from tensorless_deploy.recipe.index import recipe_files

GIT_TIMEOUT_S = 60


@dataclass(frozen=True)
class Version:
    """One recipe file: its path as git names it, its bytes at the base and now (None: absent
    there), and whether the two are the same bytes (then neither was parsed)."""

    path: str
    old: bytes | None
    new: bytes | None
    same: bool = False


@dataclass(frozen=True)
class History:
    top: Path  # the repository's work tree
    prefix: str  # the recipes directory inside it, as git names it ("recipes/"; "" at the top)
    base: str  # the revision as given
    commit: str  # what it resolved to
    files: tuple[Version, ...]  # every recipe file at the base or now, sorted by path


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    git = shutil.which("git")
    if git is None:
        raise UsageError("gate check needs git, and there is none on PATH", fix="install git")
    try:
        return subprocess.run(
            [git, "-C", str(cwd), *args],
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"git {args[0]}: {exc}") from None


def _said(proc: subprocess.CompletedProcess[bytes]) -> str:
    text = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    return text[-1] if text else f"exit {proc.returncode}"


def blob_id(data: bytes, length: int) -> str:
    """git's object id of a blob with these bytes (sha1, or sha256 in a sha256 repository)."""
    algo = hashlib.sha256 if length == 64 else hashlib.sha1
    return algo(b"blob %d\0" % len(data) + data).hexdigest()


def _is_recipe(rel: str) -> bool:
    """The files a catalog is made of (recipe.index.recipe_files): *.toml, no dot-named part."""
    return rel.endswith(".toml") and not any(p.startswith(".") for p in rel.split("/"))


def history(root: Path, base: str) -> History:
    """The recipes under root (a directory inside a git work tree), now and at ``base``.
    Usage errors (exit 2): no git, root not in a work tree, a base that names no commit."""
    if base.startswith("-") or not base.strip():
        raise UsageError(f"--base {base!r}: not a revision", fix="give a branch, tag or commit")
    if not root.is_dir():
        raise UsageError(f"{root}: no such recipes directory", fix="pass an existing DIR")
    where = _git(root, "rev-parse", "--show-toplevel", "--show-prefix")
    lines = where.stdout.decode("utf-8", "replace").splitlines()
    if where.returncode != 0 or not lines:
        raise UsageError(
            f"{root}: not inside a git work tree ({_said(where)})",
            fix="run gate check in a checkout of the recipes repository, or pass --recipes DIR "
            "inside one",
        )
    top = Path(lines[0])
    prefix = lines[1] if len(lines) > 1 else ""
    resolved = _git(top, "rev-parse", "--verify", "--quiet", "--end-of-options", base + "^{commit}")
    commit = resolved.stdout.decode().strip()
    if resolved.returncode != 0 or not commit:
        raise UsageError(
            f"--base {base}: names no commit in {top}",
            fix="fetch it first (git fetch origin main; a shallow CI checkout needs "
            "fetch-depth: 0), or give another branch, tag or commit",
        )
    listing = _git(top, "ls-tree", "-r", "-z", "--full-tree", commit, "--", prefix or ".")
    if listing.returncode != 0:
        raise UsageError(f"--base {base}: cannot list {prefix or '.'}: {_said(listing)}")
    at_base: dict[str, str] = {}  # path -> blob id
    for record in listing.stdout.split(b"\0"):
        if not record:
            continue
        meta, _, name = record.partition(b"\t")
        mode, kind, blob_oid = meta.decode().split(" ")
        path = name.decode("utf-8", "surrogateescape")
        rel = path[len(prefix) :] if path.startswith(prefix) else None
        if kind == "blob" and mode != "120000" and rel is not None and _is_recipe(rel):
            at_base[path] = blob_oid
    now = {prefix + rel: p for rel, p in recipe_files(root)}
    files = []
    for path in sorted(set(at_base) | set(now)):
        try:
            new = now[path].read_bytes() if path in now else None
        except OSError as exc:
            raise TensorlessError(f"{path}: cannot read: {exc.strerror or exc}") from None
        oid: str | None = at_base.get(path)
        if oid is not None and new is not None and blob_id(new, len(oid)) == oid:
            files.append(Version(path, new, new, same=True))
            continue
        old = None
        if oid is not None:
            blob = _git(top, "cat-file", "blob", oid)
            if blob.returncode != 0:
                raise UsageError(f"--base {base}: cannot read {path}: {_said(blob)}")
            old = blob.stdout
        files.append(Version(path, old, new))
    return History(top, prefix, base, commit, tuple(files))
