"""Kubernetes manifests from the launch spec (pure: documents out, nothing read, run or written).

The same launch spec that deploy renders to a unit becomes a Deployment (and a Service): the
container's image, llama-server's argv and env are the spec's own, and every container option
of the one option set (launch.container.container_options) is mapped here to its Kubernetes
field, or said to have no Kubernetes meaning (``_apply``; mypy fails on an option kind this
module does not handle, so an option added there must be decided here). What the cluster
decides (which node, which card, the pod's address) is left to it: the manifest asks for one
GPU (``nvidia.com/gpu: 1``) on a node whose GPU feature discovery labels match the recipe's
card, and llama-server binds the pod's own address.

Two targets: ``kube`` (Kubernetes with NVIDIA's device plugin and GPU feature discovery) and
``podman-kube`` (``podman kube play`` on one host, podman >= 5.4): the same documents but for
what podman reads differently (``Workload``: the GPU as a CDI device name in
``resources.limits``, one Deployment per instance since podman plays one replica, a host port).
docs/kubernetes.md has the field-by-field table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn
from urllib.parse import urlsplit

from tensorless_deploy.decisions.checks import DISK_MARGIN_BYTES, version_tuple
from tensorless_deploy.errors import TensorlessError
from tensorless_deploy.facts.values import (
    LABEL_CARD,
    LABEL_PREFIX,
    LABEL_RECIPE_DIGEST,
    LABEL_TUNED,
)
from tensorless_deploy.launch.container import Option, container_options, health_command
from tensorless_deploy.launch.spec import (
    HEALTH_STARTUP_INTERVAL_S,
    LaunchSpec,
)
from tensorless_deploy.recipe.schema import Recipe

Target = Literal["kube", "podman-kube"]
TARGETS: tuple[Target, ...] = ("kube", "podman-kube")

# One llama-server on one card per pod, as deploy runs one per card: the recipe was measured so.
GPU_RESOURCE = "nvidia.com/gpu"  # NVIDIA's device plugin
GPUS_PER_POD = 1
# NVIDIA GPU feature discovery's node labels (k8s-device-plugin, internal/lm: resource.go and
# nvml.go): the card's compute capability, its memory in MiB, the driver version's parts.
GFD_COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
GFD_COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"
GFD_MEMORY_MIB = "nvidia.com/gpu.memory"
GFD_DRIVER = (
    "nvidia.com/cuda.driver.major",
    "nvidia.com/cuda.driver.minor",
    "nvidia.com/cuda.driver.rev",
)
# In a pod llama-server binds the pod's own address: the kubelet probes the pod IP, a Service
# forwards to it. The launch spec is built with this bind (hostplan.export).
POD_BIND = "0.0.0.0"
# Secrets the pod reads by reference; the manifest never holds their values.
HF_TOKEN_SECRET = "tensorless-hf-token"
HF_TOKEN_KEY = "token"
HF_TOKEN_ENV = "HF_TOKEN"
# Labels: the selector, the Kubernetes recommended ones, and the spec's own labels that select
# well (the rest of the spec's labels, full values, are annotations).
SELECTOR_LABEL = "app.kubernetes.io/instance"
APP_LABELS = {
    "app.kubernetes.io/name": "llama-server",
    "app.kubernetes.io/managed-by": "tensorless-deploy",
}
SELECTING_LABELS = (LABEL_RECIPE_DIGEST, LABEL_CARD, LABEL_TUNED)
UNTUNED_ANNOTATION = f"{LABEL_PREFIX}.untuned"
DESCRIPTION_ANNOTATION = "kubernetes.io/description"
LABEL_VALUE_MAX = 63  # Kubernetes: a label value is at most 63 characters
NAME_MAX = 63  # container, volume and Service names are DNS-1123 labels
# The operator's files llama-server reads (launch.spec: API_KEY_NAME, TLS_CERT_NAME,
# TLS_KEY_NAME; one read-only file mount each): the Secret and key each comes from. The TLS pair
# is one Secret of type kubernetes.io/tls, whose keys are exactly these names.
OPERATOR_SECRETS = {
    "api-key": ("tensorless-api-key", "api-key"),
    "tls.crt": ("tensorless-tls", "tls.crt"),
    "tls.key": ("tensorless-tls", "tls.key"),
}
# podman kube play maps a CDI device named in resources.limits from podman 5.4 (PR #25010)
KUBE_PLAY_MIN_PODMAN = (5, 4)
SECRET_MODE = 0o440  # readable by the engine's group only, as the units install them
# podman kube play writes a Secret's files root:root with defaultMode and ignores fsGroup
# (docs/field-notes.md): 0440 leaves llama-server (uid 10001) unable to read its key, so it
# exits in a loop. The mode bits are all the Secret allows: readable by every user of the
# container, whose only process is the server; on the host the files sit in podman's
# root-only volume directory (/var/lib/containers/storage/volumes/SECRET, under a 0700 folder).
PODMAN_SECRET_MODE = 0o444
INIT_CONTAINER = "model-download"  # the operations script it runs
PORT_NAME = "http"

_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_KEY_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"(?:[a-z0-9](?:[-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_KEY_NAME}")
_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")

Json = Any  # a JSON value: dict, list, str, int, bool or None

# Where each field of the launch spec lands in the manifest (tests/test_kube.py fails on a field
# missing here, so a new one is decided, not dropped). Most reach it through the option set.
SPEC_FIELDS = {
    "name": "Deployment, Service and container name (DNS-1123, shortened past 63 characters)",
    "description": f"annotation {DESCRIPTION_ANNOTATION}",
    "engine": "no Kubernetes meaning: the node's container runtime",
    "image": "the server's image (and the init step's: init_image)",
    "model_path": "the model volume's subPath, under the init step's volume root",
    "model_mount": "the server's read-only mountPath of the model",
    "gpu_uuids": f"no Kubernetes meaning: the device plugin picks the card ({GPU_RESOURCE})",
    "env": "the server's env, in order",
    "server_args": "the server's args (the image's entry point is llama-server)",
    "bind": f"in args; must be {POD_BIND}: the pod's own address",
    "port": "containerPort (and podman-kube's hostPort); the Service's port",
    "labels": "annotations verbatim; recipe digest, card and tuned also as labels",
    "tuning": f"label {LABEL_TUNED}, annotation {UNTUNED_ANNOTATION} with the reasons",
    "start_timeout_s": "the startup probe's failureThreshold (one probe a second)",
    "user": "securityContext runAsUser/runAsGroup (runAsNonRoot); the pod's fsGroup",
    "secrets": "Secret volumes (OPERATOR_SECRETS), one read-only file mount each",
    "tls": "through health_url: the probes' scheme HTTPS",
    "metrics": "in args (--metrics) and a label annotation",
    "pids_limit": "no pod field: the kubelet's podPidsLimit is the node's configuration",
    "heal": "the liveness probe: the kubelet restarts a failing container",
    "device": "an annotation (the io.tensorless.device label); the pod's start log is not read",
}


class KubeError(TensorlessError):
    """A launch spec that cannot become a manifest as it stands."""


@dataclass(frozen=True)
class InitStep:
    """The init container's program: the host's own download script (operations/scripts,
    verify-then-rename), bound to the pod's paths by the caller, its ``auth`` left unbound."""

    script: str
    volume_root: str  # where the model volume is mounted in the init container
    secrets_dir: str  # a memory-backed volume for the token's header file
    auth_file: str  # the header file the script reads with curl -H @file


