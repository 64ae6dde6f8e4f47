"""A pod's volumes: materialised under the pod's directory on the host, then bind-mounted.

configMap, secret, downwardAPI and projected volumes (the service-account token
volume the apiserver adds to every pod is a projected one) are written once as
plain files when the pod starts; later changes to their sources are not synced.
emptyDir is a directory of the pod (a tmpfs in the pod's sandbox for medium
Memory), hostPath the host's own path, and a persistentVolumeClaim the host path of
the PersistentVolume it is bound to (hostPath or local PVs, which is what a cluster
without a storage provisioner has). Other volume types are refused with a message
naming the volume.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkube_e2e.procnode.env import ConfigError, expand, field_value
from rlkube_e2e.procnode.mounts import Mount

# (kind, name) -> the object's keys and contents, or None if it does not exist.
Files = Callable[[str, str], dict[str, bytes] | None]
# (audience or None, expirationSeconds) -> a bound service-account token for the pod.
TokenSource = Callable[[str | None, int], str]
# A claim's name -> the host path of the PersistentVolume bound to it (ConfigError if none).
ClaimSource = Callable[[str], Path]

DEFAULT_MODE = 0o644
EMPTY_DIR_MODE = 0o777
SOURCED = ("configMap", "secret", "downwardAPI", "projected")
SUPPORTED = (*SOURCED, "emptyDir", "hostPath", "persistentVolumeClaim")


@dataclass(frozen=True)
class PodVolume:
    name: str
    path: Path
    # A tmpfs that the pod's sandbox mounts at `path`.
    memory: bool = False
    # Projections from API objects are read-only in containers, as with the kubelet.
    read_only: bool = False
    # emptyDir and hostPath get missing subPaths created.
    writable_source: bool = False


def prepare_volumes(
    pod: Mapping[str, Any],
    pod_dir: Path,
    files: Files,
    token: TokenSource,
    pod_ip: str,
    host_ip: str,
    claims: ClaimSource,
) -> dict[str, PodVolume]:
    volumes = {}
    for volume in pod["spec"].get("volumes") or []:
        name = volume["name"]
        path = pod_dir / "volumes" / name
        kind = next((key for key in SUPPORTED if key in volume), None)
        if kind is None:
            other = next((key for key in volume if key != "name"), "?")
            raise ConfigError(f"volume {name!r}: type {other!r} is not supported by the process node")
        if kind in SOURCED:
            content = _projection(pod, volume, kind, files, token, pod_ip, host_ip)
            _write_files(path, content)
            volumes[name] = PodVolume(name, path, read_only=True)
        elif kind == "emptyDir":
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(EMPTY_DIR_MODE)
            memory = (volume["emptyDir"] or {}).get("medium") == "Memory"
            volumes[name] = PodVolume(name, path, memory=memory, writable_source=True)
        elif kind == "persistentVolumeClaim":
            claim = volume["persistentVolumeClaim"]
            read_only = bool(claim.get("readOnly"))
            volumes[name] = PodVolume(
                name, claims(claim["claimName"]), read_only=read_only, writable_source=not read_only
            )
        else:
            volumes[name] = PodVolume(name, _host_path(name, volume["hostPath"]), writable_source=True)
    return volumes


def container_mounts(
    container: Mapping[str, Any], volumes: Mapping[str, PodVolume], env: Mapping[str, str]
) -> list[Mount]:
    mounts = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        if volume is None:
            raise ConfigError(f"volumeMount {mount['mountPath']!r}: no volume named {mount['name']!r}")
        sub_path = mount.get("subPath") or expand(mount.get("subPathExpr") or "", env)
        source = volume.path
        if sub_path:
            source = _inside(volume.path, sub_path, f"volumeMount {mount['mountPath']!r} subPath")
            if not source.exists():
                if not volume.writable_source:
                    raise ConfigError(f"volumeMount {mount['mountPath']!r}: subPath {sub_path!r} does not exist")
                source.mkdir(mode=EMPTY_DIR_MODE, parents=True)
        readonly = bool(mount.get("readOnly")) or volume.read_only
        mounts.append(Mount(str(source), mount["mountPath"], readonly))
    return mounts


def _projection(
    pod: Mapping[str, Any],
    volume: Mapping[str, Any],
    kind: str,
    files: Files,
    token: TokenSource,
    pod_ip: str,
    host_ip: str,
) -> dict[str, tuple[bytes, int]]:
    spec = volume[kind] or {}
    default = spec.get("defaultMode", DEFAULT_MODE)
    where = f"volume {volume['name']!r}"
    if kind == "configMap":
        return _object_files(files, "configmap", spec.get("name", ""), spec, default, where)
    if kind == "secret":
        return _object_files(files, "secret", spec.get("secretName", ""), spec, default, where)
    if kind == "downwardAPI":
        return _downward_files(pod, spec.get("items") or [], default, pod_ip, host_ip, where)
    content: dict[str, tuple[bytes, int]] = {}
    for source in spec.get("sources") or []:
        if "serviceAccountToken" in source:
            request = source["serviceAccountToken"]
            value = token(request.get("audience"), int(request.get("expirationSeconds", 3600)))
            content[request["path"]] = (value.encode(), default)
        elif "configMap" in source:
            ref = source["configMap"]
            content.update(_object_files(files, "configmap", ref.get("name", ""), ref, default, where))
        elif "secret" in source:
            ref = source["secret"]
            content.update(_object_files(files, "secret", ref.get("name", ""), ref, default, where))
        elif "downwardAPI" in source:
            items = source["downwardAPI"].get("items") or []
            content.update(_downward_files(pod, items, default, pod_ip, host_ip, where))
        else:
            raise ConfigError(f"{where}: projected source {sorted(source)} is not supported by the process node")
    return content


def _object_files(
    files: Files, kind: str, name: str, spec: Mapping[str, Any], default: int, where: str
) -> dict[str, tuple[bytes, int]]:
    data = files(kind, name)
    optional = bool(spec.get("optional"))
    if data is None:
        if optional:
            return {}
        raise ConfigError(f"{where}: {kind} {name!r} not found")
    items = spec.get("items")
    if not items:
        return {key: (value, default) for key, value in data.items()}
    content = {}
    for item in items:
        if item["key"] not in data:
            if optional:
                continue
            raise ConfigError(f"{where}: key {item['key']!r} not found in {kind} {name!r}")
        content[item["path"]] = (data[item["key"]], item.get("mode", default))
    return content


def _downward_files(
    pod: Mapping[str, Any], items: list[Mapping[str, Any]], default: int, pod_ip: str, host_ip: str, where: str
) -> dict[str, tuple[bytes, int]]:
    content = {}
    for item in items:
        if "fieldRef" not in item:
            raise ConfigError(f"{where}: only fieldRef items are supported by the process node ({item['path']!r})")
        value = field_value(pod, item["fieldRef"]["fieldPath"], pod_ip, host_ip)
        content[item["path"]] = (value.encode(), item.get("mode", default))
    return content


def _write_files(directory: Path, content: Mapping[str, tuple[bytes, int]]) -> None:
    # Written afresh at every pod start; no ..data symlink swap, nothing updates them later.
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for relative, (data, mode) in content.items():
        path = _inside(directory, relative, "file path")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)


def _inside(directory: Path, relative: str, what: str) -> Path:
    if os.path.isabs(relative) or ".." in Path(relative).parts:
        raise ConfigError(f"{what} {relative!r} must be relative and stay inside the volume")
    return directory / relative


def _host_path(name: str, spec: Mapping[str, Any]) -> Path:
    path = Path(spec["path"])
    kind = spec.get("type") or ""
    if kind == "DirectoryOrCreate":
        path.mkdir(mode=0o755, parents=True, exist_ok=True)
    elif kind == "FileOrCreate":
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        path.touch(mode=0o644)
    checks: dict[str, Callable[[], bool]] = {
        "Directory": path.is_dir,
        "DirectoryOrCreate": path.is_dir,
        "File": path.is_file,
        "FileOrCreate": path.is_file,
        "Socket": path.is_socket,
        "CharDevice": path.is_char_device,
        "BlockDevice": path.is_block_device,
    }
    if kind in checks and not checks[kind]():
        raise ConfigError(f"volume {name!r}: hostPath {path} is not a {kind}")
    if not kind and not path.exists():
        # An unset type mounts whatever is there; a bind mount needs something.
        path.mkdir(mode=0o755, parents=True)
    return path
