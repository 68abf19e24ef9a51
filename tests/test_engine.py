"""Engine image build definitions (engine/): the pins, the Debian locks, the compile flags, the
image assembler and the contract inspector, and the pure parts of engine/build.sh (pin refusal,
digest line). Nothing here compiles, debootstraps or downloads; the image built by engine/build.sh
and its figures are recorded in engine/README.md."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import shutil
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ENGINE = REPO / "engine"
BUILD_SH = ENGINE / "build.sh"
ARCH_ENVS = sorted(ENGINE.glob("sm*/engine.env"))
ARCHES = [p.parent.name for p in ARCH_ENVS]
SCRIPTS = [BUILD_SH, ENGINE / "inspect.sh", ENGINE / "repro.sh", ENGINE / "lib/rootfs.sh",
           ENGINE / "lib/compile.sh"]  # fmt: skip
LOCKS = {role: ENGINE / "debian" / f"{role}.lock" for role in ("build", "runtime")}
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
LOCK_LINE = re.compile(r"([a-z0-9][a-z0-9+.-]+) ([A-Za-z0-9.+~:-]+) (amd64|all) ([0-9a-f]{64})")
EPOCH = 1795252544


def env_file(path: Path) -> dict[str, str]:
    """KEY=value lines of a shell env file (comments dropped, one level of quotes removed)."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = value.strip('"')
    return out


def lock(role: str) -> dict[str, tuple[str, str, str]]:
    """package -> (version, arch, sha256) of engine/debian/ROLE.lock."""
    entries = {}
    for line in LOCKS[role].read_text().splitlines():
        if line.startswith("#") or not line:
            continue
        m = LOCK_LINE.fullmatch(line)
        assert m, f"{role}.lock: malformed line {line!r}"
        assert m[1] not in entries, f"{role}.lock: {m[1]} twice"
        entries[m[1]] = (m[2], m[3], m[4])
    return entries


SUITE = env_file(ENGINE / "debian/suite.env")
SOURCE = env_file(ENGINE / "source.env")


# --- one build path ------------------------------------------------------------------------------


def test_every_gpu_family_has_an_engine_env() -> None:
    assert ARCHES == ["sm60", "sm90"]
    for path in ARCH_ENVS:
        assert env_file(path) == {"CUDA_ARCHITECTURES": path.parent.name[2:]}, path


def test_one_build_path_the_registry_containerfiles_are_gone() -> None:
    # engine/build.sh (Debian packages, pinned) replaced the nvidia/cuda Containerfiles, whose
    # bases could never be pulled from here: one build path per architecture
    assert not list(ENGINE.glob("sm*/Containerfile"))
    assert not list(ENGINE.glob("**/Dockerfile"))


def test_source_pins_are_the_verified_sdist() -> None:
    url = SOURCE["LLAMA_CPP_URL"]
    assert url.startswith("https://files.pythonhosted.org/packages/")
    assert url.endswith("/llama_cpp_python-0.3.36.tar.gz")
    # the sdist's sha256 as PyPI records it and as a download of it hashed here
    assert SOURCE["LLAMA_CPP_SHA256"] == SDIST_SHA256
    assert SOURCE["LLAMA_CPP_TREE"] == "llama_cpp_python-0.3.36/vendor/llama.cpp"


# --- the Debian locks ----------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["build", "runtime"])
def test_locks_pin_every_package_by_version_and_sha256(role: str) -> None:
    entries = lock(role)
    assert len(entries) > 50, "the whole installed set, minbase included"
    lines = [ln for ln in LOCKS[role].read_text().splitlines() if ln and not ln.startswith("#")]
    assert lines == sorted(lines), f"{role}.lock is sorted (stable diffs when it is refreshed)"
    assert "PLACEHOLDER" not in LOCKS[role].read_text()
    top = SUITE["BUILD_PACKAGES" if role == "build" else "RUNTIME_PACKAGES"].split()
    missing = [p for p in top if p not in entries]
    assert not missing, f"{role}.lock lacks its own top-level packages {missing}"
    header = LOCKS[role].read_text()
    assert re.search(r"^#   \S+ .* UTC sha256 [0-9a-f]{64}$", header, re.M), "InRelease recorded"


def test_suite_and_epoch() -> None:
    assert SUITE["SUITE"] == "trixie"
    assert SUITE["COMPONENTS"].split(",") == ["main", "contrib", "non-free"]
    assert int(SUITE["SOURCE_DATE_EPOCH"]) == EPOCH
    # the epoch is the Date of the InRelease the locks were written from
    header = LOCKS["runtime"].read_text()
    assert "Sat, 21 Nov 2026 09:15:44 UTC" in header