@dataclass(frozen=True)
class Workload:
    """One Deployment: its launch spec and how many pods of it, each with one GPU.

    cdi_device: podman-kube only, the CDI device podman maps (``nvidia.com/gpu=0``); host_ip:
    podman-kube only, where the host publishes the port (deploy's bind address)."""

    spec: LaunchSpec
    replicas: int = 1
    cdi_device: str | None = None
    host_ip: str | None = None


def init_image(spec: LaunchSpec) -> str:
    """The init step's image, the one place it is chosen: the engine image itself, by the
    recipe's digest. The image contract gives it sh, curl and coreutils (sha256sum, stat,
    head, tee); the node pulls it for the server anyway, and no second pin can go stale."""
    return spec.image


def dns_label(text: str) -> str:
    """A Kubernetes name (DNS-1123 label): the text when it fits in 63 characters, else its
    start and 8 hex digits of its sha256, so two long names stay apart."""
    if _DNS_LABEL.fullmatch(text) and len(text) <= NAME_MAX:
        return text
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if len(slug) <= NAME_MAX and slug:
        return slug
    tag = hashlib.sha256(text.encode()).hexdigest()[:8]
    return slug[: NAME_MAX - 9].rstrip("-") + "-" + tag


def digest_label(digest: str) -> str:
    """A recipe digest as a label value: "sha256:" and 64 hex digits are 71 characters, a label
    value at most 63 and without ':'. The label holds the first 63 hex digits (252 of the 256
    bits: a selector by digest stays unambiguous); the annotation of the same name holds it all."""
    return digest.removeprefix("sha256:")[:LABEL_VALUE_MAX]


