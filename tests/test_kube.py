"""export --format kube / podman-kube, pure: golden manifests for every built-in and test recipe,
validated offline against the Kubernetes JSON schemas (kubernetes-validate, pinned in the test
extra: its local strict schemas, no network), read back by PyYAML as the documents rendered;
the same image, args and env as deploy's unit for the same recipe (read back through
launch.read); the same refusals as deploy; the init step is the host's download script, and
it verifies for real here (sh, curl and a loopback Hub server): a tampered file is refused.

tests/golden_kube/<case>/input.json names the recipe and the export's flags; manifest.yaml is
what it renders to. Regenerate after an intended change, then review the diff:

    TENSORLESS_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/test_kube.py

input.json keys:
  recipe   "builtin:<path in the catalog>", "example" (tests/recipe_tools) or "tiny" (the host
           tests' recipe, tests/hosts/fleet.tiny_recipe, with a fixed image digest)
  run      merged into the recipe's [run] before validation
  format   "kube" or "podman-kube"
  flags    decisions.options.Flags keywords (port, instances as typed, context, bind,
           extra_args, allow_draft)
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import posixpath
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes_validate import utils as kv_utils

from tensorless_deploy.decisions.checks import secret_file_checks
from tensorless_deploy.decisions.options import (
    Flags,
    Options,
    check_flags,
    parse_instances,
    resolve,
)
from tensorless_deploy.errors import UsageError
from tensorless_deploy.facts.values import LABEL_RECIPE_DIGEST, LABEL_TUNED, HostFacts
from tensorless_deploy.fleet.export import POD_VOLUME_ROOT, Export, build_export, init_step
from tensorless_deploy.hostplan.plan import plan_host
from tensorless_deploy.launch import kube
from tensorless_deploy.launch.container import Option
from tensorless_deploy.launch.read import UnitContent, drift, read_unit
from tensorless_deploy.launch.spec import LaunchSpec
from tensorless_deploy.operations._run import script
from tensorless_deploy.recipe import load_catalog
from tensorless_deploy.recipe.catalog import Entry, recipe_digest
from tensorless_deploy.recipe.schema import Recipe
from tests.hosts.fleet import tiny_recipe
from tests.hosts.hf_server import HFServer
from tests.recipe_tools import example, write_recipe

TESTS = Path(__file__).parent
GOLDEN = TESTS / "golden_kube"
OPEN = Flags(insecure_open=True)  # a keyless pod on purpose: what these tests look at is elsewhere
MANIFEST = "manifest.yaml"
REGEN = os.environ.get("TENSORLESS_REGEN_GOLDEN") == "1"
HUB = "https://huggingface.co"
# the host tests' tiny recipe as the host set would pin it (a fixed digest stands for the one
# the set's registry reports)
TINY_HOSTS = {
    "tiny_gguf": {
        "sha256": "21bf02ee3940a4cee7694b878eb71c24bc06502970db14f0790e601d824f01b0",
        "size": 520800,
        "hf_file": "tiny-llama.gguf",
    },
    "image": {"ref": "10.253.0.1:5000/tensorless-engine-cpu@sha256:" + "ab" * 32},
}
TINY_COMMIT = "7c1d0f3a9e2b4d6c8a1f3e5b7d9c0a2e4f6b8d01"
# Every Kubernetes version kubernetes-validate 1.37.0 ships schemas for (1.25 to 1.37)
VERSIONS = kv_utils.all_versions()


@pytest.fixture(autouse=True)
def _hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """The init step's URL is the Hub's at the pinned revision (HF_ENDPOINT honoured)."""
    monkeypatch.setenv("HF_ENDPOINT", HUB)


def _recipe(data: dict[str, Any]) -> Recipe:
    name = data["recipe"]
    if name.startswith("builtin:"):
        entry = next(e for e in load_catalog().entries if e.path == name.removeprefix("builtin:"))
        raw = entry.recipe.model_dump(by_alias=True)
    elif name == "example":
        raw = example()
    else:
        raw = tiny_recipe(TINY_HOSTS, TINY_COMMIT)
    raw["run"].update(data.get("run", {}))
    return Recipe.model_validate(raw)


def _flags(given: dict[str, Any]) -> Flags:
    kw = dict(given)
    if "instances" in kw:
        kw["instances"] = parse_instances(str(kw["instances"]))
    kw["extra_args"] = tuple(kw.get("extra_args", ()))
    return check_flags(Flags(**kw))


def export_of(data: dict[str, Any]) -> Export:
    recipe = _recipe(data)
    return build_export(
        recipe, _flags(data.get("flags", {})), data["format"], recipe_digest(recipe)
    )


CASES = sorted(d for d in GOLDEN.iterdir() if (d / "input.json").is_file())


def _input(case: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((case / "input.json").read_text(encoding="utf-8"))
    return data


def test_every_builtin_recipe_has_a_case() -> None:
    named = {_input(c)["recipe"] for c in CASES}
    for entry in load_catalog().entries:
        assert f"builtin:{entry.path}" in named, f"add a tests/golden_kube case for {entry.path}"
    assert {"example", "tiny"} <= named
    assert {_input(c)["format"] for c in CASES} == set(kube.TARGETS)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_golden(case: Path) -> None:
    text = export_of(_input(case)).text
    path = case / MANIFEST
    if REGEN:
        path.write_text(text, encoding="utf-8")
        pytest.fail(f"regenerated {path}: review the diff, then run without the switch")
    assert path.read_text(encoding="utf-8") == text, f"{case.name}: differs from what renders now"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_validates_against_every_kubernetes_version(case: Path) -> None:
    """Strict schemas (no unknown field anywhere), every version the pinned package ships."""
    docs = list(yaml.safe_load_all((case / MANIFEST).read_text(encoding="utf-8")))
    assert docs
    for version in VERSIONS:
        for doc in docs:
            kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_yaml_reads_back_as_the_documents(case: Path) -> None:
    out = export_of(_input(case))
    assert list(yaml.safe_load_all(out.text)) == out.documents
    assert out.text.isascii()


def test_schema_validation_catches_a_bad_manifest() -> None:
    doc = copy.deepcopy(export_of(_input(CASES[0])).documents[0])
    doc["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)


# ---------------------------------------------------------------- what the schemas do not check

_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_DNS_1035 = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
_RESOURCE = re.compile(r"(?:[a-z0-9.-]+/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?")


def _pods(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d["spec"]["template"] for d in docs if d["kind"] == "Deployment"]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_names_and_labels_are_what_the_api_server_takes(case: Path) -> None:
    data = _input(case)
    docs = export_of(data).documents
    for doc in docs:
        meta = doc["metadata"]
        assert _DNS_LABEL.fullmatch(meta["name"]), meta["name"]
        if doc["kind"] == "Service":
            assert _DNS_1035.fullmatch(meta["name"])
        for value in meta["labels"].values():
            assert len(value) <= 63 and _LABEL_VALUE.fullmatch(value), value
    for pod in _pods(docs):
        spec = pod["spec"]
        for c in spec["initContainers"] + spec["containers"]:
            assert _DNS_LABEL.fullmatch(c["name"])
        for v in spec["volumes"]:
            assert _DNS_LABEL.fullmatch(v["name"])
        (server,) = spec["containers"]
        for name in server["resources"]["limits"]:
            if data["format"] == "kube":  # podman-kube's CDI names are podman's, not the API's
                assert _RESOURCE.fullmatch(name), name


def test_recipe_digest_label_fits_and_annotation_holds_it_all() -> None:
    recipe = _recipe({"recipe": "example"})
    pod = _pods(build_export(recipe, OPEN, "kube", recipe_digest(recipe)).documents)[0]
    digest = recipe_digest(recipe)
    assert pod["metadata"]["annotations"][LABEL_RECIPE_DIGEST] == digest
    label = pod["metadata"]["labels"][LABEL_RECIPE_DIGEST]
    assert len(label) == 63 and digest == "sha256:" + label + digest[-1]


def test_card_is_gfd_labels_and_one_gpu_per_pod() -> None:
    recipe = _recipe({"recipe": "example"})
    docs = build_export(recipe, Flags(instances=3, insecure_open=True), "kube", "d").documents
    (deployment, service) = docs
    assert deployment["spec"]["replicas"] == 3 and service["kind"] == "Service"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "nvidia.com/gpu.compute.major": "6",
        "nvidia.com/gpu.compute.minor": "0",
    }
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    exprs = [t["matchExpressions"] for t in terms["nodeSelectorTerms"]]
    assert all(
        {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["15999"]} in e for e in exprs
    )


def _driver_ok(terms: list[list[dict[str, Any]]], labels: dict[str, str]) -> bool:
    """The node selector terms as the scheduler reads them: any term, all its expressions."""

    def holds(e: dict[str, Any]) -> bool:
        have = labels.get(e["key"], "")
        if not have.isdigit():
            return False
        n, bound = int(have), int(e["values"][0])
        return n > bound if e["operator"] == "Gt" else n < bound

    return any(all(holds(e) for e in term) for term in terms)


@pytest.mark.parametrize(
    ("driver", "ok"),
    [
        ("525.60.13", True),
        ("525.60.12", False),
        ("525.61.01", True),
        ("525.59.99", False),
        ("526.01", True),
        ("524.99.99", False),
        ("535.183.01", True),
        ("580.65.06", True),
        ("525.060.13", True),  # GFD writes the parts as the driver prints them
    ],
)
def test_driver_terms_mean_at_least_min_driver(driver: str, ok: bool) -> None:
    parts = [*driver.split("."), ""]
    labels = dict(zip(kube.GFD_DRIVER, parts, strict=False))
    assert _driver_ok(kube._driver_terms("525.60.13"), labels) is ok


def test_untuned_export_says_so() -> None:
    recipe = _recipe({"recipe": "tiny"})
    flags = Flags(context=2048, extra_args=("--no-warmup",), insecure_open=True)
    pod = _pods(build_export(recipe, flags, "kube", "d").documents)[0]
    assert pod["metadata"]["labels"][LABEL_TUNED] == "false"
    reasons = pod["metadata"]["annotations"][kube.UNTUNED_ANNOTATION]
    assert "context 2048" in reasons and "--no-warmup" in reasons
    tuned = _pods(build_export(recipe, OPEN, "kube", "d").documents)[0]
    assert tuned["metadata"]["labels"][LABEL_TUNED] == "true"
    assert kube.UNTUNED_ANNOTATION not in tuned["metadata"]["annotations"]


def test_no_secret_in_the_manifest() -> None:
    recipe = _recipe({"recipe": "tiny"})
    pod = _pods(build_export(recipe, OPEN, "kube", "d").documents)[0]["spec"]
    (token,) = pod["initContainers"][0]["env"]
    assert token["valueFrom"]["secretKeyRef"] == {
        "name": kube.HF_TOKEN_SECRET,
        "key": kube.HF_TOKEN_KEY,
        "optional": True,
    }
    assert "value" not in token


# ------------------------------------------------------------------------------- as deploy does


def _host_facts() -> HostFacts:
    """A podman 5 host with two P100s (real survey output), CPUs enough for threads_max."""
    data = json.loads((TESTS / "facts" / "survey" / "mixed-p100-t4-podman5.json").read_text())
    facts = HostFacts.model_validate(data["expected"])
    return facts.model_copy(update={"cpus": 64})


def kube_content(deployment: dict[str, Any]) -> UnitContent:
    """The Deployment's server container read back as launch.read reads a unit: its image, its
    options (env; the model volume as host path:mount:ro) and llama-server's argv."""
    (server,) = deployment["spec"]["template"]["spec"]["containers"]
    opts: list[tuple[Any, str]] = [("env", f"{e['name']}={e['value']}") for e in server["env"]]
    for m in server["volumeMounts"]:
        if m["name"].endswith("-model"):
            src = posixpath.join(POD_VOLUME_ROOT, m["subPath"])
            opts.append(("volume", f"{src}:{m['mountPath']}:ro" if m["readOnly"] else ""))
    return UnitContent(server["image"], tuple(opts), tuple(server["args"]))