def cuda_release(version: str) -> str:
    """Debian's CUDA package version 12.4.127~12.4.1-2 -> the CUDA release 12.4.1."""
    return version.split("~", 1)[1].rsplit("-", 1)[0]


def test_cuda_is_12x_one_release_for_compiler_and_runtime() -> None:
    build, runtime = lock("build"), lock("runtime")
    nvcc = cuda_release(build["nvidia-cuda-toolkit"][0])
    assert nvcc.startswith("12."), "CUDA 13 cannot target compute capability < 7.5 (sm60)"
    for pkg in ("libcudart12", "libcublas12", "libcublaslt12"):
        assert cuda_release(runtime[pkg][0]) == nvcc, f"{pkg} from the same CUDA release as nvcc"
    assert nvcc == "12.4.1"


def test_runtime_holds_what_the_build_linked_against() -> None:
    # the binary is compiled against the build tree's libraries and runs with the runtime's:
    # every package in both must be the very same .deb
    build, runtime = lock("build"), lock("runtime")
    shared = sorted(set(build) & set(runtime))
    assert {"libc6", "libstdc++6", "libgomp1", "libcudart12", "libcublas12"} <= set(shared)
    different = [p for p in shared if build[p] != runtime[p]]
    assert not different, f"different versions in the build and runtime trees: {different}"


def test_runtime_lock_has_no_toolchain() -> None:
    runtime = lock("runtime")
    banned = re.compile(
        r"(gcc|g\+\+|cpp)(-\d+)?|binutils.*|cmake.*|make|nvidia-cuda-(toolkit|dev)|libcuda1|"
        r"nvidia-.*|.*-dev|libnvvm\d*|libnvrtc.*|libcufft.*|libcusparse.*|libcusolver.*|libnpp.*"
    )
    found = [p for p in runtime if banned.fullmatch(p)]
    assert not found, f"the runtime image must not carry {found}"
    assert "curl" in runtime, "the units' health check runs curl inside the container"


# --- the compile ---------------------------------------------------------------------------------


def compile_sh() -> str:
    return (ENGINE / "lib/compile.sh").read_text()


def test_compile_one_architecture_machine_code_only() -> None:
    text = compile_sh()
    assert re.findall(r"-DCMAKE_CUDA_ARCHITECTURES=(\S+)", text) == ['"$ARCH-real"'], (
        "SASS for exactly the family, no PTX a driver could JIT for another card"
    )
    for flag in ("-DGGML_CUDA=ON", "-DGGML_NATIVE=OFF", "-DLLAMA_BUILD_SERVER=ON",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DGGML_CUDA_NCCL=OFF",
                 "-DCMAKE_CUDA_HOST_COMPILER=g++-13",
                 # the backends are modules, so llama-server starts without the driver's libcuda
                 "-DGGML_BACKEND_DL=ON", "-DGGML_BACKEND_DIR=/usr/lib/llama-server"):  # fmt: skip
        assert flag in text, flag
    assert "--target llama-server" in text
    # nvcc's tmpxft_<pid> file names in the symbol table made two builds differ (engine/repro.sh)
    assert "-exec strip --strip-unneeded {} +" in text


def test_nothing_is_fetched_inside_the_build() -> None:
    text = compile_sh()
    for off in ("LLAMA_BUILD_WEBUI=OFF", "LLAMA_BUILD_BORINGSSL=OFF", "LLAMA_BUILD_LIBRESSL=OFF",
                "FETCHCONTENT_FULLY_DISCONNECTED=ON", "LLAMA_CURL=OFF"):  # fmt: skip
        assert f"-D{off}" in text, f"-D{off} (no download at configure or build time)"
    for tool in ("curl", "wget", "git clone", "pip "):
        assert tool not in text.split("set -euo pipefail", 1)[1], tool
    # the compile runs chrooted with no network: in_root unshares --net unless asked not to
    build = BUILD_SH.read_text()
    assert "local root=$1 net=--net" in build
    compile_call = next(
        ln for ln in build.splitlines() if '"$WORK/build-root" /src/compile.sh' in ln
    )
    assert "--net" not in compile_call


def test_source_archive_is_checked_before_it_is_unpacked() -> None:
    text = compile_sh()
    assert 'echo "$SHA  /src/llama.cpp.tar.gz" | sha256sum -c' in text
    assert text.index("sha256sum -c") < text.index("tar -xzf")
    build = BUILD_SH.read_text()
    assert build.index("sha256sum -c") < build.index("step builder-rootfs")


