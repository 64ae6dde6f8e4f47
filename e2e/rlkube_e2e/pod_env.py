"""A container's environment and command line, resolved as the kubelet does, for
bench/gpu/local_pods.py, which runs a job's pods as processes on a GPU machine that has no
Kubernetes.

Pure functions: the ConfigMaps and Secrets come in through `lookup`, the pod IP
is given (the node assigns it before the process starts).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from typing import Any

# ("configmap" | "secret", name) -> the object's data (Secret values decoded), or None if absent.
Lookup = Callable[[str, str], dict[str, str] | None]

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_INDEXED_FIELD = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


class ConfigError(Exception):
    """The pod asks for something that is missing or unsupported (kubelet: CreateContainerConfigError)."""


def field_value(pod: Mapping[str, Any], path: str, pod_ip: str, host_ip: str) -> str:
    """The downward API value of `path` (fieldRef.fieldPath)."""
    metadata = pod.get("metadata", {})
    spec = pod.get("spec", {})
    indexed = _INDEXED_FIELD.match(path)
    if indexed:
        return str((metadata.get(indexed.group(1)) or {}).get(indexed.group(2), ""))
    simple: dict[str, str] = {
        "metadata.name": metadata.get("name", ""),
        "metadata.namespace": metadata.get("namespace", ""),
        "metadata.uid": metadata.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
    }
    if path in simple:
        return simple[path]
    if path in ("metadata.labels", "metadata.annotations"):
        items = metadata.get(path.split(".")[1]) or {}
        return "\n".join(f'{key}="{value}"' for key, value in sorted(items.items()))
    raise ConfigError(f"fieldRef {path!r} is not supported by bench/gpu/local_pods.py")


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    lookup: Lookup,
    pod_ip: str,
    host_ip: str,
    base: Mapping[str, str],
) -> dict[str, str]:
    """`base` (PATH, service variables), then envFrom, then env; later entries win, values expanded."""
    env = dict(base)
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("configmap", "configMapRef"), ("secret", "secretRef")):
            if key in source:
                ref = source[key]
                data = lookup(kind, ref["name"])
                if data is None:
                    if ref.get("optional"):
                        continue
                    raise ConfigError(f"{kind} {ref['name']!r} not found (envFrom)")
                # The kubelet skips keys that are not valid variable names (with an event).
                env.update({prefix + k: v for k, v in data.items() if _ENV_NAME.match(prefix + k)})
    for variable in container.get("env") or []:
        name = variable["name"]
        if "valueFrom" not in variable:
            env[name] = expand(variable.get("value", ""), env)
            continue
        value = _value_from(pod, variable["valueFrom"], name, lookup, pod_ip, host_ip)
        if value is not None:
            env[name] = value
    return env


def _value_from(
    pod: Mapping[str, Any], source: Mapping[str, Any], name: str, lookup: Lookup, pod_ip: str, host_ip: str
) -> str | None:
    if "fieldRef" in source:
        return field_value(pod, source["fieldRef"]["fieldPath"], pod_ip, host_ip)
    for kind, key in (("configmap", "configMapKeyRef"), ("secret", "secretKeyRef")):
        if key in source:
            ref = source[key]
            data = lookup(kind, ref["name"])
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    return None
                missing = f"{kind} {ref['name']!r}" if data is None else f"key {ref['key']!r} in {kind} {ref['name']!r}"
                raise ConfigError(f"{missing} not found (env {name})")
            return data[ref["key"]]
    raise ConfigError(f"env {name}: valueFrom {sorted(source)} is not supported by bench/gpu/local_pods.py")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known variables are replaced, `$$` escapes, the rest stays as written."""
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char != "$" or index + 1 == len(text):
            out.append(char)
            index += 1
            continue
        following = text[index + 1]
        if following == "$":
            out.append("$")
            index += 2
        elif following == "(":
            end = text.find(")", index + 2)
            if end == -1:
                out.append(text[index:])
                break
            name = text[index + 2 : end]
            out.append(env[name] if name in env else text[index : end + 1])
            index = end + 1
        else:
            out.append("$")
            index += 1
    return "".join(out)


def decode_secret(data: Mapping[str, str]) -> dict[str, str]:
    """A Secret's `data` as the kubelet hands it to a container: base64 decoded."""
    return {key: base64.b64decode(value).decode(errors="replace") for key, value in data.items()}