def _seconds(value: str) -> int:
    return int(value.removesuffix("s"))


def _never(kind: NoReturn) -> NoReturn:
    raise KubeError(f"container option {kind!r} has no Kubernetes mapping yet (launch/kube.py)")


@dataclass
class _Container:
    """What the option set says of the server container, in Kubernetes terms."""

    name: str = ""
    env: list[dict[str, str]] = dataclasses.field(default_factory=list)
    mounts: list[tuple[str, str, bool]] = dataclasses.field(default_factory=list)  # src, dst, ro
    tmpfs: list[str] = dataclasses.field(default_factory=list)
    drop: list[str] = dataclasses.field(default_factory=list)
    security: dict[str, Json] = dataclasses.field(default_factory=dict)
    group: int | None = None  # the container's group: the pod's fsGroup (secret files)
    interval: int = 0
    timeout: int = 0
    retries: int = 0
    start_period: int = 0


def _user(c: _Container, value: str) -> None:
    """--user UID[:GID] as Kubernetes takes it: numbers only."""
    uid, _, gid = value.partition(":")
    if not uid.isdigit() or not (gid.isdigit() or gid == ""):
        raise KubeError(f"user {value!r}: Kubernetes takes a numeric UID[:GID]")
    c.security["runAsUser"] = int(uid)
    if gid:
        c.security["runAsGroup"] = int(gid)
        c.group = int(gid)
    c.security["runAsNonRoot"] = int(uid) != 0


def _apply(c: _Container, o: Option) -> None:
    """One container option into its Kubernetes field (or nowhere, and why)."""
    match o.kind:
        case "health_cmd":
            pass  # the probes: httpGet on the same URL (spec.health_url) the command polls
        case "health_interval":
            c.interval = _seconds(o.value)
        case "health_timeout":
            c.timeout = _seconds(o.value)
        case "health_retries":
            c.retries = int(o.value)
        case "health_start_period":
            c.start_period = _seconds(o.value)
        case "health_on_failure":
            pass  # the kubelet restarts a container whose liveness probe fails: no field
        case "name":
            c.name = o.value
        case "network":
            pass  # no Kubernetes meaning: the pod's own network, never the node's (hostNetwork)
        case "user":
            _user(c, o.value)
        case "read_only":
            c.security["readOnlyRootFilesystem"] = o.value == "true"
        case "tmpfs":
            c.tmpfs.append(o.value)  # a memory-backed emptyDir
        case "pids_limit":
            pass  # no pod field: the kubelet's podPidsLimit is the node's configuration
        case "cap_drop":
            c.drop.append(o.value.upper())
        case "no_new_privileges":
            c.security["allowPrivilegeEscalation"] = False
        case "volume":
            src, dst, *opts = o.value.split(":")
            c.mounts.append((src, dst, "ro" in ",".join(opts).split(",")))
        case "device" | "gpus":
            pass  # no Kubernetes meaning: the device plugin picks the card (nvidia.com/gpu: 1)
        case "env":
            name, _, value = o.value.partition("=")
            c.env.append({"name": name, "value": value})
        case "label":
            pass  # from spec.labels: annotations, and the selecting ones as labels (_meta)
        case _:
            _never(o.kind)


