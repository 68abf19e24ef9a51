"""Strict pydantic models of recipe schema 1 (docs/design.md): one model on one card."""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from tensorless_deploy.recipe.flags import OWNED, OWNED_ENV, arg_problem, env_problem
from tensorless_deploy.recipe.text import has_control, quoted

DECODE_KEYS: tuple[str, ...] = ("short", "ctx_32k", "ctx_65k")

HEX40 = re.compile(r"[0-9a-f]{40}")
HEX64 = re.compile(r"[0-9a-f]{64}")
SHORT_NAME = re.compile(r"[a-z0-9._-]+")
HF_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
ALIAS = re.compile(r"[A-Za-z0-9._/-]+")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DOTTED_VERSION = re.compile(r"[0-9]+(\.[0-9]+)+")
COMPUTE_CAP = re.compile(r"[0-9]+\.[0-9]+")
ARCH = re.compile(r"[a-z0-9_]+")
MEASURE_KEY = re.compile(r"[a-z0-9_]+")
# An OCI reference by digest: registry host[:port]/path components, then @sha256:<64 hex>.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = rf"{_LABEL}(?:\.{_LABEL})*(?::[0-9]+)?"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_NAME = re.compile(rf"(?:{_DOMAIN}/)?{_PATH}(?:/{_PATH})*")
ZERO40 = "0" * 40
ZERO64 = "0" * 64


# Numbers llama-server reads as a C int (-c, -t: std::stoi), and sizes as 64-bit counts.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def _q(value: str) -> str:
    """A value shown in an error: quoted, escaped and cut short, so the error stays one line."""
    return quoted(value)


def _no_control(value: str) -> str:
    if has_control(value):
        raise ValueError(
            f"must not contain newlines or other control characters (C0, DEL, C1) ({_q(value)})"
        )
    return value