def test_build_labels_and_contract() -> None:
    build = BUILD_SH.read_text()
    for label in ("org.opencontainers.image.revision=sha256:$sha",
                  "org.opencontainers.image.source=$url",
                  "org.opencontainers.image.version=$release",
                  "io.tensorless.engine.arch=$arch",
                  "io.tensorless.engine.cuda-architectures=$cc"):  # fmt: skip
        assert f'--label "{label}"' in build, label
    assert "echo /usr/lib/llama-server >" in build, "the libraries found through ld.so.conf.d"
    assert "grep -v 'libcuda\\.so\\.1'" in build, "only libcuda.so.1 may be unresolved"
    assert "find usr/lib/llama-server -name '*.so*'" in build, "ldd of every backend module too"


# --- the image assembler (engine/lib/oci.py) -----------------------------------------------------


def oci(tree: Path, out: Path, *labels: str) -> dict[str, str]:
    args = [sys.executable, str(ENGINE / "lib/oci.py"), str(tree), str(out)]
    args += ["--tag", "t", "--epoch", str(EPOCH)]
    args += [a for label in labels for a in ("--label", label)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True)
    return dict(word.split("=", 1) for word in result.stdout.split())


def blob(layout: Path, digest: str) -> bytes:
    return (layout / "blobs/sha256" / digest.split(":")[1]).read_bytes()


def fatbin(*entries: tuple[int, int]) -> bytes:
    """A fatbin as nvcc lays it out: header, then (kind, sm) entries of 64-byte header + payload."""
    body = b""
    for kind, sm in entries:
        head = struct.pack("<HHIQIIHHI", kind, 0x101, 64, 16, 0, 0, 0, 8, sm).ljust(64, b"\0")
        body += head + b"x" * 16
    return b"\x7fELF-junk" + struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body + b"tail"


def fake_engine(root: Path, *, ggml_cuda: bytes | None = None) -> Path:
    """A tiny tree shaped like an engine image (no real binaries): enough for oci.py and inspect."""
    lib = "usr/lib/x86_64-linux-gnu/"
    for rel, data in [
        ("usr/bin/llama-server", b"#!/bin/sh\n"),
        ("usr/bin/curl", b"#!/bin/sh\n"),
        (lib + "libcudart.so.12", b""),
        (lib + "libcublas.so.12", b""),
        (lib + "libcublasLt.so.12.4.5.8", fatbin((2, 60), (2, 90))),
        ("usr/lib/llama-server/libggml-cuda.so", ggml_cuda or fatbin((2, 60))),
    ]:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o755)
    (root / lib / "libcublasLt.so.12").symlink_to("libcublasLt.so.12.4.5.8")
    for tool in ("dash", "sha256sum", "stat", "head", "tee", "cut", "mv", "ln"):
        (root / "usr/bin" / tool).write_bytes(b"")
        (root / "usr/bin" / tool).chmod(0o755)
    (root / "usr/bin/sh").symlink_to("dash")
    (root / "etc").mkdir()
    (root / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    return root


SM60_LABELS = ("io.tensorless.engine.arch=sm60", "io.tensorless.engine.cuda-architectures=60",
               "org.opencontainers.image.revision=sha256:" + SDIST_SHA256,
               "org.opencontainers.image.version=unreleased")  # fmt: skip


def test_oci_layout_is_the_contract_and_reproducible(tmp_path: Path) -> None:
    tree = fake_engine(tmp_path / "root")
    first = oci(tree, tmp_path / "a", *SM60_LABELS)
    # the same tree, copied (new inodes and mtimes), gives the same bytes
    copy = tmp_path / "copy"
    shutil.copytree(tree, copy, symlinks=True)
    (copy / "etc/passwd").touch()
    assert oci(copy, tmp_path / "b", *SM60_LABELS) == first
    layout = tmp_path / "a"
    manifest = json.loads(blob(layout, first["manifest"]))
    manifest_sha = hashlib.sha256(blob(layout, first["manifest"])).hexdigest()
    assert first["manifest"] == "sha256:" + manifest_sha
    assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    config = json.loads(blob(layout, manifest["config"]["digest"]))
    c = config["config"]
    assert c["User"] == "10001:10001" and c["Entrypoint"] == ["/usr/bin/llama-server"]
    assert "Cmd" not in c and c["ExposedPorts"] == {"8080/tcp": {}}
    assert c["Labels"]["io.tensorless.engine.arch"] == "sm60"
    assert config["created"] == "2026-11-21T09:15:44Z"
    index = json.loads((layout / "index.json").read_text())
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == "t"
    # the layer: sorted names, every mtime the epoch, numeric owners only, gzip without a date
    layer = blob(layout, manifest["layers"][0]["digest"])
    assert layer[4:8] == b"\0\0\0\0", "gzip mtime 0"
    plain = gzip.decompress(layer)
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(plain).hexdigest()]
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) and "usr/bin/llama-server" in names
    assert {m.mtime for m in members} == {EPOCH}
    assert {(m.uname, m.gname) for m in members} == {("", "")}
    link = next(m for m in members if m.name.endswith("libcublasLt.so.12"))
    assert link.issym() and link.linkname == "libcublasLt.so.12.4.5.8"