def _probe(
    spec: LaunchSpec, period: int, timeout: int, failures: int, target: Target
) -> dict[str, Json]:
    """The kubelet's httpGet (it skips certificate checks for HTTPS); for podman, which runs a
    probe as `curl -f SCHEME://localhost:PORT/health` in the container (no -k: a TLS server's
    probe failed, and the container was restarted), the units' own health command."""
    url = urlsplit(spec.health_url)
    how: dict[str, Json]
    if target == "podman-kube":
        how = {"exec": {"command": list(health_command(spec))}}
    else:
        how = {
            "httpGet": {
                "path": url.path or "/",
                "port": url.port or spec.port,
                "scheme": url.scheme.upper(),
            }
        }
    return {
        **how,
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "successThreshold": 1,
        "failureThreshold": failures,
    }


def _checked_key(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise KubeError(f"refusing {key!r} as a Kubernetes label or annotation key")
    return key


def _meta(spec: LaunchSpec, name: str) -> tuple[dict[str, str], dict[str, str]]:
    """The pod's labels and annotations: every spec label verbatim as an annotation (no length
    or character limit there); the ones that select well also as labels."""
    labels = {SELECTOR_LABEL: name, **APP_LABELS}
    annotations: dict[str, str] = {}
    for key, value in spec.labels:
        annotations[_checked_key(key)] = value
        if key in SELECTING_LABELS:
            shown = digest_label(value) if key == LABEL_RECIPE_DIGEST else value
            if not _LABEL_VALUE.fullmatch(shown) or len(shown) > LABEL_VALUE_MAX:
                raise KubeError(f"refusing {shown!r} as the value of label {key}")
            labels[key] = shown
    if not spec.tuning.tuned:
        annotations[UNTUNED_ANNOTATION] = "; ".join(spec.tuning.reasons)
    annotations[DESCRIPTION_ANNOTATION] = spec.description
    return labels, annotations


def _driver_terms(min_driver: str) -> list[list[dict[str, Json]]]:
    """The driver version at least min_driver, as node selector terms (ORed) on GFD's driver
    labels: a newer major; or the same major and a newer minor; ... Equality is Gt n-1 and Lt
    n+1, since GFD writes the parts as the driver prints them ("06")."""
    parts = version_tuple(min_driver)
    terms: list[list[dict[str, Json]]] = []
    for i, part in enumerate(parts):
        same = [
            e
            for key, p in zip(GFD_DRIVER, parts[:i], strict=False)
            for e in (
                {"key": key, "operator": "Gt", "values": [str(p - 1)]},
                {"key": key, "operator": "Lt", "values": [str(p + 1)]},
            )
        ]
        last = i == len(parts) - 1
        floor = part - 1 if last else part  # the last part may equal min_driver's
        terms.append([*same, {"key": GFD_DRIVER[i], "operator": "Gt", "values": [str(floor)]}])
    return terms


def _scheduling(recipe: Recipe) -> tuple[dict[str, str], dict[str, Json]]:
    """The recipe's card as GPU feature discovery labels it: compute capability equal (the
    node selector), memory and driver at least the card's (node affinity): deploy's card.match
    and driver.version checks, left to the scheduler."""
    major, minor = recipe.card.compute_capability.split(".")
    selector = {GFD_COMPUTE_MAJOR: major, GFD_COMPUTE_MINOR: minor}
    memory = {
        "key": GFD_MEMORY_MIB,
        "operator": "Gt",
        "values": [str(recipe.card.min_memory_mib - 1)],
    }
    terms = [
        {"matchExpressions": [memory, *term]} for term in _driver_terms(recipe.card.min_driver)
    ]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }
    return selector, affinity


