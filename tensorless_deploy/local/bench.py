"""bench: decode and prefill speed from llama-server's own timings, against the recipe's receipt.

The request is the public tensorless bench's: greedy, a fixed prompt of about 429 tokens, 256
generated tokens, prompt cache off so every run really prefills; a warm-up first, then the
median of the runs. The API is reached directly (local, --url) or through an SSH channel the
tool opens and closes itself, so a host's API never has to listen beyond its 127.0.0.1.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.recipe.schema import Recipe

N_PREDICT = 256
TOLERANCE = 0.10  # a run within 10 % below the receipt still meets it: these boxes are noisy
# prefill_tps.ctx_4k (the receipts' prefill figure): a prompt that fills 4k of context, the one
# generated token included, so it fits a recipe whose context is exactly 4096
PREFILL_CONTEXT = 4096
# About 429 tokens with common LLM tokenizers; the report carries the server's own prompt_n.
PROMPT = " ".join(
    [
        "The following is a careful account of how a small workshop repaired old machines.",
        "Every morning the mechanics opened the doors, swept the floor, and read the list of",
        "jobs left from the evening before. Some machines needed only oil and patience; others",
        "had to be taken apart to the last screw, cleaned, measured, and put back together.",
    ]
    * 6
    + ["Summarise the workshop's routine in plain words, then continue the story."]
)

Connect = Callable[[], http.client.HTTPConnection]


class BenchError(TensorlessError):
    """The server could not be measured."""


@dataclass(frozen=True)
class Sample:
    prompt_n: int
    prompt_tps: float
    predicted_n: int
    predicted_tps: float


@dataclass(frozen=True)
class Summary:
    runs: int
    prompt_n: int
    predicted_n: int
    decode_median: float
    decode_min: float
    decode_max: float
    prefill_median: float
    prefill_min: float
    prefill_max: float


def summarise(samples: Sequence[Sample]) -> Summary:
    if not samples:
        raise BenchError("no run finished: nothing to summarise")
    dec = [s.predicted_tps for s in samples]
    pre = [s.prompt_tps for s in samples]
    return Summary(
        runs=len(samples),
        prompt_n=samples[-1].prompt_n,
        predicted_n=samples[-1].predicted_n,
        decode_median=statistics.median(dec),
        decode_min=min(dec),
        decode_max=max(dec),
        prefill_median=statistics.median(pre),
        prefill_min=min(pre),
        prefill_max=max(pre),
    )


@dataclass(frozen=True)
class Comparison:
    key: str  # the receipt key compared, e.g. decode_tps.short
    measured: float
    receipt: float
    ratio: float
    meets: bool


def compare(
    summary: Summary,
    recipe: Recipe,
    tolerance: float = TOLERANCE,
    prefill_4k: Summary | None = None,
) -> list[Comparison]:
    """Against receipt.decode_tps.short (seed 000), and prefill where a key matches ("short";
    "ctx_4k" when the prefill at 4k was measured too)."""
    out = []
    pairs = [
        ("decode_tps", "short", summary.decode_median),
        ("prefill_tps", "short", summary.prefill_median),
    ]
    if prefill_4k is not None:
        pairs.append(("prefill_tps", "ctx_4k", prefill_4k.prefill_median))
    for table, key, measured in pairs:
        receipt = getattr(recipe.receipt, table).get(key)
        if receipt:
            ratio = measured / receipt
            out.append(
                Comparison(f"{table}.{key}", measured, receipt, ratio, ratio >= 1 - tolerance)
            )
    return out


def payload() -> dict[str, Any]:
    return {
        "prompt": PROMPT,
        "n_predict": N_PREDICT,
        "temperature": 0,
        "top_k": 1,
        "cache_prompt": False,
        "ignore_eos": True,
        "stream": False,
    }


def parse_timings(body: bytes) -> Sample:
    try:
        data = json.loads(body)
        t = data["timings"]
        return Sample(
            int(t["prompt_n"]),
            float(t["prompt_per_second"]),
            int(t["predicted_n"]),
            float(t["predicted_per_second"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"the server's answer has no usable timings ({exc})") from exc


def auth_headers(api_key: str | None) -> dict[str, str]:
    """What an OpenAI-compatible client of a keyed server sends (llama-server --api-key-file);
    /health needs none."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _post(
    connect: Connect, path: str, body: dict[str, Any], timeout: float, api_key: str | None = None
) -> bytes:
    conn = connect()
    conn.timeout = timeout
    try:
        headers = {"Content-Type": "application/json", **auth_headers(api_key)}
        conn.request("POST", path, body=json.dumps(body), headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        if resp.status == 401:
            raise BenchError(
                f"POST {path}: HTTP 401: the server wants an API key"
                + (" and refused this one" if api_key else ""),
                fix="pass the server's key file: --api-key-file FILE (with -i: "
                "tensorless_api_key_file in the inventory)",
            )
        if resp.status != 200:
            raise BenchError(f"POST {path}: HTTP {resp.status}: {data[:200]!r}")
        return data
    except (OSError, http.client.HTTPException) as exc:
        raise BenchError(f"POST {path}: {exc}") from exc
    finally:
        conn.close()


def tokenize(
    connect: Connect, text: str, timeout: float = 60, api_key: str | None = None
) -> list[int]:
    """The server's own tokens for text (llama-server POST /tokenize)."""
    body = _post(connect, "/tokenize", {"content": text}, timeout, api_key)
    try:
        tokens = json.loads(body)["tokens"]
        if not all(isinstance(t, int) for t in tokens):
            raise TypeError("not token ids")
    except (ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"the server's /tokenize answer has no tokens ({exc})") from exc
    return list(tokens)


def measure_prefill(
    connect: Connect,
    runs: int,
    context: int = PREFILL_CONTEXT,
    timeout: float = 600,
    api_key: str | None = None,
) -> list[Sample]:
    """Prefill at ``context``: `runs` completions of one token after a prompt of the bench's
    text, tokenized by the server and repeated to context - 1 tokens (sent as token ids, so the
    count is exact whatever the tokenizer), prompt cache off. A server whose slot is shorter
    answers 400, raised as a BenchError with its own words."""
    ids = tokenize(connect, PROMPT, timeout, api_key)
    if not ids:
        raise BenchError("the server tokenized the bench's prompt to nothing")
    n = context - 1
    prompt = (ids * (n // len(ids) + 1))[:n]
    body = payload() | {"prompt": prompt, "n_predict": 1}
    return [
        parse_timings(_post(connect, "/completion", body, timeout, api_key)) for _ in range(runs)
    ]


def health(connect: Connect) -> int:
    conn = connect()
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        resp.read()
        return int(resp.status)
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


def measure(
    connect: Connect, runs: int, timeout: float = 600, api_key: str | None = None
) -> list[Sample]:
    """Warm-up, then `runs` measured completions; an unhealthy server is refused up front.
    api_key: sent with every completion (the health check goes without)."""
    code = health(connect)
    if code != 200:
        state = "not answering" if code == 0 else f"HTTP {code} on /health"
        raise BenchError(f"the server is {state}; start it (run, serve or deploy) and retry")
    warm = payload() | {"n_predict": 16}
    _post(connect, "/completion", warm, timeout, api_key)
    return [
        parse_timings(_post(connect, "/completion", payload(), timeout, api_key))
        for _ in range(runs)
    ]


def tls_context(cafile: str | None = None, *, verify: bool = True) -> ssl.SSLContext:
    """A client context: verified against cafile (or the system's CAs); verify=False only for a
    server reached through an SSH channel, whose host key already vouches for the other end."""
    context = ssl.create_default_context(cafile=cafile)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def tcp(host: str, port: int, timeout: float = 10, tls: ssl.SSLContext | None = None) -> Connect:
    if tls is not None:
        return lambda: http.client.HTTPSConnection(host, port, timeout=timeout, context=tls)
    return lambda: http.client.HTTPConnection(host, port, timeout=timeout)


def over_channel(
    open_channel: Callable[[], socket.socket], tls: ssl.SSLContext | None = None
) -> Connect:
    """HTTP (or, with tls, HTTPS) over an already-open stream (an SSH direct-tcpip channel)."""

    def connect() -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection("127.0.0.1")
        channel = open_channel()
        if tls is None:
            conn.sock = channel
        else:  # ssl wraps only a real socket: a socket pair, pumped to and from the channel
            conn.sock = tls.wrap_socket(_socket_for(channel), server_hostname=None)
        return conn

    return connect


def _socket_for(channel: Any) -> socket.socket:
    """A real socket whose other end is relayed to and from ``channel`` by a daemon thread."""
    mine, theirs = socket.socketpair()

    def pump() -> None:
        import select

        try:
            while True:
                ready, _, _ = select.select([theirs, channel], [], [], 60)
                if not ready:
                    continue
                for src, dst in ((theirs, channel), (channel, theirs)):
                    if src in ready:
                        data = src.recv(65536)
                        if not data:
                            return
                        dst.sendall(data)
        except OSError:
            return
        finally:
            theirs.close()
            channel.close()

    threading.Thread(target=pump, daemon=True).start()
    return mine


def run_notes(summary: Summary) -> list[str]:
    """What a receipt says about how its numbers were measured (bench --receipt, gate run)."""
    return [
        f"Median of {summary.runs} runs: {summary.predicted_n} greedy tokens after a "
        f"{summary.prompt_n}-token prompt, prompt cache off.",
        f"Decode spread {summary.decode_min:.2f}-{summary.decode_max:.2f} tok/s; prefill "
        f"{summary.prefill_min:.2f}-{summary.prefill_max:.2f} tok/s.",
    ]


def receipt_toml(summary: Summary, image: str, card: str, date: str, tuned: bool | None) -> str:
    """The [receipt] table a recipe author pastes, naming what was measured and where."""
    notes = run_notes(summary)
    lines = [
        "[receipt]",
        f'source      = "tensorless-deploy bench, {image.rpartition("@")[2]}, {card}, {date}"',
        f"decode_tps  = {{ short = {summary.decode_median:.2f} }}",
        f"prefill_tps = {{ short = {summary.prefill_median:.2f} }}",
        "notes       = [",
        f'  "{notes[0]}",',
        f'  "{notes[1]}"',
        "]",
    ]
    if tuned is False:
        lines.insert(1, "# UNTUNED run: settings differ from the recipe; not a receipt for it")
    return "\n".join(lines) + "\n"
