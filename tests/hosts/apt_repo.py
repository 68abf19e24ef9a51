#!/usr/bin/env python3
"""A local, signed apt repository of the NVIDIA Container Toolkit for the test hosts, laid out as
NVIDIA publishes it (https://nvidia.github.io/libnvidia-container: ``gpgkey``, and the flat
repository ``stable/deb/$(ARCH)/`` with ``Packages``, ``Release``, ``InRelease``,
``Release.gpg`` and the ``.deb`` files), served over HTTP on the host set's gateway.

    python tests/hosts/apt_repo.py --out DIR [--serve ADDR:PORT]

The packages carry the real names, versions, dependencies and file layout as far as the stand-in
goes: ``nvidia-container-toolkit-base`` ships ``/usr/bin/nvidia-ctk`` and
``/usr/bin/nvidia-cdi-hook`` (the stand-ins of profiles/_standin: the only stand-ins, since the
real ones need a GPU) and, from 1.18 on, the ``nvidia-cdi-refresh.path``/``.service`` units with
a postinst that enables them, as the real package does; ``nvidia-container-toolkit``,
``libnvidia-container-tools`` and ``libnvidia-container1`` hold only their dependencies and a
README (their real binaries would need a GPU too). Built with ``dpkg-deb --build``, indexed
here (Packages with sizes and hashes, Release), signed with a throwaway ed25519 key by ``gpg``.

Beside it, signed by the same key, a flat repository of the stand-in driver's packages
(``nvidia-driver/deb/$(ARCH)/``): Debian's ``nvidia-driver`` and ``libcuda1`` at real releases of
the 535, 580 and 590 branches and Ubuntu's ``nvidia-driver-590``, holding only a README (the
stand-in driver's files come from the host profiles), so that the driver is a package apt and
dpkg know, for prepare's driver.lock to hold.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "profiles" / "_standin"
ARCH = "amd64"
TOOLKIT_VERSIONS = ("1.17.8-1", "1.18.0-1")
REFRESH_UNITS_FROM = (1, 18)  # the toolkit ships nvidia-cdi-refresh.{path,service} from 1.18
CTK_COMMIT = "f202b80a9b9d0db00d9b1d73c0128c8962c55f4d"  # stand-in commit id (gen_profiles.py)
KEY_UID = "tensorless test toolkit repository <toolkit-repo@tensorless.invalid>"
MAINTAINER = "tensorless-deploy tests (stand-in of NVIDIA's package) <tests@tensorless.invalid>"
BASE_PATH = "libnvidia-container"  # the repository's path under the server, as on NVIDIA's
# The stand-in driver's packages (a flat repository beside the toolkit's, signed by the same key):
# Debian's names (nvidia-driver, libcuda1) at real releases of three branches, and one of
# Ubuntu's per-branch names, so that apt has another branch to move to (prepare's driver.lock).
DRIVER_PATH = "nvidia-driver"
DRIVER_VERSIONS = ("535.183.01-1", "535.216.03-1", "580.159.04-1", "590.44.01-1")
DRIVER_BRANCH_PACKAGES = ("nvidia-driver-590",)  # Ubuntu's name for the 590 branch's metapackage

# Modelled on the units toolkit 1.18 installs: regenerate /var/run/cdi/nvidia.yaml at boot and
# whenever depmod rewrites modules.dep (a driver installed or removed), only where an NVIDIA
# kernel module is installed.
REFRESH_SERVICE = """\
[Unit]
Description=Refresh the NVIDIA CDI specification (stand-in of toolkit 1.18's unit)
ConditionPathExists=|/usr/bin/nvidia-smi
ConditionPathExists=|/usr/sbin/nvidia-smi
ConditionPathExists=/usr/bin/nvidia-ctk
After=multi-user.target

[Service]
Type=oneshot
Environment=NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/var/run/cdi/nvidia.yaml
EnvironmentFile=-/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env
ExecCondition=/usr/bin/grep -qE '/(nvidia|nvidia-current)\\\\.ko' /lib/modules/%v/modules.dep
ExecStart=/usr/bin/nvidia-ctk cdi generate
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
"""
REFRESH_PATH = """\
[Unit]
Description=Refresh the NVIDIA CDI specification on driver changes (stand-in of toolkit 1.18's)

[Path]
PathChanged=/lib/modules/%v/modules.dep
PathChanged=/lib/modules/%v/modules.dep.bin

[Install]
WantedBy=multi-user.target
"""
REFRESH_ENV = """\
# Environment for `nvidia-ctk cdi generate` as nvidia-cdi-refresh.service runs it, e.g.
# NVIDIA_CTK_CDI_OUTPUT_FILE_PATH=/var/run/cdi/nvidia.yaml
"""
POSTINST = """\
#!/bin/sh
# enable the CDI refresh units on install and upgrade where systemd runs (as the real package)
set -e
if [ "$1" = configure ] && command -v systemctl >/dev/null 2>&1; then
  case "$(systemctl is-system-running 2>/dev/null || true)" in
    running|degraded)
      systemctl daemon-reload || echo "Warning: systemctl daemon-reload failed" >&2
      systemctl enable --now nvidia-cdi-refresh.path || echo "Warning: nvidia-cdi-refresh.path" >&2
      systemctl enable --now nvidia-cdi-refresh.service || echo "Warning: nvidia-cdi-refresh" >&2
      ;;
  esac
fi
exit 0
"""
PRERM = """\
#!/bin/sh
set -e
if [ "$1" = remove ] && command -v systemctl >/dev/null 2>&1; then
  systemctl disable --now nvidia-cdi-refresh.path nvidia-cdi-refresh.service >/dev/null 2>&1 || true
fi
exit 0
"""


def _vt(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("-")[0].split(".") if p.isdigit())


def _readme(name: str) -> str:
    return (
        f"{name}: a stand-in package of tensorless-deploy's test repository. The real package's\n"
        "binaries need an NVIDIA GPU; this one carries only the real name, version and\n"
        "dependencies.\n"
    )


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    depends: str = ""
    description: str = ""
    files: dict[str, tuple[str, int]] = field(default_factory=dict)  # path -> (text, mode)
    scripts: dict[str, str] = field(default_factory=dict)  # postinst, prerm
    conffiles: tuple[str, ...] = ()


def toolkit_packages(version: str) -> list[Package]:
    """The toolkit's four packages at one version, as NVIDIA's repository has them."""
    upstream = version.split("-")[0]
    ctk = (STANDIN / "nvidia-ctk").read_text()
    hook = (STANDIN / "nvidia-cdi-hook").read_text()
    base_files = {
        "usr/bin/nvidia-ctk": (ctk, 0o755),
        "usr/bin/nvidia-cdi-hook": (hook, 0o755),
        "usr/share/nvidia-standin/ctk/version.out": (
            f"NVIDIA Container Toolkit CLI version {upstream}\ncommit: {CTK_COMMIT}\n",
            0o644,
        ),
    }
    scripts: dict[str, str] = {}
    conffiles: tuple[str, ...] = ()
    if _vt(version) >= REFRESH_UNITS_FROM:
        base_files |= {
            "usr/lib/systemd/system/nvidia-cdi-refresh.service": (REFRESH_SERVICE, 0o644),
            "usr/lib/systemd/system/nvidia-cdi-refresh.path": (REFRESH_PATH, 0o644),
            "etc/nvidia-container-toolkit/nvidia-cdi-refresh.env": (REFRESH_ENV, 0o644),
        }
        scripts = {"postinst": POSTINST, "prerm": PRERM}
        conffiles = ("/etc/nvidia-container-toolkit/nvidia-cdi-refresh.env",)
    doc = "usr/share/doc/{}/README.tensorless-standin"
    return [
        Package(
            "libnvidia-container1",
            version,
            description="NVIDIA container runtime library (stand-in)",
            files={doc.format("libnvidia-container1"): (_readme("libnvidia-container1"), 0o644)},
        ),
        Package(
            "libnvidia-container-tools",
            version,
            depends=f"libnvidia-container1 (>= {version})",
            description="NVIDIA container runtime library, tools (stand-in)",
            files={
                doc.format("libnvidia-container-tools"): (
                    _readme("libnvidia-container-tools"),
                    0o644,
                )
            },
        ),
        Package(
            "nvidia-container-toolkit-base",
            version,
            description="NVIDIA Container Toolkit Base: nvidia-ctk, nvidia-cdi-hook (stand-ins)",
            files=base_files,
            scripts=scripts,
            conffiles=conffiles,
        ),
        Package(
            "nvidia-container-toolkit",
            version,
            depends=(
                f"nvidia-container-toolkit-base (= {version}), libnvidia-container-tools "
                f"(>= {version}), libnvidia-container-tools (<< 2.0.0)"
            ),
            description="NVIDIA Container toolkit (stand-in)",
            files={
                doc.format("nvidia-container-toolkit"): (
                    _readme("nvidia-container-toolkit"),
                    0o644,
                )
            },
        ),
    ]


def driver_packages(version: str) -> list[Package]:
    """The driver's two packages at one version (Debian's names): the stand-in driver's files
    come from the host profiles, so these hold only a README; what matters is that dpkg and apt
    know them, at real version numbers, for holds and pins."""
    doc = "usr/share/doc/{}/README.tensorless-standin"
    return [
        Package(
            "libcuda1",
            version,
            description="NVIDIA CUDA Driver Library (stand-in)",
            files={doc.format("libcuda1"): (_readme("libcuda1"), 0o644)},
        ),
        Package(
            "nvidia-driver",
            version,
            depends=f"libcuda1 (= {version})",
            description="NVIDIA metapackage (stand-in)",
            files={doc.format("nvidia-driver"): (_readme("nvidia-driver"), 0o644)},
        ),
    ]


def branch_package(name: str) -> Package:
    """Ubuntu's per-branch metapackage (nvidia-driver-590): another branch by name."""
    branch = name.rsplit("-", 1)[1]
    version = next(v for v in DRIVER_VERSIONS if v.startswith(f"{branch}."))
    return Package(
        name,
        version.replace("-1", "-0ubuntu1"),
        description=f"NVIDIA driver metapackage, branch {branch} (stand-in)",
        files={f"usr/share/doc/{name}/README.tensorless-standin": (_readme(name), 0o644)},
    )