# --- fatbin headers (engine/lib/fatbin.py) -------------------------------------------------------


def fatbin_py(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ENGINE / "lib/fatbin.py"), str(path)],
                          capture_output=True, text=True, timeout=30)  # fmt: skip


@pytest.mark.parametrize(
    ("entries", "archs"),
    [
        ([(2, 60)], "ELF:sm_60"),
        ([(2, 60), (1, 60)], "ELF:sm_60 PTX:sm_60"),
        ([(2, 90), (2, 60), (2, 60)], "ELF:sm_60 ELF:sm_90"),
    ],
)
def test_fatbin_lists_the_device_code(tmp_path: Path, entries: list, archs: str) -> None:
    lib = tmp_path / "lib.so"
    lib.write_bytes(fatbin(*entries) + b"pad" + fatbin(*entries))
    result = fatbin_py(lib)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == f"archs: {archs}"
    lib.write_bytes(b"\x7fELF no device code")
    assert fatbin_py(lib).returncode == 1


# --- the contract inspector (engine/inspect.sh) --------------------------------------------------

needs_skopeo = pytest.mark.skipif(shutil.which("skopeo") is None, reason="skopeo is not installed")


def inspect(ref: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ENGINE / "inspect.sh"), ref, *args, "--no-ldd"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@needs_skopeo
def test_inspect_accepts_an_image_that_meets_the_contract(tmp_path: Path) -> None:
    oci(fake_engine(tmp_path / "root"), tmp_path / "img", *SM60_LABELS)
    result = inspect(f"oci:{tmp_path / 'img'}:t", "--arch", "sm60")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "libggml-cuda device code: ELF:sm_60 only" in result.stdout
    assert result.stdout.rstrip().endswith("meets the contract")


@needs_skopeo
@pytest.mark.parametrize(
    ("change", "says"),
    [("ptx", "must be exactly ELF:sm_60"), ("compiler", "holds what an engine image must not"),
     ("arch", "expected sm90"), ("nocurl", "no /usr/bin/curl"), ("size", "more than --max-mb"),
     ("notee", "no /usr/bin/tee (the exports' init step")],
)  # fmt: skip
def test_inspect_refuses_a_broken_image(tmp_path: Path, change: str, says: str) -> None:
    root = fake_engine(tmp_path / "root",
                       ggml_cuda=fatbin((2, 60), (1, 60)) if change == "ptx" else None)  # fmt: skip
    if change == "compiler":
        (root / "usr/bin/nvcc").write_bytes(b"")
    if change == "nocurl":
        (root / "usr/bin/curl").unlink()
    if change == "notee":
        (root / "usr/bin/tee").unlink()
    if change == "size":
        (root / "usr/lib/big").write_bytes(b"\0" * (3 << 20))
    oci(root, tmp_path / "img", *SM60_LABELS)
    args = {"arch": ["--arch", "sm90"], "size": ["--max-mb", "1"]}.get(change, [])
    result = inspect(f"oci:{tmp_path / 'img'}:t", *args)
    assert result.returncode == 1
    assert says in result.stderr, result.stdout + result.stderr


# --- engine/build.sh -----------------------------------------------------------------------------


def build_sh(*args: str, script: Path = BUILD_SH) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script), *args], cwd=REPO, capture_output=True, text=True, timeout=30
    )


def engine_copy(tmp_path: Path, edits: dict[str, dict[str, str]] | None = None) -> Path:
    """engine/ copied to tmp_path, then per file (relative to engine/) `regex: replacement`
    edits. Returns the copied build.sh."""
    dest = tmp_path / "engine"
    shutil.copytree(ENGINE, dest)
    for rel, subs in (edits or {}).items():
        path = dest / rel
        text = path.read_text()
        for pattern, replacement in subs.items():
            text, n = re.subn(pattern, replacement, text, flags=re.M)
            assert n, f"{rel}: {pattern!r} matched nothing"
        path.write_text(text)
    return dest / "build.sh"


