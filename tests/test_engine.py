"""Engine image definitions: Containerfile lint (hadolint-style rules, in Python) and the pure
parts of engine/build.sh (pin refusal, digest line). Nothing here builds, pulls or downloads."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ENGINE = REPO / "engine"
BUILD_SH = ENGINE / "build.sh"
CONTAINERFILES = sorted(ENGINE.glob("sm*/Containerfile"))
ARCHES = [p.parent.name for p in CONTAINERFILES]

HEX40 = re.compile(r"[0-9a-f]{40}")
HEX64 = re.compile(r"[0-9a-f]{64}")
# NAME[:TAG]@sha256:DIGEST, or the documented placeholder that build.sh refuses.
PINNED_REF = re.compile(
    r"[a-z0-9./_-]+(?::[A-Za-z0-9._-]+)?@sha256:(?:[0-9a-f]{64}|PLACEHOLDER\S*)"
)
PIN_ARGS = ("LLAMA_CPP_URL", "LLAMA_CPP_SHA256", "LLAMA_CPP_TREE")
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def runs(self) -> list[str]:
        return [args for op, args in self.instructions if op == "RUN"]

    def ops(self, op: str) -> list[str]:
        return [args for o, args in self.instructions if o == op]


@dataclass
class Containerfile:
    path: Path
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def arch(self) -> str:
        return self.path.parent.name

    @property
    def final(self) -> Stage:
        return self.stages[-1]


def parse(path: Path) -> Containerfile:
    """Instructions of a Containerfile: comments dropped, continuation lines joined."""
    logical: list[str] = []
    buf = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    assert not buf, f"{path}: dangling line continuation"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for text in logical:
        op, _, args = text.partition(" ")
        op, args = op.upper(), " ".join(args.split())
        if op == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages:
            assert op == "ARG", f"{path}: only ARG may come before the first FROM, found {op}"
            key, _, value = args.partition("=")
            global_args[key] = value
        else:
            stages[-1].instructions.append((op, args))
    return Containerfile(path, global_args, stages)


def apt_installs(stage: Stage) -> list[tuple[str, list[str]]]:
    """(RUN text, package names) for every apt-get install in the stage."""
    found = []
    for run in stage.runs():
        for cmd in re.split(r"&&|;|\|\|", run):
            words = cmd.split()
            if "apt-get" in words and "install" in words:
                after = words[words.index("install") + 1 :]
                found.append((run, [w for w in after if not w.startswith("-")]))
    return found


@pytest.fixture(params=CONTAINERFILES, ids=ARCHES)
def cf(request: pytest.FixtureRequest) -> Containerfile:
    path: Path = request.param
    return parse(path)


def test_every_gpu_family_has_a_containerfile() -> None:
    assert ARCHES == ["sm60", "sm90"]


def test_every_from_is_pinned_by_digest_never_latest(cf: Containerfile) -> None:
    assert len(cf.stages) >= 2, "multi-stage: a build stage and a runtime stage"
    for stage in cf.stages:
        assert PINNED_REF.fullmatch(stage.base), f"{cf.arch}: FROM {stage.base} is not by digest"
        assert ":latest" not in stage.base and "$" not in stage.base


def test_cuda_bases_fit_the_family(cf: Containerfile) -> None:
    versions = []
    for stage in cf.stages:
        m = re.search(r"nvidia/cuda:(\d+)\.(\d+)\.(\d+)-(devel|runtime)-", stage.base)
        assert m, f"{cf.arch}: {stage.base} is not an nvidia/cuda devel or runtime image"
        versions.append((m.group(1, 2, 3), m.group(4)))
    assert versions[0][1] == "devel" and versions[-1][1] == "runtime"
    assert {v for v, _ in versions} == {versions[0][0]}, "build and runtime share one CUDA version"
    major, minor = int(versions[0][0][0]), int(versions[0][0][1])
    cc = int(cf.arch[2:])
    if cc < 75:  # CUDA 13 cannot target compute capability < 7.5
        assert major == 12, f"{cf.arch} needs CUDA 12.x"
    if cc >= 90:
        assert (major, minor) >= (12, 8), f"{cf.arch}: a current CUDA (12.8+ or 13.x)"


def test_apt_installs_are_minimal_and_cleaned(cf: Containerfile) -> None:
    for stage in cf.stages:
        for run, _packages in apt_installs(stage):
            assert "--no-install-recommends" in run and " -y" in run, run
            assert "rm -rf /var/lib/apt/lists/*" in run, f"apt lists not removed in: {run}"
            assert "apt-get update" in run, "update and install in one RUN layer"
        for run in stage.runs():
            if "apt-get update" in run:
                assert apt_installs(Stage("", None, [("RUN", run)])), f"lone apt-get update: {run}"


def test_nothing_is_fetched_inside_the_build(cf: Containerfile) -> None:
    for stage in cf.stages:
        for args in stage.ops("ADD"):
            assert not re.search(r"https?://", args), f"ADD of a URL: {args}"
        for run in stage.runs():
            commands = [c.split() for c in re.split(r"&&|;|\|\|?", run)]
            fetchers = [c for c in commands if c and c[0] in ("curl", "wget", "git", "pip")]
            assert not fetchers, f"{cf.arch}: a RUN downloads; build.sh downloads and verifies"
    build = "\n".join(cf.stages[0].runs())
    for off in ("LLAMA_BUILD_WEBUI=OFF", "LLAMA_BUILD_BORINGSSL=OFF", "LLAMA_BUILD_LIBRESSL=OFF",
                "FETCHCONTENT_FULLY_DISCONNECTED=ON", "LLAMA_CURL=OFF"):  # fmt: skip
        assert f"-D{off}" in build, f"{cf.arch}: -D{off} (no download at configure or build time)"


def test_source_archive_is_checked_before_it_is_unpacked(cf: Containerfile) -> None:
    copies = cf.stages[0].ops("COPY")
    assert any(c.startswith("llama.cpp.tar.gz ") for c in copies), "archive from the build context"
    runs = cf.stages[0].runs()
    unpack = next(r for r in runs if "tar -x" in r)
    assert 'echo "${LLAMA_CPP_SHA256} /src/llama.cpp.tar.gz" | sha256sum -c -' in unpack
    # sha256sum -c wants two spaces between hash and name (the parse above folds them)
    assert '"${LLAMA_CPP_SHA256}  /src/llama.cpp.tar.gz"' in cf.path.read_text()
    assert unpack.index("sha256sum -c") < unpack.index("tar -x")


def test_one_cuda_architecture_the_familys(cf: Containerfile) -> None:
    build = " ".join(cf.stages[0].runs())
    values = re.findall(r"-DCMAKE_CUDA_ARCHITECTURES=(\S+)", build)
    assert values == [cf.arch[2:]], f"{cf.arch}: CMAKE_CUDA_ARCHITECTURES={values}"
    for flag in ("-DGGML_CUDA=ON", "-DGGML_NATIVE=OFF", "-DLLAMA_BUILD_SERVER=ON",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"):  # fmt: skip
        assert flag in build, f"{cf.arch}: {flag}"
    assert "--target llama-server" in build


def test_final_stage_is_the_engine_image_contract(cf: Containerfile) -> None:
    final = cf.final
    (entrypoint,) = final.ops("ENTRYPOINT")
    assert json.loads(entrypoint) == ["/usr/bin/llama-server"], "exec form, llama-server"
    assert not final.ops("CMD"), "the units pass every llama-server argument"
    assert any("curl" in pkgs for _, pkgs in apt_installs(final)), "curl for the /health check"
    assert final.ops("EXPOSE") == ["8080"]
    copies = final.ops("COPY")
    assert all(c.startswith("--from=") for c in copies), "only build outputs reach the runtime"
    assert any(c.endswith(" /usr/bin/llama-server") for c in copies)
    (user,) = final.ops("USER")
    assert user.split(":")[0] not in ("0", "root"), "not root"
    labels = " ".join(final.ops("LABEL"))
    assert 'org.opencontainers.image.revision="sha256:${LLAMA_CPP_SHA256}"' in labels
    assert 'org.opencontainers.image.source="${LLAMA_CPP_URL}"' in labels
    assert f'io.tensorless.engine.arch="{cf.arch}"' in labels
    assert f'io.tensorless.engine.cuda-architectures="{cf.arch[2:]}"' in labels


def test_stage_args_are_declared_globally(cf: Containerfile) -> None:
    for stage in cf.stages:
        for arg in stage.ops("ARG"):
            assert "=" not in arg, f"{cf.arch}: a stage ARG redeclares, never re-pins: {arg}"
            assert arg in cf.global_args, f"{cf.arch}: ARG {arg} has no pinned default"


def test_source_pins_are_well_formed_and_equal_in_every_file() -> None:
    pins = [{k: parse(p).global_args.get(k) for k in PIN_ARGS} for p in CONTAINERFILES]
    for arch, pin in zip(ARCHES, pins, strict=True):
        url = pin["LLAMA_CPP_URL"] or ""
        assert url.startswith("https://files.pythonhosted.org/packages/") and url.endswith(
            "/llama_cpp_python-0.3.36.tar.gz"), arch  # fmt: skip
        # the sdist's sha256 as PyPI records it and as a download of it hashed here
        assert pin["LLAMA_CPP_SHA256"] == SDIST_SHA256, arch
        assert pin["LLAMA_CPP_TREE"] == "llama_cpp_python-0.3.36/vendor/llama.cpp", arch
    assert all(p == pins[0] for p in pins), f"one llama.cpp source for every arch: {pins}"


# --- engine/build.sh ----------------------------------------------------------------------------


def build_sh(*args: str, script: Path = BUILD_SH) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script), *args], cwd=REPO, capture_output=True, text=True, timeout=30
    )


def engine_copy(tmp_path: Path, **edits: str) -> Path:
    """engine/ copied to tmp_path with every pin well-formed, then `edits` (regex: replacement)
    applied to each Containerfile. Returns the copied build.sh."""
    dest = tmp_path / "engine"
    shutil.copytree(ENGINE, dest)
    for cf_path in dest.glob("sm*/Containerfile"):
        text = re.sub(r"ARG LLAMA_CPP_SHA256=.*", "ARG LLAMA_CPP_SHA256=" + "ab" * 32,
                      cf_path.read_text())  # fmt: skip
        text = re.sub(r"@sha256:PLACEHOLDER\S*", "@sha256:" + "cd" * 32, text)
        for pattern, replacement in edits.items():
            text = re.sub(pattern, replacement, text)
        cf_path.write_text(text)
    return dest / "build.sh"


def test_scripts_parse() -> None:
    for script in (BUILD_SH, ENGINE / "cpu" / "build.sh"):
        subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck() -> None:
    subprocess.run(["shellcheck", str(BUILD_SH)], check=True)
    # engine/cpu/build.sh: warnings and errors only (its info notes are deliberate)
    subprocess.run(["shellcheck", "-S", "warning", str(ENGINE / "cpu" / "build.sh")], check=True)


@pytest.mark.parametrize("arch", ARCHES)
def test_the_repository_pins_pass_the_check(arch: str) -> None:
    pinned = [line for line in (ENGINE / arch / "Containerfile").read_text().splitlines()
              if line.startswith(("ARG ", "FROM "))]  # fmt: skip
    assert not any("PLACEHOLDER" in line for line in pinned), "no pin is left unfilled"
    result = build_sh("--check", arch)
    assert result.returncode == 0, result.stderr
    assert f"{arch}: pins ok" in result.stdout


@pytest.mark.parametrize("arch", ARCHES)
def test_check_accepts_well_formed_pins(tmp_path: Path, arch: str) -> None:
    result = build_sh("--check", arch, script=engine_copy(tmp_path))
    assert result.returncode == 0, result.stderr
    assert f"{arch}: pins ok" in result.stdout


@pytest.mark.parametrize(
    ("edits", "says"),
    [
        ({r"ARG LLAMA_CPP_SHA256=.*": "ARG LLAMA_CPP_SHA256=PLACEHOLDER"}, "is a placeholder"),
        ({r"ARG LLAMA_CPP_SHA256=.*": "ARG LLAMA_CPP_SHA256=ABC"}, "not 64 lowercase hex"),
        ({r"ARG LLAMA_CPP_URL=.*": "ARG LLAMA_CPP_URL=https://github.com/ggml-org/llama.cpp/"
          "archive/master.tar.gz"}, "neither a PyPI sdist file nor a GitHub archive"),
        ({r"ARG LLAMA_CPP_URL=.*": "ARG LLAMA_CPP_URL=http://example.org/x.tar.gz"},
         "neither a PyPI sdist file"),
        ({r"ARG LLAMA_CPP_TREE=.*": "ARG LLAMA_CPP_TREE=../etc"}, "not a clean path"),
        ({r"@sha256:[0-9a-f]{64} AS build": "@sha256:PLACEHOLDER AS build"}, "is a placeholder"),
        ({r"(-ubuntu22\.04)@sha256:[0-9a-f]{64} AS build": r"\1 AS build"}, "not pinned by digest"),
        ({r"FROM \S+ AS build": "FROM nvidia/cuda:latest AS build"}, "not pinned by digest"),
        ({r"ARCHITECTURES=(\d+)": r"ARCHITECTURES=\1;70"}, "must be exactly"),
    ],
    ids=["sha-placeholder", "sha-form", "url-branch", "url-elsewhere", "tree-escape",
         "from-placeholder", "from-tag", "from-latest", "two-archs"],
)
def test_check_refuses_bad_pins(tmp_path: Path, edits: dict[str, str], says: str) -> None:
    result = build_sh("--check", "sm60", script=engine_copy(tmp_path, **edits))
    assert result.returncode == 1
    assert says in result.stderr and "sm60: refused" in result.stderr


def test_build_refuses_placeholders_before_any_download(tmp_path: Path) -> None:
    placeholder = {r"ARG LLAMA_CPP_SHA256=.*": "ARG LLAMA_CPP_SHA256=PLACEHOLDER"}
    script = engine_copy(tmp_path, **placeholder)
    result = build_sh("sm60", "--release", "engine-v0.2.0", script=script)
    assert result.returncode == 1
    assert "refused" in result.stderr and "downloading" not in result.stdout


def test_usage_and_unknown_arch() -> None:
    assert build_sh().returncode == 2
    assert build_sh("--check").returncode == 2
    unknown = build_sh("--check", "sm70")
    assert unknown.returncode == 1 and "no engine/sm70/Containerfile" in unknown.stderr
    assert build_sh("--check", "../cpu").returncode == 1


def test_push_needs_a_release_and_a_plain_name(tmp_path: Path) -> None:
    script = engine_copy(tmp_path)
    no_release = build_sh("sm60", "--push", "ghcr.io/org/tensorless-engine", script=script)
    assert no_release.returncode == 1 and "--push needs --release" in no_release.stderr
    tagged = build_sh("sm60", "--release", "engine-v0.2.0", "--push", "ghcr.io/org/e:1",
                      script=script)  # fmt: skip
    assert tagged.returncode == 1 and "is not a REGISTRY/NAME" in tagged.stderr
    bad_release = build_sh("sm60", "--release", "v0.2", script=script)
    assert bad_release.returncode == 1 and "is not engine-vX.Y.Z" in bad_release.stderr


def test_digest_line_is_what_a_recipe_pins() -> None:
    digest = "sha256:" + "35" * 32
    result = build_sh("--digest-line", "ghcr.io/iammrduncan/tensorless-engine", digest)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f'image   = "ghcr.io/iammrduncan/tensorless-engine@{digest}"\n'
    # the same form the catalog's recipes carry
    recipe = (REPO / "recipes/iamMrDuncan/Qwen3.8-27B-PN3-GGUF/p100.toml").read_text()
    assert re.search(r'^image\s+= "[a-z0-9./-]+@sha256:[0-9a-f]{64}"$', recipe, re.M)
    for name, dig in [("ghcr.io/org/e:tag", digest), ("ghcr.io/org/e", "sha256:35"),
                      ("ghcr.io/org/e", "35" * 32), ("Ghcr.io/Org/E", digest)]:  # fmt: skip
        assert build_sh("--digest-line", name, dig).returncode == 1, (name, dig)