def _nonempty(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return _no_control(value)


def _short_name(value: str) -> str:
    if not SHORT_NAME.fullmatch(value):
        raise ValueError(f'must be lowercase letters, digits, ".", "_" and "-" only ({_q(value)})')
    return value


# Strings of the schema that share one rule, checked wherever they appear.
ShortName = Annotated[str, AfterValidator(_short_name)]
Text = Annotated[str, AfterValidator(_no_control)]


class RecipeModel(BaseModel):
    """Base of every recipe table: strict types, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ModelSection(RecipeModel):
    """[model]: the weights file, pinned by repository commit and sha256."""

    name: ShortName | None = Field(
        None,
        description="A short alias, such as `pn3`, that works anywhere a repo id does. "
        "Lowercase letters, digits, `.`, `_` and `-`. It must not equal any repo id, "
        "nor another model's short name; one model's cards share it.",
    )
    title: Text | None = Field(
        None, description="A one-line human name, shown by `info` and `models --json`."
    )
    hf_repo: str = Field(
        description="The Hugging Face model repository, `org/name`. This is what users type, "
        "matched without case. Two repo ids that differ only in case are refused."
    )
    revision: str = Field(
        description="The repository commit: 40 lowercase hex characters. "
        "Never a branch or tag name. All zeros marks the recipe unpublished."
    )
    file: str = Field(
        description="The weights file's path inside the repository: relative, with forward "
        "slashes, clean (no `..`), without `:` or newlines."
    )
    sha256: str = Field(
        description="The file's sha256, 64 lowercase hex characters. The launcher checks the "
        "download against it. All zeros marks the recipe unpublished."
    )
    size_bytes: int = Field(
        description="The file's exact size, for the disk-space check and progress. "
        "Must not be negative. `0` marks the recipe unpublished."
    )
    license: str = Field(description="The model's license.")

    @field_validator("hf_repo")
    @classmethod
    def _hf_repo(cls, v: str) -> str:
        if not HF_REPO.fullmatch(v) or ".." in v or "--" in v:
            raise ValueError(
                'must be a Hugging Face repository id "org/name" (letters, digits, ".", "_", '
                f'"-"; no ".." or "--") ({_q(v)})'
            )
        return v

    @field_validator("revision")
    @classmethod
    def _revision(cls, v: str) -> str:
        if not HEX40.fullmatch(v):
            raise ValueError(
                f"must be a 40-character lowercase hex commit, not a branch or tag ({_q(v)})"
            )
        return v

    @field_validator("file")
    @classmethod
    def _file(cls, v: str) -> str:
        _no_control(v)
        parts = v.split("/")
        if (
            not v
            or v.startswith("/")
            or "\\" in v
            or ":" in v
            or any(p in ("", ".", "..") for p in parts)
        ):
            raise ValueError(
                "must be a clean relative path with forward slashes (no leading /, no . or .. "
                f"segments, no \\ or :) ({_q(v)})"
            )
        return v

    @field_validator("sha256")
    @classmethod
    def _sha256(cls, v: str) -> str:
        if not HEX64.fullmatch(v):
            raise ValueError(f"must be 64 lowercase hex characters ({_q(v)})")
        return v

    @field_validator("size_bytes")
    @classmethod
    def _size(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"must not be negative ({v})")
        if v > INT64_MAX:
            raise ValueError(f"must be at most {INT64_MAX:,} bytes ({v})")
        return v

    @field_validator("license")
    @classmethod
    def _license(cls, v: str) -> str:
        return _nonempty(v)


class CardSection(RecipeModel):
    """[card]: the GPU the recipe was measured on, and what a host's GPU must match."""

    id: ShortName = Field(
        description="The card id, such as `p100`. Lowercase letters, digits, `.`, `_` and `-`. "
        "Must equal the file name without `.toml`."
    )
    title: Text | None = Field(
        None, description="The card's human name, such as `NVIDIA Tesla P100 16 GB`."
    )
    compute_capability: str = Field(
        description='Must equal the `compute_cap` that `nvidia-smi` reports, such as `"6.0"`.'
    )
    min_memory_mib: int = Field(
        description="The GPU's `memory.total`, in MiB, must be at least this. Positive."
    )
    min_driver: str = Field(
        description="The oldest NVIDIA driver the recipe runs on, a dotted version such as "
        '`"525.60.13"`.'
    )

    @field_validator("compute_capability")
    @classmethod
    def _cc(cls, v: str) -> str:
        if not COMPUTE_CAP.fullmatch(v):
            raise ValueError(f"must be MAJOR.MINOR as nvidia-smi prints compute_cap ({_q(v)})")
        return v

    @field_validator("min_memory_mib")
    @classmethod
    def _mem(cls, v: int) -> int:
        if v <= 0:
            raise ValueError(f"must be positive ({v})")
        if v > INT32_MAX:
            raise ValueError(f"must be at most {INT32_MAX:,} MiB ({v})")
        return v

    @field_validator("min_driver")
    @classmethod
    def _driver(cls, v: str) -> str:
        if not DOTTED_VERSION.fullmatch(v):
            raise ValueError(f'must be a dotted version such as "525.60.13" ({_q(v)})')
        return v


class EngineSection(RecipeModel):
    """[engine]: the container image, always by digest."""

    release: str = Field(
        description="The engine release the recipe was measured on, such as `engine-v0.1.0`."
    )
    arch: str = Field(
        description="The architecture the image is built for: a GPU's, such as `sm60` (then "
        "every deploy checks that the instance's own start log shows it on its card), or `cpu` "
        "for a CPU build (the test engine; its instances are reported on the CPU by design). "
        "Lowercase letters, digits and `_`."
    )
    image: str = Field(
        description="The engine image, always by digest: `name@sha256:<64 hex>`. "
        "A tag is refused. An all-zero digest marks the recipe unpublished."
    )

    @field_validator("release")
    @classmethod
    def _release(cls, v: str) -> str:
        return _nonempty(v)

    @field_validator("arch")
    @classmethod
    def _arch(cls, v: str) -> str:
        if not ARCH.fullmatch(v):
            raise ValueError(f'must be lowercase letters, digits and "_", such as "sm60" ({_q(v)})')
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        name, at, digest = v.partition("@")
        if not at:
            raise ValueError(
                f'must be pinned by digest, "name@sha256:<64 hex>", not a tag ({_q(v)})'
            )
        last = name.rsplit("/", 1)[-1]
        if ":" in last:
            raise ValueError(
                f'must be "name@sha256:<64 hex>" without a tag before the digest ({_q(v)})'
            )
        if not IMAGE_NAME.fullmatch(name):
            raise ValueError(f"has an invalid image name {_q(name)} ({_q(v)})")
        algo, _, hexpart = digest.partition(":")
        if algo != "sha256" or not HEX64.fullmatch(hexpart):
            raise ValueError(f'must end in "@sha256:" and 64 lowercase hex characters ({_q(v)})')
        return v

    @property
    def digest(self) -> str:
        """The `sha256:...` digest the image is pinned to."""
        return self.image.partition("@")[2]


class RunSection(RecipeModel):
    """[run]: the measured llama-server settings."""

    alias: str = Field(
        description="The served model name, as `/v1/models` lists it. Letters, digits, `.`, `_`, "
        "`-` and `/`; the recipes use the repo id. Passed as `--alias`."
    )
    context: int = Field(
        description="The context length, passed as `-c`. Positive. `--context` overrides it and "
        "makes the run untuned."
    )
    threads_max: int = Field(
        description="The most CPU threads to use. `-t`, `-tb` and `OMP_NUM_THREADS` are the "
        "smaller of this and the host's CPU count. Positive."
    )
    args: list[str] = Field(
        default_factory=list,
        description="Every other `llama-server` argument, in order. Must not contain the flags "
        "the launcher sets ("
        + ", ".join(f"`{f.name}`" for f in OWNED)
        + ") in any spelling llama-server reads (short, `_` for `-`, `--flag=value`), nor a flag "
        "that loads weights from elsewhere or opens files or tools to callers (see Refused "
        "llama-server flags).",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="The engine switches, exactly as measured. Each key must be a valid variable "
        "name, and must not be one the launcher sets ("
        + ", ".join(f"`{e}`" for e in OWNED_ENV)
        + " and the `LLAMA_ARG_*` twins of its flags) nor the twin of a refused flag.",
    )

    @field_validator("alias")
    @classmethod
    def _alias(cls, v: str) -> str:
        if not ALIAS.fullmatch(v):
            raise ValueError(f'must be letters, digits, ".", "_", "-" and "/" only ({_q(v)})')
        return v

    @field_validator("context", "threads_max")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError(f"must be positive ({v})")
        if v > INT32_MAX:
            raise ValueError(
                f"must be at most {INT32_MAX:,}: llama-server reads it as an int ({v})"
            )
        return v

    @field_validator("args")
    @classmethod
    def _args(cls, v: list[str]) -> list[str]:
        for arg in v:
            why = arg_problem(arg)
            if why is not None:
                raise ValueError(why)
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not ENV_NAME.fullmatch(key):
                raise ValueError(f"has {_q(key)}, which is not a valid variable name")
            why = env_problem(key)
            if why is not None:
                raise ValueError(why)
            if has_control(value):
                raise ValueError(
                    f"value of {_q(key)} must not contain newlines or other control characters "
                    f"({_q(value)})"
                )
        return v


def _measurements(v: dict[str, float], allowed: tuple[str, ...] | None) -> dict[str, float]:
    for key, num in v.items():
        if allowed is not None and key not in allowed:
            raise ValueError(f"has unknown key {_q(key)} (allowed: {', '.join(allowed)})")
        if not MEASURE_KEY.fullmatch(key):
            raise ValueError(f'has key {_q(key)}; use lowercase letters, digits and "_"')
        if not math.isfinite(num) or num < 0:
            raise ValueError(f"value of {_q(key)} must be a finite number, not negative ({num})")
    return v


class ReceiptSection(RecipeModel):
    """[receipt]: what was measured, and where. Every key is optional."""

    source: Text | None = Field(None, description="Who measured the numbers, and on what build.")
    summary: Text | None = Field(None, description="One or two sentences on the result.")
    decode_tps: dict[str, float] = Field(
        default_factory=dict,
        description="Decode speed in tokens per second. Keys: `short`, `ctx_32k`, `ctx_65k`. "
        "Not negative. `bench` compares its result with `short`.",
    )
    prefill_tps: dict[str, float] = Field(
        default_factory=dict,
        description="Prefill speed in tokens per second, for example `ctx_4k`. Not negative.",
    )
    notes: list[str] = Field(
        default_factory=list,
        description="The scope of each number, and anything else a reader needs.",
    )

    @field_validator("notes")
    @classmethod
    def _notes(cls, v: list[str]) -> list[str]:
        for note in v:
            _no_control(note)
        return v

    @field_validator("decode_tps")
    @classmethod
    def _decode(cls, v: dict[str, float]) -> dict[str, float]:
        return _measurements(v, DECODE_KEYS)

    @field_validator("prefill_tps")
    @classmethod
    def _prefill(cls, v: dict[str, float]) -> dict[str, float]:
        return _measurements(v, None)


class Recipe(RecipeModel):
    """One model on one card: the exact image, the exact file, the measured settings."""

    schema_version: int = Field(
        alias="schema",
        description="The recipe schema. Must be `1`; any other value fails with a request to "
        "update tensorless-deploy.",
    )
    status: Literal["draft", "released"] = Field(
        description='`"draft"` or `"released"`. See Draft, released and unpublished.'
    )
    model: ModelSection = Field(description="The weights file.")
    card: CardSection = Field(description="The GPU card.")
    engine: EngineSection = Field(description="The engine image.")
    run: RunSection = Field(description="The llama-server settings.")
    receipt: ReceiptSection = Field(
        default_factory=ReceiptSection, description="What was measured, and where."
    )

    @field_validator("schema_version")
    @classmethod
    def _schema(cls, v: int) -> int:
        if v != 1:
            raise ValueError(
                f"must be 1; this recipe uses schema {v}, which this tensorless-deploy cannot "
                "read (update tensorless-deploy)"
            )
        return v

    @property
    def unpublished(self) -> bool:
        """Placeholder values: an all-zero revision, sha256 or image digest, or size 0."""
        return (
            self.model.revision == ZERO40
            or self.model.sha256 == ZERO64
            or self.engine.digest == "sha256:" + ZERO64
            or self.model.size_bytes == 0
        )

    @property
    def state(self) -> str:
        """Exactly one of: released, draft, draft, unpublished, released, unpublished."""
        return f"{self.status}, unpublished" if self.unpublished else self.status