def _deployment(
    recipe: Recipe, work: Workload, init: InitStep, target: Target
) -> tuple[dict[str, Json], str]:
    spec = work.spec
    if spec.bind != POD_BIND:
        raise KubeError(
            f"{spec.name}: llama-server must bind {POD_BIND} in a pod (the kubelet probes the "
            f"pod's address), not {spec.bind}"
        )
    c = _Container()
    for o in container_options(spec, health=True):
        _apply(c, o)
    name = dns_label(spec.name)
    storage = str(recipe.model.size_bytes + DISK_MARGIN_BYTES)
    model_volume = dns_label(f"{name}-model")
    secrets_volume = dns_label(f"{name}-secrets")
    volumes: list[dict[str, Json]] = [{"name": model_volume, "emptyDir": {"sizeLimit": storage}}]
    mounts: list[dict[str, Json]] = []
    for src, dst, ro in c.mounts:
        if src == spec.model_path:
            rel = posixpath.relpath(src, init.volume_root)
            if rel.startswith(".."):
                raise KubeError(f"{spec.name}: the model {src} is outside {init.volume_root}")
            mounts.append({"name": model_volume, "mountPath": dst, "subPath": rel, "readOnly": ro})
            continue
        ref = OPERATOR_SECRETS.get(posixpath.basename(src))
        if ref is None:
            raise KubeError(f"{spec.name}: no Kubernetes volume for {src}")
        secret, key = ref
        volume = dns_label(f"{name}-{secret}")
        if all(v["name"] != volume for v in volumes):
            volumes.append(
                {
                    "name": volume,
                    "secret": {
                        "secretName": secret,
                        "defaultMode": PODMAN_SECRET_MODE
                        if target == "podman-kube"
                        else SECRET_MODE,
                    },
                }
            )
        mounts.append({"name": volume, "mountPath": dst, "subPath": key, "readOnly": True})
    for i, path in enumerate(c.tmpfs):
        volume = dns_label(f"{name}-tmpfs-{i}")
        volumes.append({"name": volume, "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": volume, "mountPath": path})
    security: dict[str, Json] = {**c.security}
    if c.drop:
        security["capabilities"] = {"drop": c.drop}
    gpu = GPU_RESOURCE if work.cdi_device is None else work.cdi_device
    port: dict[str, Json] = {"name": PORT_NAME, "containerPort": spec.port, "protocol": "TCP"}
    if target == "podman-kube":
        port["hostPort"] = spec.port
        if work.host_ip is not None:
            port["hostIP"] = work.host_ip
    startup_failures = math.ceil(c.start_period / HEALTH_STARTUP_INTERVAL_S)
    server = {
        "name": dns_label(c.name),
        "image": spec.image,
        "imagePullPolicy": "IfNotPresent",
        "args": list(spec.server_args),
        "env": c.env,
        "ports": [port],
        "resources": {
            "limits": {gpu: str(GPUS_PER_POD)},
            "requests": {"ephemeral-storage": storage},
        },
        "volumeMounts": mounts,
        "securityContext": security,
        "startupProbe": _probe(
            spec, HEALTH_STARTUP_INTERVAL_S, c.timeout, startup_failures, target
        ),
        "livenessProbe": _probe(spec, c.interval, c.timeout, c.retries, target),
        # out of the Service at the first failed check; restarted after `retries` of them
        "readinessProbe": _probe(spec, c.interval, c.timeout, 1, target),
    }
    init_container = {
        "name": INIT_CONTAINER,
        "image": init_image(spec),
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", _init_program(init)],
        "env": [
            {
                "name": HF_TOKEN_ENV,
                "valueFrom": {
                    "secretKeyRef": {
                        "name": HF_TOKEN_SECRET,
                        "key": HF_TOKEN_KEY,
                        "optional": True,
                    }
                },
            }
        ],
        "volumeMounts": [
            {"name": model_volume, "mountPath": init.volume_root},
            {"name": secrets_volume, "mountPath": init.secrets_dir},
        ],
        "securityContext": security,
    }
    labels, annotations = _meta(spec, name)
    selector, affinity = _scheduling(recipe)
    pod = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,  # no *_SERVICE_HOST variables: the env is the spec's
        "nodeSelector": selector,
        "affinity": affinity,
        "initContainers": [init_container],
        "containers": [server],
        "volumes": [
            *volumes,
            {"name": secrets_volume, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        ],
    }
    if c.group is not None:
        pod["securityContext"] = {"fsGroup": c.group}  # the secret files' group, as on hosts
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {
            "replicas": work.replicas,
            "selector": {"matchLabels": {SELECTOR_LABEL: name}},
            # a new pod only once an old one has given its GPU back (deploy's serial roll)
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "template": {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod},
        },
    }
    return deployment, name


