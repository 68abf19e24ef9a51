"""GGUF headers of the recipes' files, read by this machine over HTTP Range (a few hundred KiB
of each file, never the whole file), in parallel, through a per-commit cache."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.hostplan.placement import HeaderKey, HeaderResult
from tensorless_deploy.hub import controller_state_dir

HEADER_THREADS = 8


def header_cache_dir() -> Path:
    """$XDG_CACHE_HOME/tensorless-deploy/headers (default ~/.cache/...)."""
    return Path(controller_state_dir()) / "headers"


def read_headers(
    keys: Sequence[HeaderKey], cache_dir: Path | None, endpoint: str | None = None
) -> dict[HeaderKey, HeaderResult]:
    """Each (repo, revision, file) header once, in parallel, through the per-commit cache. A
    token (huggingface_hub's) is looked up only when the server asks for one."""
    from tensorless_deploy.gguf.header import HeaderError, read_hub_header
    from tensorless_deploy.hub import endpoint as hf_endpoint
    from tensorless_deploy.hub import token as hub_token

    base = endpoint or hf_endpoint()
    cache = cache_dir
    if cache is not None:
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError:
            cache = None  # planning still works, it only reads the headers again next time

    def one(key: HeaderKey) -> HeaderResult:
        repo, revision, filename = key
        try:
            try:
                h = read_hub_header(repo, revision, filename, endpoint=base, cache_dir=cache)
            except HeaderError as exc:
                if "HTTP 401" not in exc.message and "HTTP 403" not in exc.message:
                    raise
                token = hub_token()
                if not token:
                    fix = "log in with `hf auth login` or set HF_TOKEN (gated or private repo)"
                    raise HeaderError(exc.message, fix=fix) from None
                h = read_hub_header(
                    repo, revision, filename, token=token, endpoint=base, cache_dir=cache
                )
        except TensorlessError as exc:
            if exc.fix is None and ": cannot fetch: " in exc.message:
                exc.fix = (
                    f"reach {base} (or a mirror of it: HF_ENDPOINT) once; each commit's header is "
                    f"then kept in {cache or header_cache_dir()} and planning needs no network"
                )
            return HeaderResult(None, exc.lines()[0])
        return HeaderResult(h, None, cached=h.bytes_fetched == 0)

    unique = list(dict.fromkeys(keys))
    if not unique:
        return {}
    with ThreadPoolExecutor(min(HEADER_THREADS, len(unique))) as pool:
        return dict(zip(unique, pool.map(one, unique), strict=True))
