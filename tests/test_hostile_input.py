"""Hostile input end to end, as an operator or an attacker would feed it: the CLI as a
subprocess, each refusal one short line naming the culprit, no traceback, and no byte a
terminal would act on (ESC, C1, bidi controls) in anything printed, whoever supplied it."""

from __future__ import annotations

import json
import os
import pty
import re
import stat
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tensorless_deploy.cli.output import emit_json, paint, safe, table, terminal_guard
from tests.recipe_tools import example, to_toml, write_recipe

RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
HOSTILE = "x\x1b]0;pwned\x07\x1b[2J\x9b31m\u202ey\rz"
P100_UUID = "GPU-3f2c8a51-6d1e-4b7a-9c05-1e8d2f4a7b90"


def cli(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tensorless_deploy", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_DISABLE_TELEMETRY": "1", **(env or {})},
    )


def assert_clean(proc: subprocess.CompletedProcess[str], max_line: int = 400) -> list[str]:
    """No traceback, no raw control, every line short; the stderr lines."""
    for text in (proc.stdout, proc.stderr):
        assert "Traceback" not in text, text[-3000:]
        assert not RAW_CONTROL.search(text), repr(text[:500])
        assert all(len(line) <= max_line for line in text.splitlines()), [
            len(line) for line in text.splitlines()
        ]
    return proc.stderr.splitlines()


# --- recipes --------------------------------------------------------------------------------


def _raw(root: Path, repo: str, text: str) -> None:
    path = root / repo / "p100.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_pathological_recipes_are_one_line_each(tmp_path: Path) -> None:
    base = to_toml(example())
    cases: dict[str, str] = {
        "deep-arrays": base.replace('"args" = [', '"args" = ' + "[" * 500 + "]" * 500 + ", ["),
        "deep-tables": base + '\n["receipt2"]\n"x" = ' + "{a=" * 500 + "1" + "}" * 500 + "\n",
        "huge-int": base.replace('"context" = 65536', '"context" = ' + "9" * 5000),
        "big-int": base.replace('"context" = 65536', '"context" = ' + "9" * 40),
        "mb-string": base.replace(
            '"license" = "Apache-2.0 (from Qwen/Qwen3.8-27B)"',
            '"license" = "' + "A" * 1_000_000 + '\\u001b"',
        ),
        "mb-repo": base.replace('"revision" = "c701', '"revision" = "' + "r" * 1_000_000 + "c701"),
    }
    for name, text in cases.items():
        _raw(tmp_path, f"org/{name}", text)
    proc = cli("check", str(tmp_path))
    assert proc.returncode == 1
    lines = assert_clean(proc)
    by_file = {name: [line for line in lines if line.startswith(f"org/{name}/")] for name in cases}
    assert by_file["deep-arrays"] == [
        "org/deep-arrays/p100.toml: invalid TOML: arrays or inline tables nested too deep"
    ]
    assert by_file["deep-tables"] == [
        "org/deep-tables/p100.toml: invalid TOML: arrays or inline tables nested too deep"
    ]
    assert by_file["huge-int"] == [
        "org/huge-int/p100.toml: invalid TOML: an integer with too many digits to read"
    ]
    assert by_file["big-int"] == [
        "org/big-int/p100.toml: run.context: must be at most 2,147,483,647: llama-server "
        "reads it as an int (" + "9" * 40 + ")"
    ]
    (mb,) = by_file["mb-string"]
    assert mb.startswith("org/mb-string/p100.toml: model.license: must not contain newlines")
    assert "(1,000,001 characters)" in mb
    (repo,) = [line for line in by_file["mb-repo"] if "model.revision" in line]
    assert "characters)" in repo and len(repo) < 300
    assert lines[-1].endswith(f"in {len(cases)} file(s): no recipe was loaded")


