"""Kubernetes volume sources as an RLJob holds them (spec.volumes' `source`,
checkpoint.volume, podTemplate volumes), checked at admission with the core API's
rules where a mistake would otherwise surface only when a pod is created or
started: exactly one source, and the names, keys, paths and modes of the sources
jobs use most (configMap, secret, persistentVolumeClaim, emptyDir, hostPath).
The other sources are passed through as written; the API server checks them when
the operator creates the StatefulSets.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import Field

from rlkube_api.base import ApiModel, CelRule
from rlkube_api.kube_syntax import CONFIG_MAP_KEY, ITEM_PATH, LONG_NAME, NO_BACKSTEPS_PATH

# Every source of core/v1 VolumeSource, by its JSON name.
SOURCES = (
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "gitRepo",
    "glusterfs",
    "hostPath",
    "image",
    "iscsi",
    "nfs",
    "persistentVolumeClaim",
    "photonPersistentDisk",
    "portworxVolume",
    "projected",
    "quobyte",
    "rbd",
    "scaleIO",
    "secret",
    "storageos",
    "vsphereVolume",
)
# A volume's items: as many as a ConfigMap may hold keys in practice; a path as long as others.
MAX_ITEMS = 256
MAX_ITEM_PATH = 4096
# A file mode: the core API accepts 0 to 0777 (octal), written in YAML as an integer.
FILE_MODE_MAX = 0o777
HostPathType = Literal[
    "", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice"
]

Passed = dict[str, Any] | None


class KeyToPath(ApiModel):
    """One key of a ConfigMap or Secret, projected to a file of the volume."""

    # Schema patterns, not CEL (KubeString's way): a CEL rule here repeats for every item of every
    # volume of every pod template, past the API server's cost budget for the whole schema.
    key: str = Field(
        min_length=1,
        max_length=CONFIG_MAP_KEY.max_length,
        pattern=CONFIG_MAP_KEY.regex,
        description="The key: " + CONFIG_MAP_KEY.what + ".",
    )
    path: str = Field(
        min_length=1,
        max_length=MAX_ITEM_PATH,
        pattern=ITEM_PATH.regex,
        description="The file, relative to the volume's root: " + ITEM_PATH.what + ".",
    )
    mode: int | None = Field(None, ge=0, le=FILE_MODE_MAX, description="The file's mode (0 to 0777).")


class _KeysAsFiles(ApiModel):
    """What configMap and secret volumes share: which keys, at which paths, with which mode."""

    items: list[KeyToPath] | None = Field(None, max_length=MAX_ITEMS, description="Only these keys, at these paths.")
    default_mode: int | None = Field(None, ge=0, le=FILE_MODE_MAX, description="The files' mode (0 to 0777).")
    optional: bool | None = Field(None, description="Start even when the object or a key is missing.")


class ConfigMapSource(_KeysAsFiles):
    """A ConfigMap's keys as files."""

    name: Annotated[str, LONG_NAME] = Field(min_length=1, max_length=253, description="The ConfigMap.")


class SecretSource(_KeysAsFiles):
    """A Secret's keys as files."""

    secret_name: Annotated[str, LONG_NAME] = Field(min_length=1, max_length=253, description="The Secret.")


class ClaimSource(ApiModel):
    """A PersistentVolumeClaim in the job's namespace."""

    claim_name: Annotated[str, LONG_NAME] = Field(
        min_length=1, max_length=253, description="The PersistentVolumeClaim."
    )
    read_only: bool | None = Field(None, description="Mount the claim read-only.")


class EmptyDirSource(ApiModel):
    """A directory that lives as long as the pod."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "!has(self.sizeLimit) || isQuantity(self.sizeLimit) && !quantity('0').isGreaterThan(quantity(self.sizeLimit))",
            "sizeLimit must be a quantity of at least 0, e.g. 10Gi",
            ".sizeLimit",
        ),
    )

    medium: str | None = Field(
        None,
        max_length=64,
        pattern="^(|Memory|HugePages|HugePages-.+)$",
        description="Empty (the node's disk), Memory (tmpfs), HugePages or HugePages-SIZE.",
    )
    size_limit: str | None = Field(None, max_length=64, description="The most it may hold, e.g. 10Gi.")


class HostPathSource(ApiModel):
    """A path of the node (refused by the restricted Pod Security Standard)."""

    path: Annotated[str, NO_BACKSTEPS_PATH] = Field(min_length=1, max_length=4096, description="The node's path.")
    type: HostPathType | None = Field(
        None, description="What must be there: " + ", ".join(t for t in get_args(HostPathType) if t) + "."
    )


class VolumeSource(ApiModel):
    """One Kubernetes volume source: configMap, secret, persistentVolumeClaim, emptyDir and hostPath
    are checked here; the others are passed through to the pods as written."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "[" + ", ".join(f"has(self.{s})" for s in SOURCES) + "].filter(x, x).size() == 1",
            "exactly one volume source must be set: " + ", ".join(SOURCES),
        ),
    )

    config_map: ConfigMapSource | None = Field(None, description="A ConfigMap's keys as files.")
    secret: SecretSource | None = Field(None, description="A Secret's keys as files.")
    persistent_volume_claim: ClaimSource | None = Field(None, description="A PersistentVolumeClaim.")
    empty_dir: EmptyDirSource | None = Field(None, description="A directory that lives as long as the pod.")
    host_path: HostPathSource | None = Field(None, description="A path of the node.")
    aws_elastic_block_store: Passed = Field(None, description="Passed through.")
    azure_disk: Passed = Field(None, description="Passed through.")
    azure_file: Passed = Field(None, description="Passed through.")
    cephfs: Passed = Field(None, description="Passed through.")
    cinder: Passed = Field(None, description="Passed through.")
    csi: Passed = Field(None, description="Passed through.")
    downward_api: Passed = Field(None, alias="downwardAPI", description="Passed through.")
    ephemeral: Passed = Field(None, description="Passed through.")
    fc: Passed = Field(None, description="Passed through.")
    flex_volume: Passed = Field(None, description="Passed through.")
    flocker: Passed = Field(None, description="Passed through.")
    gce_persistent_disk: Passed = Field(None, description="Passed through.")
    git_repo: Passed = Field(None, description="Passed through.")
    glusterfs: Passed = Field(None, description="Passed through.")
    image: Passed = Field(None, description="Passed through.")
    iscsi: Passed = Field(None, description="Passed through.")
    nfs: Passed = Field(None, description="Passed through.")
    photon_persistent_disk: Passed = Field(None, description="Passed through.")
    portworx_volume: Passed = Field(None, description="Passed through.")
    projected: Passed = Field(None, description="Passed through.")
    quobyte: Passed = Field(None, description="Passed through.")
    rbd: Passed = Field(None, description="Passed through.")
    scale_io: Passed = Field(None, alias="scaleIO", description="Passed through.")
    storageos: Passed = Field(None, description="Passed through.")
    vsphere_volume: Passed = Field(None, description="Passed through.")

    def to_pod(self) -> dict[str, Any]:
        """The source as a pod's volume writes it: {sourceName: {...}}."""
        return self.to_wire()
