"""What the benches under bench/ share, so that each measures what it says and leaves nothing:
its work folder (under this host set's BASE, removed on every way out, an error's too), its
ports on this machine (apart per host set, so two sets' benches never meet on one port) and
which test hosts it measures (the GPU hosts asked for, never legacy1 or persist1 unasked)."""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from tests.hosts.harness import Host, apply_profile, current_profile, set_index, ssh_argv, ssh_run

T = TypeVar("T")

# Ports a bench opens on this machine: base + PORT_STRIDE x TL_SET, so the sets 0..7 (harness
# MAX_SET) of one bench keep apart and a bench's own ports (up to PORT_STRIDE of them) stay its own.
PORT_STRIDE = 10
_GPU = re.compile(r"gpu([0-9]+)")
# what the benches deploy: tests.hosts.fleet.tiny_recipe's model on the P100 stand-in
MODEL_DIR = "/var/lib/tensorless/models/models--tensorless-test--tiny-llama-GGUF"
UNIT = "tensorless-tiny-p100"
IMAGES = "podman images -q --no-trunc | sort -u"


# The survey itself, timed on the host: its shell and probes, not the SSH session, its output
# thrown away; how long hosts take to answer it alone and side by side on this machine, whatever
# the tool does around it.
_ON_HOST = "a=$(date +%s%N); sh >/dev/null 2>&1; b=$(date +%s%N); echo $(( (b - a) / 1000 )) >&2"


def bare_surveys(hosts: Sequence[Host]) -> float:
    """Seconds until the last of these hosts finished the tool's survey script (facts.survey,
    every section, the default models directory), all started at once over plain ssh."""
    from tensorless_deploy.facts.survey import all_sections, survey_script

    script = survey_script(all_sections())
    procs = [
        subprocess.Popen(
            [*ssh_argv(h), _ON_HOST],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for h in hosts
    ]
    took = []
    for proc in procs:
        _, err = proc.communicate(script, timeout=120)
        took.append(int(err.strip().splitlines()[-1]) / 1e6)
    return max(took)


@contextmanager
def work_dir(prefix: str, parent: Path | None = None) -> Iterator[Path]:
    """A fresh folder for one bench run (under ``parent``: the host set's BASE where the bench
    uses the hosts), removed when the run ends, however it ends."""
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def cached_bytecode(work: Path) -> dict[str, str]:
    """Environment for the tool as an installed wheel runs it: its modules' bytecode compiled
    once (pip compiles at install; here into the work folder, on the first run) and read after,
    whatever PYTHONDONTWRITEBYTECODE this shell has (set, this checkout's modules were compiled
    from source on every run: seconds on a loaded 2-core machine, no part of what is measured)."""
    return {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(work / "pyc")}


def set_port(base: int, index: int | None = None) -> int:
    """The port ``base`` of a bench for host set ``index`` (default: TL_SET)."""
    return base + PORT_STRIDE * set_index(index)


def gpu_hosts(hosts: Mapping[str, T], count: int = 0) -> list[T]:
    """The first ``count`` GPU hosts, gpu1, gpu2, ... in number order (0: all of them); legacy1
    and persist1 are other kinds of host (podman 4.3 without quadlet; a root that persists),
    never counted among them. Asking for more than the set has is refused in one line."""
    numbered = sorted((int(m.group(1)), n) for n in hosts if (m := _GPU.fullmatch(n)))
    if count < 0 or count > len(numbered):
        have = ", ".join(n for _, n in numbered) or "none"
        raise SystemExit(
            f"bench: --hosts {count}, but this host set has {len(numbered)} GPU host(s) "
            f"({have}); boot more with `TL_SET=N bash tests/hosts/setup.sh {max(count, 1)}`"
        )
    return [hosts[n] for _, n in numbered[: count or len(numbered)]]


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, first quartile, third quartile) of values (one value: itself three times)."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return statistics.median(values), q1, q3


@dataclass(frozen=True)
class Found:
    """What a host held before the bench: its GPU profile and its images (ids)."""

    profile: str | None
    images: frozenset[str]


def found(hosts: list[Host]) -> dict[str, Found]:
    """Each host's state before the bench; a host already holding the bench's unit or model is
    refused (the bench would purge it), in one line naming the host and the fix."""
    out: dict[str, Found] = {}
    for h in hosts:
        held = ssh_run(
            h,
            f"ls -d /etc/containers/systemd/{UNIT}.container /etc/systemd/system/{UNIT}.service "
            f"{MODEL_DIR} 2>/dev/null || true",
            timeout=60,
        ).stdout.split()
        if held:
            raise SystemExit(
                f"bench: {h.name} already holds {', '.join(held)}, which the bench would purge; "
                "remove it first (tensorless-deploy stop tiny --purge) or reset the host"
            )
        images = frozenset(ssh_run(h, IMAGES, timeout=60).stdout.split())
        out[h.name] = Found(current_profile(h), images)
    return out


def drop_images(h: Host, keep: frozenset[str], image: str) -> None:
    """Remove the images the bench brought (those not in keep) and the engine image."""
    ssh_run(
        h,
        f"keep='{' '.join(sorted(keep))}'; for i in $({IMAGES}); do "
        'case " $keep " in *" $i "*) ;; *) podman rmi -f "$i" >/dev/null 2>&1 || true;; esac; '
        f"done; podman rmi -f {image} >/dev/null 2>&1 || true",
        timeout=120,
    )


def restore(hosts: list[Host], before: dict[str, Found], image: str) -> None:
    """Each host as the bench found it: its profile back, the images it brought removed, the
    engine image pulled back where the host had it (push rounds remove it)."""
    for h in hosts:
        was = before[h.name]
        apply_profile(h, was.profile or str(h.extra.get("default_profile", h.profile)))
        now = frozenset(ssh_run(h, IMAGES, timeout=60).stdout.split())
        for extra in sorted(now - was.images):
            ssh_run(h, f"podman rmi -f {extra} >/dev/null 2>&1 || true", timeout=120)
        if was.images - now:
            ssh_run(h, f"podman pull -q {image} >/dev/null", timeout=300, check=False)