@pytest.mark.parametrize(
    ("where", "value", "culprit"),
    [
        (
            "model.title",
            "P100\x9b31m",
            "model.title",
        ),  # C1 CSI: rendering refuses it, so check does
        ("card.title", "P100\x1b[2J", "card.title"),
        ("receipt.summary", "fast\x85", "receipt.summary"),  # NEL
        ("receipt.notes", ["ok", "bad\x7f"], "receipt.notes"),
        ("engine.release", "v1\x00", "engine.release"),
        ("run.env", {"GGML_X": "1\x9b"}, "run.env"),
        ("run.args", ["--chat-template", "t\x1b]0;x\x07"], "run.args"),
    ],
)
def test_control_characters_refused_by_check(
    tmp_path: Path, where: str, value: Any, culprit: str
) -> None:
    data = example()
    section, key = where.split(".")
    data[section][key] = value
    write_recipe(tmp_path, data)
    proc = cli("check", str(tmp_path))
    assert proc.returncode == 1
    lines = assert_clean(proc)
    assert lines[0].startswith(f"iamMrDuncan/Qwen3.8-27B-PN3-GGUF/p100.toml: {culprit}"), lines
    assert "control characters" in lines[0]


@pytest.mark.parametrize(
    ("args", "env", "names"),
    [
        (["--ctx_size", "4000000"], {}, '"--ctx_size": the launcher sets --ctx-size'),
        (["--threads_batch", "64"], {}, '"--threads_batch": the launcher sets --threads-batch'),
        (["--port=1"], {}, '"--port": the launcher sets --port'),
        (["-hf", "evil/model"], {}, '"-hf": --hf-repo downloads a model'),
        (["--hf_repo", "evil/model"], {}, '"--hf_repo": --hf-repo downloads'),
        (["-mu", "http://x/m.gguf"], {}, '"-mu": --model-url downloads'),
        (["--hf-file", "m.gguf"], {}, '"--hf-file": --hf-file picks'),
        (["--lora", "a.gguf"], {}, '"--lora": --lora loads a LoRA adapter'),
        (["--mmproj", "p.gguf"], {}, '"--mmproj": --mmproj loads a multimodal projector'),
        (["-md", "d.gguf"], {}, '"-md": --spec-draft-model loads a draft model'),
        (["--tools", "all"], {}, '"--tools": --tools gives callers built-in tools'),
        (["--path", "/"], {}, '"--path": --path serves the files'),
        (["--slot_save_path", "/tmp"], {}, '"--slot_save_path": --slot-save-path lets callers'),
        ([], {"LLAMA_ARG_HF_REPO": "evil/m"}, '"LLAMA_ARG_HF_REPO": llama-server reads it as'),
        ([], {"LLAMA_ARG_MODEL_URL": "http://x"}, '"LLAMA_ARG_MODEL_URL": llama-server reads'),
        ([], {"LLAMA_ARG_CTX_SIZE": "9"}, "which the launcher sets from [run] context"),
        ([], {"HF_TOKEN": "hf_x"}, '"HF_TOKEN": llama-server reads it as --hf-token'),
        ([], {"LLAMA_ARG_TOOLS": "all"}, '"LLAMA_ARG_TOOLS": llama-server reads it as --tools'),
    ],
)
def test_launcher_and_weight_flags_refused_by_check(
    tmp_path: Path, args: list[str], env: dict[str, str], names: str
) -> None:
    data = example()
    data["run"]["args"] = ["-fa", "on", *args]
    data["run"]["env"] = {"GGML_CUDA_FATTN_SM60": "1", **env}
    write_recipe(tmp_path, data)
    proc = cli("check", str(tmp_path))
    assert proc.returncode == 1
    line, _summary = assert_clean(proc)
    key = "run.args" if args else "run.env"
    assert line.startswith(f"iamMrDuncan/Qwen3.8-27B-PN3-GGUF/p100.toml: {key}: must not "), line
    assert names in line, line


# --- the command line -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--host", "0.0.0.0"], '-- "--host": the launcher sets --host itself; use --host'),
        (["--port", "1"], '-- "--port": the launcher sets --port itself; use --port'),
        (["--ctx-size=9"], '-- "--ctx-size": the launcher sets --ctx-size itself; use --context'),
        (["-m", "/etc/shadow"], '-- "-m": the launcher sets --model from [model] file'),
        (["-hf", "evil/m"], '-- "-hf": refused: --hf-repo downloads a model from Hugging Face'),
        (["--chat-template", HOSTILE], "-- "),
    ],
)
def test_run_extra_args_refused_naming_the_option(extra: list[str], message: str) -> None:
    proc = cli("run", "pn3", "--dry-run", "--", *extra)
    assert proc.returncode == 2, proc.stderr
    (line,) = assert_clean(proc)
    assert line.startswith(message), line