def _init_program(init: InitStep) -> str:
    """The token (from the optional Secret) as the header file the download script reads,
    then the script itself; the token never reaches an argv."""
    auth = shlex.quote(init.auth_file)
    return (
        "auth=\n"
        f'if [ -n "${{{HF_TOKEN_ENV}:-}}" ]; then\n'
        f"  auth={auth}\n"
        f'  (umask 077 && printf \'Authorization: Bearer %s\\n\' "${HF_TOKEN_ENV}" > "$auth")\n'
        "fi\n"
        f"unset {HF_TOKEN_ENV}\n" + init.script
    )


def _service(work: Workload, name: str, labels: Mapping[str, str]) -> dict[str, Json]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {
            "selector": {SELECTOR_LABEL: name},
            "ports": [
                {
                    "name": PORT_NAME,
                    "port": work.spec.port,
                    "targetPort": PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }


def render_documents(
    recipe: Recipe, workloads: Sequence[Workload], init: InitStep, target: Target
) -> list[dict[str, Json]]:
    """The manifest's documents: per workload a Deployment, and on Kubernetes its Service
    (podman kube play has no Services: the host port publishes it)."""
    docs: list[dict[str, Json]] = []
    for work in workloads:
        if (work.cdi_device is None) != (target == "kube") or work.replicas < 1:
            raise KubeError(
                f"{work.spec.name}: on kube the device plugin picks the GPU, on podman-kube a "
                "CDI device names it; at least one replica"
            )
        deployment, name = _deployment(recipe, work, init, target)
        docs.append(deployment)
        if target == "kube":
            docs.append(_service(work, name, deployment["metadata"]["labels"]))
    return docs


def comments(recipe: Recipe, target: Target, digest: str, *, api_key: bool, tls: bool) -> list[str]:
    """The manifest's opening comment: what made it, how to apply it, and the Secrets it
    references by name (the Hub token; the operator's key and TLS pair when they are asked for)."""
    apply = "kubectl apply -f FILE" if target == "kube" else "podman kube play FILE"
    create = (
        f"kubectl create secret generic {HF_TOKEN_SECRET} --from-literal={HF_TOKEN_KEY}=hf_..."
        if target == "kube"
        else f"a podman secret {HF_TOKEN_SECRET} (podman kube play of a Secret with "
        f"stringData {HF_TOKEN_KEY})"
    )
    lines = [
        f"Generated by tensorless-deploy export --format {target}: "
        f"{recipe.model.hf_repo} on {recipe.card.id}, recipe {digest}.",
        f"Do not edit: export again. Apply: {apply}.",
        f"Gated models: the Hub token by Secret reference, never here: {create}.",
    ]
    key, _ = OPERATOR_SECRETS["api-key"]
    cert, _ = OPERATOR_SECRETS["tls.crt"]
    kube = target == "kube"
    if api_key:
        how = (
            f"kubectl create secret generic {key} --from-file=api-key=KEYFILE"
            if kube
            else f"a podman secret {key} (podman kube play of a Secret with stringData api-key)"
        )
        lines.append(f"The API key by Secret reference, never here: {how}.")
    if tls:
        how = (
            f"kubectl create secret tls {cert} --cert=CERT --key=KEY"
            if kube
            else f"a podman secret {cert} (podman kube play of a kubernetes.io/tls Secret)"
        )
        lines.append(f"The TLS pair by Secret reference, never here: {how}.")
    return lines


# ------------------------------------------------------------------------------------- YAML

_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./@+=-]*(?::[A-Za-z0-9_./@+=-]+)*")
# words YAML 1.1 readers (PyYAML, go-yaml behind kubectl and podman) take as bools or null
_YAML11_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}
_SIMPLE_KEY_MAX = 1000
_BLOCK_SAFE = re.compile(r"[\x20-\x7e\n]*")