def test_scripts_parse() -> None:
    for script in [*SCRIPTS, ENGINE / "cpu" / "build.sh"]:
        subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck() -> None:
    subprocess.run(["shellcheck", *map(str, SCRIPTS)], check=True)
    # engine/cpu/build.sh: warnings and errors only (its info notes are deliberate)
    subprocess.run(["shellcheck", "-S", "warning", str(ENGINE / "cpu" / "build.sh")], check=True)


@pytest.mark.parametrize("arch", ARCHES)
def test_the_repository_pins_pass_the_check(arch: str) -> None:
    result = build_sh("--check", arch)
    assert result.returncode == 0, result.stderr
    assert f"{arch}: pins ok" in result.stdout


@pytest.mark.parametrize(
    ("edits", "says"),
    [
        ({"source.env": {r"^LLAMA_CPP_SHA256=.*": "LLAMA_CPP_SHA256=PLACEHOLDER"}},
         "is a placeholder"),
        ({"source.env": {r"^LLAMA_CPP_SHA256=.*": "LLAMA_CPP_SHA256=ABC"}}, "not 64 lowercase hex"),
        ({"source.env": {r"^LLAMA_CPP_URL=.*": "LLAMA_CPP_URL=https://github.com/ggml-org/"
          "llama.cpp/archive/master.tar.gz"}}, "neither a PyPI sdist file nor a GitHub archive"),
        ({"source.env": {r"^LLAMA_CPP_URL=.*": "LLAMA_CPP_URL=http://example.org/x.tar.gz"}},
         "neither a PyPI sdist file"),
        ({"source.env": {r"^LLAMA_CPP_TREE=.*": "LLAMA_CPP_TREE=../etc"}}, "not a clean path"),
        ({"sm60/engine.env": {r"^CUDA_ARCHITECTURES=.*": "CUDA_ARCHITECTURES=60;70"}},
         "must be exactly 60"),
        ({"debian/runtime.lock": {r"^(curl \S+ amd64) [0-9a-f]{64}$": r"\1 PLACEHOLDER"}},
         "is a placeholder"),
        ({"debian/build.lock": {r"^(cmake \S+) amd64 ": r"\1 "}}, "is not 'package version arch"),
        ({"debian/suite.env": {r"^SOURCE_DATE_EPOCH=.*": "SOURCE_DATE_EPOCH=now"}},
         "is not a Unix time"),
    ],
    ids=["sha-placeholder", "sha-form", "url-branch", "url-elsewhere", "tree-escape", "two-archs",
         "lock-placeholder", "lock-form", "epoch"],
)  # fmt: skip
def test_check_refuses_bad_pins(tmp_path: Path, edits: dict, says: str) -> None:
    result = build_sh("--check", "sm60", script=engine_copy(tmp_path, edits))
    assert result.returncode == 1
    assert says in result.stderr and "sm60: refused" in result.stderr


def test_check_refuses_an_empty_lock(tmp_path: Path) -> None:
    script = engine_copy(tmp_path)
    (script.parent / "debian/runtime.lock").write_text("# nothing\n")
    result = build_sh("--check", "sm90", script=script)
    assert result.returncode == 1 and "runtime.lock pins no package" in result.stderr


def test_build_refuses_placeholders_before_any_download(tmp_path: Path) -> None:
    edits = {"source.env": {r"^LLAMA_CPP_SHA256=.*": "LLAMA_CPP_SHA256=PLACEHOLDER"}}
    script = engine_copy(tmp_path, edits)
    result = build_sh("sm60", "--release", "engine-v0.2.0", script=script)
    assert result.returncode == 1
    assert "refused" in result.stderr and "downloading" not in result.stdout


def test_usage_and_unknown_arch() -> None:
    assert build_sh().returncode == 2
    assert build_sh("--check").returncode == 2
    unknown = build_sh("--check", "sm70")
    assert unknown.returncode == 1 and "no engine/sm70/engine.env" in unknown.stderr
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


def test_rootfs_and_repro_refuse_before_doing_anything(tmp_path: Path) -> None:
    rootfs = subprocess.run(["bash", str(ENGINE / "lib/rootfs.sh"), "gpu", str(tmp_path / "r")],
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    assert rootfs.returncode == 1 and "neither build nor runtime" in rootfs.stderr
    assert not (tmp_path / "r").exists()
    repro = subprocess.run(["bash", str(ENGINE / "repro.sh"), "sm60", str(tmp_path / "none")],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    assert repro.returncode == 1 and "no finished build" in repro.stderr
    assert subprocess.run(["bash", str(ENGINE / "repro.sh")], capture_output=True).returncode == 2