def build_deb(pkg: Package, out: Path) -> Path:
    """``dpkg-deb --build`` of one package (root-owned files) into out/NAME_VERSION_ARCH.deb."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        control_dir = root / "DEBIAN"
        control_dir.mkdir(parents=True)
        for rel, (text, mode) in pkg.files.items():
            f = root / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
            f.chmod(mode)
        size_kib = max(1, sum(len(t) for t, _ in pkg.files.values()) // 1024)
        lines = [
            f"Package: {pkg.name}",
            f"Version: {pkg.version}",
            f"Architecture: {ARCH}",
            f"Maintainer: {MAINTAINER}",
            f"Installed-Size: {size_kib}",
            "Section: utils",
            "Priority: optional",
            "Homepage: https://github.com/NVIDIA/nvidia-container-toolkit",
        ]
        if pkg.depends:
            lines.append(f"Depends: {pkg.depends}")
        lines.append(f"Description: {pkg.description}")
        lines.append(" Built by tensorless-deploy's tests/hosts/apt_repo.py for its test hosts.")
        (control_dir / "control").write_text("\n".join(lines) + "\n")
        for name, text in pkg.scripts.items():
            (control_dir / name).write_text(text)
            (control_dir / name).chmod(0o755)
        if pkg.conffiles:
            (control_dir / "conffiles").write_text("".join(f"{c}\n" for c in pkg.conffiles))
        deb = out / f"{pkg.name}_{pkg.version}_{ARCH}.deb"
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)],
            check=True,
            capture_output=True,
        )
    return deb


def _hashes(data: bytes) -> dict[str, str]:
    return {
        "MD5sum": hashlib.md5(data).hexdigest(),
        "SHA1": hashlib.sha1(data).hexdigest(),
        "SHA256": hashlib.sha256(data).hexdigest(),
    }


def packages_index(debs: list[Path]) -> str:
    """The Packages index of a flat repository: each .deb's control fields, then where it is
    (relative to the repository) with its size and hashes."""
    stanzas = []
    for deb in sorted(debs):
        control = subprocess.run(
            ["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True
        ).stdout.rstrip("\n")
        data = deb.read_bytes()
        extra = [f"Filename: ./{deb.name}", f"Size: {len(data)}"]
        extra += [f"{k}: {v}" for k, v in _hashes(data).items()]
        stanzas.append(control + "\n" + "\n".join(extra) + "\n")
    return "\n".join(stanzas)


def release_file(repo: Path, files: list[str]) -> str:
    date = time.strftime("%a, %d %b %Y %H:%M:%S UTC", time.gmtime())
    out = [
        "Origin: tensorless test repository (layout of nvidia.github.io/libnvidia-container)",
        "Label: nvidia-container-toolkit",
        f"Date: {date}",
        f"Architectures: {ARCH}",
    ]
    for field_name, algo in (("MD5Sum", "md5"), ("SHA1", "sha1"), ("SHA256", "sha256")):
        out.append(f"{field_name}:")
        for name in files:
            data = (repo / name).read_bytes()
            out.append(f" {hashlib.new(algo, data).hexdigest()} {len(data)} {name}")
    return "\n".join(out) + "\n"


def _gpg(home: Path, *args: str, stdin: bytes | None = None) -> bytes:
    proc = subprocess.run(
        ["gpg", "--homedir", str(home), "--batch", "--quiet", "--pinentry-mode", "loopback",
         "--passphrase", "", *args],
        input=stdin,
        capture_output=True,
        check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"gpg {' '.join(args)}: {proc.stderr.decode(errors='replace')}")
    return proc.stdout


@dataclass(frozen=True)
class ToolkitRepo:
    """A built repository: serve ``root``; its base is ``root/BASE_PATH``; the driver's flat
    repository, signed by the same key (``gpgkey``), is at ``root/DRIVER_PATH/deb/ARCH``."""

    root: Path
    versions: tuple[str, ...]
    fingerprint: str

    @property
    def base(self) -> Path:
        return self.root / BASE_PATH


def _index(repo: Path, debs: list[Path]) -> None:
    index = packages_index(debs).encode()
    (repo / "Packages").write_bytes(index)
    (repo / "Packages.gz").write_bytes(gzip.compress(index, mtime=0))
    (repo / "Release").write_text(release_file(repo, ["Packages", "Packages.gz"]))


def build_repo(root: Path, versions: tuple[str, ...] = TOOLKIT_VERSIONS) -> ToolkitRepo:
    """Build the repositories under root: BASE_PATH/gpgkey and BASE_PATH/stable/deb/ARCH/ (the
    toolkit), DRIVER_PATH/deb/ARCH/ (the stand-in driver's packages)."""
    for tool in ("dpkg-deb", "gpg"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"apt_repo: {tool} is needed (apt-get install dpkg gnupg)")
    base = root / BASE_PATH
    repo = base / "stable" / "deb" / ARCH
    repo.mkdir(parents=True, exist_ok=True)
    _index(repo, [build_deb(p, repo) for v in versions for p in toolkit_packages(v)])
    driver = root / DRIVER_PATH / "deb" / ARCH
    driver.mkdir(parents=True, exist_ok=True)
    pkgs = [p for v in DRIVER_VERSIONS for p in driver_packages(v)]
    pkgs += [branch_package(n) for n in DRIVER_BRANCH_PACKAGES]
    _index(driver, [build_deb(p, driver) for p in pkgs])
    home = Path(tempfile.mkdtemp(prefix="tl-apt-gpg-"))
    try:
        home.chmod(0o700)
        _gpg(home, "--quick-gen-key", KEY_UID, "ed25519", "sign", "never")
        listing = _gpg(home, "--with-colons", "--list-keys").decode()
        fpr = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr"))
        (base / "gpgkey").write_bytes(_gpg(home, "--armor", "--export", fpr))
        for flat in (repo, driver):
            release = flat / "Release"
            for args in (
                ["--digest-algo", "SHA512", "--clearsign", "-o", str(flat / "InRelease")],
                [
                    "--digest-algo",
                    "SHA512",
                    "--detach-sign",
                    "--armor",
                    "-o",
                    str(flat / "Release.gpg"),
                ],
            ):
                _gpg(home, "--yes", "--local-user", fpr, *args, str(release))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return ToolkitRepo(root, versions, fpr)


class _Handler(http.server.SimpleHTTPRequestHandler):
    server: RepoServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.server.requests.append((self.command, self.path, int(code) if code != "-" else 0))


class RepoServer(http.server.ThreadingHTTPServer):
    """Plain HTTP on (address, port) serving a ToolkitRepo's root; ``requests`` records
    (method, path, status) of every request, ``url`` is the repository's base URL."""

    daemon_threads = True

    def __init__(self, repo: ToolkitRepo, address: str, port: int = 0) -> None:
        self.repo = repo
        self.requests: list[tuple[str, str, int]] = []
        root = str(repo.root)

        class Handler(_Handler):
            def __init__(self, *a: Any, **kw: Any) -> None:
                super().__init__(*a, directory=root, **kw)

        super().__init__((address, port), Handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/{BASE_PATH}"

    @property
    def driver_url(self) -> str:
        """The driver's flat repository: ``deb [signed-by=KEY] URL ./``."""
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/{DRIVER_PATH}/deb/{ARCH}"

    def start(self) -> RepoServer:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def fetched(self, suffix: str) -> list[tuple[str, str, int]]:
        return [r for r in self.requests if r[1].endswith(suffix)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--serve", metavar="ADDR:PORT", help="serve it until interrupted")
    a = ap.parse_args(argv)
    repo = build_repo(a.out)
    print(f"built {repo.base} (key {repo.fingerprint}, versions {', '.join(repo.versions)})")
    if a.serve:
        addr, _, port = a.serve.rpartition(":")
        srv = RepoServer(repo, addr, int(port))
        print(f"serving {srv.url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            srv.serve_forever()
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