def _quoted(text: str) -> str:
    """A double-quoted scalar in printable ASCII: the escapes both YAML 1.1 and 1.2 read (\\x,
    \\u, \\U: a code point above U+FFFF is one escape, never a surrogate pair)."""
    out = []
    for ch in text:
        n = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif 0x20 <= n < 0x7F:
            out.append(ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif n <= 0xFF:
            out.append(f"\\x{n:02x}")
        elif n <= 0xFFFF:
            out.append(f"\\u{n:04x}")
        else:
            out.append(f"\\U{n:08x}")
    return '"' + "".join(out) + '"'


def _str(text: str) -> str:
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML11_WORDS:
        return text
    return _quoted(text)


def _scalar(value: Json) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _str(value)
    if value == {}:
        return "{}"
    if value == []:
        return "[]"
    raise TypeError(f"not a JSON value: {value!r}")


def _block(text: str) -> list[str] | None:
    """A multi-line string as a literal block (header, then its lines), when that reads back
    exactly: printable ASCII, no trailing blanks, a first line of content not starting with a
    space."""
    if "\n" not in text or not _BLOCK_SAFE.fullmatch(text):
        return None
    body = text.removesuffix("\n")
    lines = body.split("\n")
    content = [line for line in lines if line]
    # the block's indentation is read from its first line with content: there must be one,
    # and it must not start with a space
    if not content or content[0].startswith(" "):
        return None
    if any(line != line.rstrip(" ") for line in lines):
        return None
    if text.endswith("\n\n"):
        header = "|+"
    elif text.endswith("\n"):
        header = "|"
    else:
        header = "|-"
    return [header, *lines]


def _lines(value: Json, indent: int) -> list[str]:
    pad = " " * indent
    out: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            shown = _str(str(key))
            if len(shown) > _SIMPLE_KEY_MAX:  # YAML's implicit keys stop at 1024 characters
                out.append(f"{pad}? {shown}")
                shown = ""
            out += _entry(f"{pad}{shown}:", item, indent)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, dict) and item:
                sub = _lines(item, indent + 2)
                out.append(f"{pad}- {sub[0][indent + 2 :]}")
                out += sub[1:]
            else:
                out += _entry(f"{pad}-", item, indent)
    else:
        raise TypeError(f"not a mapping or a list: {value!r}")
    return out


def _entry(head: str, item: Json, indent: int) -> list[str]:
    if isinstance(item, (dict, list)) and item:
        return [head, *_lines(item, indent + 2)]
    block = _block(item) if isinstance(item, str) else None
    if block is not None:
        inner = " " * (indent + 2)
        return [f"{head} {block[0]}", *(inner + line if line else "" for line in block[1:])]
    return [f"{head} {_scalar(item)}"]


def to_yaml(docs: Sequence[Mapping[str, Json]], comments: Sequence[str] = ()) -> str:
    """The documents as one YAML stream (block style, deterministic), comments first."""
    out = [f"# {line}".rstrip() for line in comments]
    for doc in docs:
        out.append("---")
        out += _lines(dict(doc), 0)
    return "\n".join(out) + "\n"
