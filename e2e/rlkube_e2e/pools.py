"""Fake node pools: read `e2e/pools.yaml` and turn each pool into kwok Node objects.

A pool is a group of identical nodes (as in a cloud node group): the scheduler
places pods on a pool through the `rlkube.dev/pool` label and the `nvidia.com/gpu`
extended resource, exactly as it would on a real GPU cluster.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlkube_e2e.errors import ClusterError

POOL_LABEL = "rlkube.dev/pool"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "rlkube-e2e"
# kwok is started with `--manage-nodes-with-annotation-selector` on this annotation,
# so it only simulates the nodes created here.
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# Node InternalIPs are made up; each pool gets its own /16 so they never collide.
NODE_IP_BASE = ipaddress.IPv4Address("10.128.0.0")

REQUIRED_CAPACITY = ("cpu", "memory", "pods")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
POOL_KEYS = {"nodes", "labels", "capacity", "allocatable", "taints"}

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# Builds the error for a key path; see parse_pools.
_Fail = Callable[[str, str], ClusterError]
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""

    def manifest(self) -> dict[str, str]:
        taint = {"key": self.key, "effect": self.effect}
        if self.value:
            taint["value"] = self.value
        return taint


@dataclass(frozen=True)
class NodePool:
    name: str
    nodes: int
    capacity: dict[str, str]
    allocatable: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()

    def node_names(self) -> list[str]:
        return [f"{self.name}-{index}" for index in range(self.nodes)]

    def node_manifests(self, pool_index: int) -> list[dict[str, Any]]:
        manifests = []
        for index, name in enumerate(self.node_names()):
            address = str(NODE_IP_BASE + pool_index * 65536 + index + 1)
            labels = {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                MANAGED_BY_LABEL: MANAGED_BY,
                **self.labels,
                POOL_LABEL: self.name,
            }
            spec: dict[str, Any] = {}
            if self.taints:
                spec["taints"] = [taint.manifest() for taint in self.taints]
            manifests.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "labels": labels,
                        "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                    },
                    "spec": spec,
                    # Node status may be set on create; kwok's node-initialize stage
                    # keeps the capacity and addresses given here.
                    "status": {
                        "capacity": dict(self.capacity),
                        "allocatable": dict(self.allocatable),
                        "addresses": [
                            {"type": "InternalIP", "address": address},
                            {"type": "Hostname", "address": name},
                        ],
                    },
                }
            )
        return manifests


def load_pools(path: Path) -> list[NodePool]:
    """Read and validate a pools file; errors name the file and the offending key."""
    try:
        text = path.read_text()
    except OSError as error:
        raise ClusterError(f"{path}: cannot read pools file ({error.strerror})") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ClusterError(f"{path}: not valid YAML{where}") from None
    return parse_pools(document, str(path))


def parse_pools(document: object, source: str) -> list[NodePool]:
    def fail(key: str, message: str) -> ClusterError:
        return ClusterError(f"{source}: {key}: {message}")

    if not isinstance(document, dict) or "pools" not in document:
        raise fail("pools", "missing; the file must be a mapping with a `pools` key")
    unknown = set(document) - {"pools"}
    if unknown:
        raise fail(sorted(map(str, unknown))[0], "unknown key (expected only `pools`)")
    pools_doc = document["pools"]
    if not isinstance(pools_doc, dict) or not pools_doc:
        raise fail("pools", "must be a non-empty mapping of pool name to pool")

    pools = []
    for name, spec in pools_doc.items():
        key = f"pools.{name}"
        if not isinstance(name, str) or not _DNS_LABEL.match(name) or len(name) > 50:
            raise fail(key, "pool name must be a lowercase DNS label (a-z, 0-9, '-') of at most 50 chars")
        if not isinstance(spec, dict):
            raise fail(key, "must be a mapping with `nodes` and `capacity`")
        unknown = set(spec) - POOL_KEYS
        if unknown:
            expected = ", ".join(sorted(POOL_KEYS))
            raise fail(f"{key}.{sorted(map(str, unknown))[0]}", f"unknown key (expected {expected})")
        nodes = spec.get("nodes")
        if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 0:
            raise fail(f"{key}.nodes", f"must be a non-negative integer, got {nodes!r}")
        if "capacity" not in spec:
            raise fail(f"{key}.capacity", "missing (needs at least cpu, memory and pods)")
        capacity = _resources(spec["capacity"], f"{key}.capacity", fail)
        for resource in REQUIRED_CAPACITY:
            if resource not in capacity:
                raise fail(f"{key}.capacity.{resource}", "missing")
        allocatable = capacity
        if "allocatable" in spec:
            allocatable = {**capacity, **_resources(spec["allocatable"], f"{key}.allocatable", fail)}
        labels = _labels(spec.get("labels", {}), f"{key}.labels", fail)
        if POOL_LABEL in labels:
            raise fail(f"{key}.labels.{POOL_LABEL}", "set automatically to the pool name; remove it")
        taints = _taints(spec.get("taints", []), f"{key}.taints", fail)
        pools.append(NodePool(name, nodes, capacity, allocatable, labels, taints))
    return pools


def _scalar(value: object) -> str | None:
    """YAML turns `8` into an int; accept numbers as strings but not booleans."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str | int | float):
        return str(value)
    return None


def _resources(value: object, key: str, fail: _Fail) -> dict[str, str]:
    if not isinstance(value, dict):
        raise fail(key, "must be a mapping of resource name to quantity")
    resources = {}
    for name, raw in value.items():
        quantity = _scalar(raw)
        if not isinstance(name, str) or not _label_key_ok(name):
            raise fail(f"{key}.{name}", "not a valid resource name")
        if quantity is None or not _QUANTITY.match(quantity):
            raise fail(f"{key}.{name}", f"not a Kubernetes quantity (e.g. 8, 500m, 64Gi): {raw!r}")
        resources[name] = quantity
    return resources


def _labels(value: object, key: str, fail: _Fail) -> dict[str, str]:
    if not isinstance(value, dict):
        raise fail(key, "must be a mapping of label key to value")
    labels = {}
    for name, raw in value.items():
        text = _scalar(raw)
        if not isinstance(name, str) or not _label_key_ok(name):
            raise fail(f"{key}.{name}", "not a valid label key")
        if text is None or (text and (len(text) > 63 or not _LABEL_NAME.match(text))):
            raise fail(f"{key}.{name}", f"not a valid label value (quote it if it is a boolean): {raw!r}")
        labels[name] = text
    return labels


def _taints(value: object, key: str, fail: _Fail) -> tuple[Taint, ...]:
    if not isinstance(value, list):
        raise fail(key, "must be a list of {key, value, effect}")
    taints = []
    for index, item in enumerate(value):
        where = f"{key}[{index}]"
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            raise fail(where, "must be a mapping with `key` and `effect`")
        if not _label_key_ok(item["key"]):
            raise fail(f"{where}.key", f"not a valid taint key: {item['key']!r}")
        if item.get("effect") not in TAINT_EFFECTS:
            raise fail(f"{where}.effect", f"must be one of {', '.join(TAINT_EFFECTS)}")
        taint_value = _scalar(item.get("value", ""))
        if taint_value is None:
            raise fail(f"{where}.value", "must be a string")
        taints.append(Taint(item["key"], item["effect"], taint_value))
    return tuple(taints)


def _label_key_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME.match(name))