@pytest.mark.parametrize(
    "data",
    [
        {"recipe": "example", "flags": {"insecure_open": True}},
        {"recipe": "tiny", "flags": {"port": 9090, "api_key_file": "/etc/tensorless/api.key"}},
        {
            "recipe": "tiny",
            "flags": {
                "context": 2048,
                "extra_args": ["--no-warmup", "-b", "64"],
                "insecure_open": True,
            },
        },
    ],
    ids=["example", "tiny-port-key", "tiny-untuned"],
)
def test_same_image_args_env_and_model_as_deploys_unit(data: dict[str, Any]) -> None:
    """deploy's quadlet for the same recipe and options (bound to the pod's address) and the
    export differ in nothing launch.read compares but the card (a CDI device there, the device
    plugin's choice here)."""
    recipe = _recipe(data)
    flags = _flags(data.get("flags", {}))
    deployment = build_export(recipe, flags, "kube", recipe_digest(recipe)).documents[0]
    options = Options(
        port=flags.port or 8080,
        bind=kube.POD_BIND,
        context=flags.context,
        instances=1,
        extra_args=flags.extra_args,
        api_key_file=flags.api_key_file,
        insecure_open=bool(flags.insecure_open),
    )
    entry = Entry(f"{recipe.model.hf_repo}/{recipe.card.id}.toml", recipe)
    plan = plan_host("gpu1", _host_facts(), [entry], options, sizing=None)
    unit = plan.instances[0].unit
    assert unit is not None and unit.kind == "quadlet"
    deployed = read_unit(unit.path, unit.content)
    exported = kube_content(deployment)
    assert deployed.image == exported.image == recipe.engine.image
    assert deployed.server_args == exported.server_args
    assert sorted(deployed.values("env")) == sorted(exported.values("env"))
    # the key: the same --api-key-file path in both argvs (above); its source is a host file
    # there and a Secret here, so that one mount is compared by its container path alone
    secret_mounts = {
        o for o in deployed.options if o[0] == "volume" and ":/run/tensorless/" in o[1]
    }
    assert {o[1].split(":")[1] for o in secret_mounts} == (
        {"/run/tensorless/api-key"} if flags.api_key_file else set()
    )
    mounts = {m["mountPath"] for m in deployment["spec"]["template"]["spec"]["containers"][0][
        "volumeMounts"]}  # fmt: skip
    assert {o[1].split(":")[1] for o in secret_mounts} <= mounts
    deployed = dataclasses.replace(
        deployed, options=tuple(o for o in deployed.options if o not in secret_mounts)
    )
    assert [d.field for d in drift(deployed, exported, "", "")] == ["card"]