def test_deploy_extra_args_refused_before_the_inventory_is_read(tmp_path: Path) -> None:
    proc = cli("deploy", "-i", str(tmp_path / "missing.py"), "pn3", "--", "--ctx_size", "1")
    assert proc.returncode == 2
    (line,) = assert_clean(proc)
    assert line.startswith('-- "--ctx_size": the launcher sets --ctx-size itself; use --context')


def test_hostile_model_name_and_limit_are_escaped() -> None:
    proc = cli("info", HOSTILE)
    assert proc.returncode == 2  # an unknown model is a usage error
    lines = assert_clean(proc)
    assert lines[0].startswith(
        "x\\u001b]0;pwned\\u0007\\u001b[2J\\u009b31m\\u202ey\\u000dz: no recipe"
    )


# --- GPU names from nvidia-smi, on a terminal and in JSON -----------------------------------


@pytest.fixture
def hostile_smi(tmp_path: Path) -> dict[str, str]:
    """An nvidia-smi whose GPU name carries ESC, BEL, a C1 CSI and a bidi override."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    name = "Tesla P100\\033]0;pwned\\007\\302\\2332J\\342\\200\\256x"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        f"  *--query-gpu*) printf '0, {P100_UUID}, {name}, 6.0, 16384, 0, 535.183.01\\n' ;;\n"
        "  *) echo 'NVIDIA-SMI 535.183.01   Driver Version: 535.183.01' ;;\n"
        "esac\n",
        encoding="utf-8",
    )
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "NO_COLOR": ""}


def test_gpu_name_escaped_in_text_and_exact_in_json(hostile_smi: dict[str, str]) -> None:
    env = {k: v for k, v in hostile_smi.items() if k != "NO_COLOR"}
    text = cli("doctor", "--local", env=env)
    assert_clean(text, max_line=1000)
    assert "Tesla P100\\u001b]0;pwned\\u0007\\u009b2J\\u202ex" in text.stdout
    data = cli("doctor", "--local", "--json", env=env)
    assert_clean(data, max_line=100_000)
    (gpu,) = json.loads(data.stdout)["hosts"][0]["gpus"]
    assert gpu["name"] == "Tesla P100\x1b]0;pwned\x07\x9b2J\u202ex"  # exact, once decoded


def test_on_a_terminal_own_colours_pass_and_hostile_ones_do_not(
    hostile_smi: dict[str, str],
) -> None:
    env = {
        **os.environ,
        "PATH": hostile_smi["PATH"],
        "TERM": "xterm",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    env.pop("NO_COLOR", None)
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorless_deploy", "doctor", "--local"],
        stdout=follower,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=120)
    os.close(leader)
    text = out.decode("utf-8")
    assert "\x1b[1;31mNOT READY\x1b[0m" in text  # the tool's own colour, real ESC
    assert "Tesla P100\\u001b]0;pwned\\u0007\\u009b2J\\u202ex" in text
    assert "\x1b]" not in text and "\x9b" not in text and "\u202e" not in text


# --- the guard itself -----------------------------------------------------------------------


def test_guard_escapes_every_write_and_keeps_json_valid(capsys: pytest.CaptureFixture[str]) -> None:
    with terminal_guard():
        print(HOSTILE)
        print(HOSTILE, file=sys.stderr)
        emit_json({"name": HOSTILE, "del": "\x7f", "nel": "\x85"})
        print(table([[HOSTILE, "b"]], ["A", "B"]))
        print(paint(HOSTILE, "31"))  # not a terminal: no colour, text escaped
    out, err = capsys.readouterr()
    assert not RAW_CONTROL.search(out) and not RAW_CONTROL.search(err)
    first, rest = out.split("\n", 1)
    assert first == safe(HOSTILE) == "x\\u001b]0;pwned\\u0007\\u001b[2J\\u009b31m\\u202ey\\u000dz"
    doc = json.loads(rest[: rest.index("}\n") + 1])
    assert doc == {"name": HOSTILE, "del": "\x7f", "nel": "\x85"}
    assert sys.stdout is not None and not hasattr(sys.stdout, "wrapped")  # restored after


def test_table_cells_stay_on_one_line() -> None:
    out = table([["a\nb", "c"]], ["X", "Y"])
    assert out.splitlines() == ["X         Y", "a\\u000ab  c"]


# --- inventories ----------------------------------------------------------------------------

P100 = {"name": "Tesla P100-PCIE-16GB", "compute_cap": "6.0", "memory_total_mib": 16384}


@pytest.fixture
def offline_env(tmp_path: Path) -> dict[str, str]:
    """plan --offline without the network: the Hub is a port nothing listens on."""
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    return {
        "HF_ENDPOINT": f"http://127.0.0.1:{port}",
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "HF_TOKEN": "",
    }


def plan_offline(
    tmp_path: Path, text: str, env: Mapping[str, str]
) -> subprocess.CompletedProcess[str]:
    inventory = tmp_path / "inventory.py"
    inventory.write_text(text, encoding="utf-8")
    return cli("plan", "-i", str(inventory), "--offline", "pn3", env=env)


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        ({**P100, "memory_total_mib": True}, "[0].memory_total_mib: must be MiB from 1 to"),
        ({**P100, "driver_version": "abc"}, '[0].driver_version: must be a version such as "535'),
        ({**P100, "count": -1}, "[0].count: must be a number of cards from 1 to 64, not -1 (int)"),
        ({**P100, "count": 10**9}, "[0].count: must be a number of cards from 1 to 64"),
        ({**P100, "name": "P100\x1b]0;x\x07"}, "[0].name: must be the GPU's name, one line"),
        ({**P100, "compute_cap": 6.0}, '[0].compute_cap: must be a string such as "6.0", not 6.0'),
        ({**P100, "memory_total": 1}, "[0].memory_total: unknown key (a GPU has: name,"),
        ({**P100, "memory_used_mib": 99999}, "[0].memory_used_mib: must be MiB from 0 to 16,384"),
        ("P100", ": must be a non-empty list, not 'P100' (str)"),
    ],
)
def test_bad_tensorless_gpus_names_host_and_key(
    tmp_path: Path, offline_env: dict[str, str], gpu: Any, message: str
) -> None:
    gpus = gpu if isinstance(gpu, str) else [gpu]
    proc = plan_offline(
        tmp_path, f"gpu_hosts = [('h1', {{'tensorless_gpus': {gpus!r}}})]\n", offline_env
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = assert_clean(proc)
    assert line.startswith(f"h1: tensorless_gpus{message}"), line


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("import sys\nsys.exit(3)\n", "the inventory called sys.exit(3) while loading"),
        (
            "hosts = ['h1']\nraise RuntimeError('no\\x1b[2J')\n",
            "cannot load the inventory: line 2: RuntimeError: no\\u001b[2J",
        ),
        ("def broken(:\n", "cannot load the inventory: line 1: SyntaxError"),
        ("hosts = ['h1', 'h1']\n", 'hosts: host "h1" is listed twice; list it once'),
        (
            "a = [('h1', {'tensorless_port': 1})]\nb = [('h1', {'tensorless_port': 2})]\n",
            'host "h1" has its own data in a and in b; give its data once',
        ),
        ("gpu_hosts = ('h1', 'h2')\n", "gpu_hosts: is a tuple of hosts, which pyinfra reads as"),
        ("gpu_hosts = {'h1', 'h2'}\n", "gpu_hosts: is a set of hosts, which pyinfra skips"),
        ("gpu_hosts = {'h1': {'ssh_user': 'root'}}\n", "gpu_hosts: is a dict of hosts"),
        ("gpu_hosts = ['h1', ['h2']]\n", "gpu_hosts[1]: a host is a name or a (name, data) tuple"),
        ("gpu_hosts = 'h1'\n", "no hosts (a group is a module-level list of names"),
        ("gpu_hosts = ['h1\\x9b2J']\n", 'gpu_hosts: host name "h1\\u009b2J" must be one word'),
    ],
)
def test_broken_inventory_is_one_line_exit_1(
    tmp_path: Path, offline_env: dict[str, str], text: str, message: str
) -> None:
    proc = plan_offline(tmp_path, text, offline_env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = assert_clean(proc)
    assert line.startswith(f"{tmp_path / 'inventory.py'}: {message}"), line


def test_missing_inventory_is_a_usage_error(tmp_path: Path) -> None:
    proc = cli("doctor", "-i", str(tmp_path / "nope.py"))
    assert proc.returncode == 2
    (line,) = assert_clean(proc)
    assert line.startswith(f"{tmp_path / 'nope.py'}: no such inventory file")