SECRETS = TESTS / "fixtures" / "secrets"
# One command line each, for both targets: what export and deploy must decide alike
AS_DEPLOY = [
    pytest.param(
        {"cors_origins": "https://a.example, https://b.example", "insecure_open": True},
        id="origins-as-typed",
    ),
    pytest.param(
        {"instances": "2", "port": 9000, "metrics": True, "insecure_open": True},
        id="two-instances-metrics",
    ),
    pytest.param(
        {
            "instances": "2",
            "port": 65534,
            "context": 2048,
            "extra_args": ["--no-warmup"],
            "api_key_file": str(SECRETS / "api.key"),
            "tls_cert_file": str(SECRETS / "tls.crt"),
            "tls_key_file": str(SECRETS / "tls.key"),
            "cors_origins": "*",
        },
        id="key-tls-last-ports",
    ),
]


@pytest.mark.parametrize("fmt", kube.TARGETS)
@pytest.mark.parametrize("given", AS_DEPLOY)
def test_export_decides_as_the_host_plan(fmt: kube.Target, given: dict[str, Any]) -> None:
    """export is a renderer of the host plan: for the same command line, deploy's plan of a
    host with the recipe's cards (resolve, layout, the launch spec; llama-server bound to the
    pod's address) has the instances the export renders, by name and port, with the same
    llama-server argv and env (on kube one pod of it, as many replicas as asked). export once
    decided these again: `--cors-origins "https://a.example, https://b.example"` reached the
    pod's argv as typed, where deploy gives llama-server the origins resolved
    (https://a.example,https://b.example)."""
    recipe = _recipe({"recipe": "tiny"})
    flags = _flags(given)
    out = build_export(recipe, flags, fmt, recipe_digest(recipe))
    count = flags.instances if isinstance(flags.instances, int) else 1
    pods = 1 if fmt == "kube" else count
    options = resolve(dataclasses.replace(flags, bind=kube.POD_BIND, instances=pods))
    entry = Entry(f"{recipe.model.hf_repo}/{recipe.card.id}.toml", recipe)
    plan = plan_host("gpu1", _host_facts(), [entry], options, sizing=None)
    assert len(plan.instances) == pods
    deployed = [(i.name, i.spec.port, i.spec.server_args, i.spec.env) for i in plan.instances]
    exported = [(w.spec.name, w.spec.port, w.spec.server_args, w.spec.env) for w in out.workloads]
    assert exported == deployed
    assert [w.replicas for w in out.workloads] == [count // pods] * pods
    server = out.documents[0]["spec"]["template"]["spec"]["containers"][0]
    assert server["args"] == list(plan.instances[0].spec.server_args)


def test_the_operators_files_are_checked_as_deploy_checks_them(tmp_path: Path) -> None:
    """export once read the key file itself and never the TLS pair: a certificate that is no
    PEM was named in the manifest (the pod failed only once the operator made its Secret),
    where deploy's api.tls_files check refuses it. Now the same checks refuse both."""
    recipes = _catalog(tmp_path / "r")
    base = ("export", "tiny", "--recipes", str(recipes), "--format", "podman-kube")
    cert, key = str(SECRETS / "api.key"), str(SECRETS / "tls.key")  # a key is no certificate
    deploy = secret_file_checks(resolve(Flags(tls_cert_file=cert, tls_key_file=key)))
    (tls,) = [c for c in deploy if c.id == "api.tls_files"]
    assert tls.status == "fail"
    proc = cli(*base, "--tls-cert-file", cert, "--tls-key-file", key)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("--tls-cert-file/--tls-key-file: ") and tls.evidence in line, line
    ok = cli(*base, "--tls-cert-file", str(SECRETS / "tls.crt"), "--tls-key-file", key)
    assert ok.returncode == 0, ok.stderr


def test_every_format_has_a_placement_and_a_renderer() -> None:
    """A --format value is a row of hostplan.export.FORMATS and one of fleet.export.RENDERERS
    (docs/architecture.md, "Adding an export target"); export's --format offers exactly them."""
    from tensorless_deploy.fleet.export import RENDERERS
    from tensorless_deploy.hostplan.export import FORMATS

    assert tuple(FORMATS) == tuple(RENDERERS) == kube.TARGETS
    assert f"--format {{{','.join(FORMATS)}}}" in cli("export", "--help").stdout


def test_cli_export_only_parses_calls_and_prints() -> None:
    """cli/export.py decides nothing: it imports no launch, operations or facts module (at
    run time or for the type checker); the plan is hostplan.export's, the manifest
    fleet.export's."""
    from tests.test_layers import REPO as ROOT_DIR
    from tests.test_layers import ROOT, imports_of

    path = ROOT / "cli" / "export.py"
    source = path.read_text(encoding="utf-8")
    seen = {i.target for i in imports_of(path, ROOT, ROOT_DIR)}
    seen |= set(re.findall(r"from (tensorless_deploy\.[\w.]+) import", source))
    below = ("launch", "operations", "facts")
    assert not [t for t in seen if t.split(".")[1] in below], seen
    assert "tensorless_deploy.fleet.export" in seen


# ------------------------------------------------------------------------------------- refusals


def _catalog(tmp_path: Path, **top: Any) -> Path:
    data = tiny_recipe(TINY_HOSTS, TINY_COMMIT)
    data.update(top)
    write_recipe(tmp_path, data)
    return tmp_path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_ENDPOINT": HUB}
    return subprocess.run(
        [sys.executable, "-m", "tensorless_deploy", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_draft_refused_as_deploy_refuses_it() -> None:
    recipe = _recipe({"recipe": "tiny"}).model_copy(update={"status": "draft"})
    with pytest.raises(UsageError, match="draft recipe"):
        build_export(recipe, OPEN, "kube", "d")
    build_export(recipe, Flags(allow_draft=True, insecure_open=True), "kube", "d")


def test_unpublished_refused_even_with_allow_draft() -> None:
    recipe = _recipe({"recipe": "tiny"})
    model = recipe.model.model_copy(update={"sha256": "0" * 64})
    with pytest.raises(UsageError, match="not published"):
        build_export(
            recipe.model_copy(update={"model": model}),
            Flags(allow_draft=True, insecure_open=True),
            "kube",
            "d",
        )


@pytest.mark.parametrize(
    "bad", [["--port", "9"], ["-m", "/x.gguf"], ["--host=0.0.0.0"], ["-hf", "a/b"]]
)
def test_launcher_owned_and_forbidden_flags_after_dashes_refused(
    tmp_path: Path, bad: list[str]
) -> None:
    proc = cli(
        "export",
        "tiny",
        "--recipes",
        str(_catalog(tmp_path)),
        "--format",
        "kube",
        "--insecure-open",
        "--",
        *bad,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("fmt", "extra", "says"),
    [
        ("kube", ["--instances", "all"], "no host to count cards on"),
        ("kube", ["--instances", "0,1"], "the device plugin picks the cards"),
        ("kube", ["--bind", "0.0.0.0"], "a pod's address is the cluster's"),
        ("kube", ["--port", "70000"], "--port 70000"),
        ("podman-kube", ["--port", "65535", "--instances", "2"], "beyond 65535"),
    ],
)
def test_usage_errors(tmp_path: Path, fmt: str, extra: list[str], says: str) -> None:
    proc = cli(
        "export",
        "tiny",
        "--recipes",
        str(_catalog(tmp_path)),
        "--format",
        fmt,
        "--insecure-open",
        *extra,
    )
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr


def test_cli_writes_the_manifest(tmp_path: Path) -> None:
    recipes = _catalog(tmp_path / "r")
    out = tmp_path / "tiny.yaml"
    proc = cli("export", "tiny", "--recipes", str(recipes), "--format", "kube", "-o", str(out),
               "--insecure-open")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    recipe = _recipe({"recipe": "tiny"})
    want = build_export(recipe, OPEN, "kube", recipe_digest(recipe)).text
    assert out.read_text(encoding="utf-8") == want and proc.stdout == ""
    assert "tensorless-tiny-p100: 1 pod(s), port 8080" in proc.stderr
    stdout = cli("export", "tiny", "--recipes", str(recipes), "--format", "kube", "--insecure-open")
    assert stdout.stdout == want
    js = cli("--json", "export", "tiny", "--recipes", str(recipes), "--format", "kube",
             "--insecure-open")  # fmt: skip
    assert json.loads(js.stdout)["documents"] == list(yaml.safe_load_all(want))


def test_several_cards_need_card(tmp_path: Path) -> None:
    recipes = _catalog(tmp_path)
    h200 = tiny_recipe(TINY_HOSTS, TINY_COMMIT)
    h200["card"].update(id="h200", compute_capability="9.0", min_memory_mib=140000)
    write_recipe(tmp_path, h200)
    proc = cli("export", "tiny", "--recipes", str(recipes), "--format", "kube", "--insecure-open")
    assert proc.returncode == 2 and "pass --card (" in proc.stderr
    ok = cli("export", "tiny", "--recipes", str(recipes), "--format", "kube", "--card", "h200",
             "--insecure-open")  # fmt: skip
    assert ok.returncode == 0 and '"9"' in ok.stdout


# ------------------------------------------------------------------ the launch spec, generically


def _spec() -> LaunchSpec:
    recipe = _recipe({"recipe": "tiny"})
    return build_export(recipe, OPEN, "kube", "d").workloads[0].spec


def test_every_spec_field_has_a_place() -> None:
    missing = {f.name for f in dataclasses.fields(LaunchSpec)} - set(kube.SPEC_FIELDS)
    assert not missing, f"say in launch/kube.py SPEC_FIELDS where {missing} lands"


def test_spec_additions_flow_into_the_manifest() -> None:
    spec = _spec()
    grown = dataclasses.replace(
        spec,
        labels=(*spec.labels, ("io.tensorless.new", "x y/z")),
        env=(*spec.env, ("GGML_NEW", "1")),
        server_args=(*spec.server_args, "--new-flag"),
    )
    recipe = _recipe({"recipe": "tiny"})
    init = init_step(recipe, "/var/lib/tensorless/models")
    pod = kube.render_documents(recipe, [kube.Workload(grown)], init, "kube")[0]["spec"]["template"]
    server = pod["spec"]["containers"][0]
    assert pod["metadata"]["annotations"]["io.tensorless.new"] == "x y/z"
    assert {"name": "GGML_NEW", "value": "1"} in server["env"]
    assert server["args"][-1] == "--new-flag"


def test_an_unknown_volume_is_refused_not_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host path the option set mounts that has no Kubernetes volume here stops the export."""
    real = kube.container_options

    def more(spec: LaunchSpec, *, health: bool) -> tuple[Option, ...]:
        return (*real(spec, health=health), Option("volume", "/srv/other:/other:ro"))

    monkeypatch.setattr(kube, "container_options", more)
    recipe = _recipe({"recipe": "tiny"})
    with pytest.raises(kube.KubeError, match="no Kubernetes volume for /srv/other"):
        build_export(recipe, OPEN, "kube", "d")


def test_bind_must_be_the_pods_own() -> None:
    recipe = _recipe({"recipe": "tiny"})
    init = init_step(recipe, "/var/lib/tensorless/models")
    spec = dataclasses.replace(_spec(), bind="127.0.0.1")
    with pytest.raises(kube.KubeError, match=r"must bind 0\.0\.0\.0"):
        kube.render_documents(recipe, [kube.Workload(spec)], init, "kube")


def test_long_names_are_shortened_apart() -> None:
    a = kube.dns_label("tensorless-" + "a" * 80 + "-p100")
    b = kube.dns_label("tensorless-" + "a" * 80 + "-h200")
    assert len(a) <= 63 and len(b) <= 63 and a != b
    assert kube.dns_label("tensorless-pn3-p100") == "tensorless-pn3-p100"


@settings(deadline=None)  # a busy machine; the property, not the speed, is tested
@given(st.one_of(st.text(), st.text(alphabet=" \n\tab-:#|>'\"")))
def test_yaml_strings_read_back_exactly(text: str) -> None:
    doc = {"k": text, text or "empty": [text, {"n": text}]}
    out = kube.to_yaml([doc])
    assert out.isascii()
    assert yaml.safe_load(out) == doc


@pytest.mark.parametrize(
    "text",
    [
        "yes",
        "No",
        "on",
        "null",
        "~",
        "0.0.0.0",
        "8080",
        "-c",
        "a: b",
        "#x",
        "=",
        "1e3",
        "x\n",
        "a\n\nb\n\n",
        "\n",
        "\n\n",
        "\n x",
        "|",
        "0" * 1100,
    ],
)
def test_yaml_never_retypes_a_string(text: str) -> None:
    assert yaml.safe_load(kube.to_yaml([{"k": text, text: [text]}])) == {"k": text, text: [text]}


# ------------------------------------------------------------------------------- the init step


def test_init_step_is_the_hosts_download_script() -> None:
    """The init container runs exactly what operations.model runs on a host to download
    (operations/_run.script: lib.sh, then model-download.sh, its parameters bound), after the
    few lines that turn the optional Secret into the header file the script reads."""
    recipe = _recipe({"recipe": "tiny"})
    deployment = build_export(recipe, OPEN, "kube", "d").documents[0]
    command = deployment["spec"]["template"]["spec"]["initContainers"][0]["command"]
    assert command[:2] == ["/bin/sh", "-c"]
    init = init_step(recipe, "/var/lib/tensorless/models")
    m = recipe.model
    from tensorless_deploy.hub import cache_paths, host_state_dir, resolve_url

    models = "/var/lib/tensorless/models"
    paths = cache_paths(models, host_state_dir(models), m.hf_repo, m.revision, m.file, m.sha256)
    host = script(
        "model-download",
        blob=paths.blob,
        stamp=paths.stamp,
        snapshot=paths.snapshot,
        target=paths.link_target,
        sha=m.sha256,
        partial=paths.partial,
        lock=paths.lock,
        size=m.size_bytes,
        url=resolve_url(m.hf_repo, m.revision, m.file),
        attempts=5,
    )
    (bits,) = host.bits
    assert shlex.split(str(bits)) == ["sh", "-c", init.script]
    assert command[2].endswith("\n" + init.script)
    assert init_step(recipe, models).script in command[2]
    assert f"url={HUB}/{m.hf_repo}/resolve/{m.revision}/{m.file}\n" in init.script
    server = deployment["spec"]["template"]["spec"]["containers"][0]
    (model,) = [v for v in server["volumeMounts"] if v["name"].endswith("-model")]
    assert posixpath.join(POD_VOLUME_ROOT, model["subPath"]) == paths.blob
    assert model["readOnly"] is True and model["mountPath"] == "/models/tiny-llama.gguf"


DATA = b"GGUF" + bytes(range(256)) * 400  # what the loopback Hub serves
REPO, FILE = "tensorless-test/tiny-llama-GGUF", "tiny-llama.gguf"


@pytest.fixture
def hub_server() -> Iterator[HFServer]:
    with HFServer("127.0.0.1", 0) as srv:
        srv.publish(REPO, {FILE: DATA}, commit=TINY_COMMIT)
        yield srv


def _run_init(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, url: str, token: str | None = None
) -> tuple[Recipe, Path, subprocess.CompletedProcess[str]]:
    """The init container's program, run by sh here against a loopback Hub: the pod's paths
    moved under tmp_path (the program is otherwise exactly the rendered one)."""
    raw = tiny_recipe(
        {
            "tiny_gguf": {
                "sha256": hashlib.sha256(DATA).hexdigest(),
                "size": len(DATA),
                "hf_file": "tiny-llama.gguf",
            },
            "image": TINY_HOSTS["image"],
        },
        TINY_COMMIT,
    )
    recipe = Recipe.model_validate(raw)
    (tmp_path / "secrets").mkdir(parents=True)
    monkeypatch.setenv("HF_ENDPOINT", url)
    init = dataclasses.replace(
        init_step(recipe, str(tmp_path / "lib" / "models")),
        auth_file=str(tmp_path / "secrets" / "hf-auth"),
    )
    env = {"PATH": os.environ["PATH"], **({"HF_TOKEN": token} if token else {})}
    proc = subprocess.run(
        ["/bin/sh", "-c", kube._init_program(init)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    return recipe, tmp_path / "lib" / "models", proc


def test_init_downloads_and_verifies(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, hub_server: HFServer
) -> None:
    recipe, models, proc = _run_init(monkeypatch, tmp_path, hub_server.url)
    assert proc.returncode == 0, proc.stderr
    assert "sha256 verified" in proc.stdout
    blob = models / "models--tensorless-test--tiny-llama-GGUF" / "blobs" / recipe.model.sha256
    assert blob.read_bytes() == DATA


def test_init_refuses_a_tampered_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, hub_server: HFServer
) -> None:
    hub_server.add_fault("corrupt", repo_id=REPO, filename=FILE)
    _, models, proc = _run_init(monkeypatch, tmp_path, hub_server.url)
    assert proc.returncode == 1
    assert "refused and deleted" in proc.stderr
    blobs = models / "models--tensorless-test--tiny-llama-GGUF" / "blobs"
    assert list(blobs.iterdir()) == []


def test_init_sends_the_token_from_the_secret_and_removes_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, hub_server: HFServer
) -> None:
    hub_server.require_token(REPO, "hf_secret_for_test")
    _, _, refused = _run_init(monkeypatch, tmp_path / "a", hub_server.url)
    assert refused.returncode == 1
    _, _, proc = _run_init(monkeypatch, tmp_path / "b", hub_server.url, token="hf_secret_for_test")
    assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "b" / "secrets").iterdir()) == []  # the header file is gone
    assert "hf_secret_for_test" not in proc.stdout + proc.stderr


def test_a_pod_beyond_loopback_needs_a_key_or_insecure_open(tmp_path: Path) -> None:
    """As deploy's api.key check: a kube pod listens on its cluster address and podman-kube
    publishes on --bind, so a keyless export beyond loopback is refused with the fix; a key
    file is checked here and referenced as the Secret, its content never in the manifest."""
    recipes = _catalog(tmp_path / "r")
    base = ("export", "tiny", "--recipes", str(recipes), "--format")
    for extra in (["kube"], ["podman-kube", "--bind", "0.0.0.0"]):
        proc = cli(*base, *extra)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        (line,) = proc.stderr.splitlines()
        assert "would take requests from anyone who reaches it: no API key" in line
        assert "--api-key-file FILE" in line and "--insecure-open" in line
    assert cli(*base, "podman-kube").returncode == 0  # published on 127.0.0.1: keyless is fine
    cert = str(TESTS / "fixtures" / "secrets" / "tls.crt")
    half = cli(*base, "kube", "--insecure-open", "--tls-cert-file", cert)  # its key left out
    assert half.returncode == 2, half.stdout + half.stderr
    assert half.stderr.startswith("--tls-cert-file without --tls-key-file"), half.stderr
    bad = tmp_path / "short.key"
    bad.write_text("abc\n")
    proc = cli(*base, "kube", "--api-key-file", str(bad))
    assert proc.returncode == 2 and proc.stderr.startswith("--api-key-file: "), proc.stderr
    key_file = TESTS / "fixtures" / "secrets" / "api.key"
    proc = cli(*base, "kube", "--api-key-file", str(key_file))
    assert proc.returncode == 0, proc.stderr
    assert key_file.read_text().strip() not in proc.stdout
    pod = _pods(list(yaml.safe_load_all(proc.stdout)))[0]["spec"]
    server = next(c for c in pod["containers"] if "--api-key-file" in c["args"])
    assert server["args"][server["args"].index("--api-key-file") + 1] == "/run/tensorless/api-key"
    secrets = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
    assert "tensorless-api-key" in secrets
    assert "kubectl create secret generic tensorless-api-key" in proc.stdout  # the comment
