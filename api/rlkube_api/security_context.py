"""The securityContexts a pod template may add to the trainer's pods (`podSecurityContext`,
`securityContext`), as Kubernetes declares them, and what cannot combine with the operator's own.

The operator's pods meet the restricted Pod Security Standard
(`rlkube_operator/children/statefulset.py`): the trainer container sets
`allowPrivilegeEscalation: false`, drops every capability, runs as non-root with the runtime's
seccomp profile. A template's keys are merged over those one by one, so a setting the API
server refuses beside them (`privileged: true` while privilege escalation stays off, an added
CAP_SYS_ADMIN, root while runAsNonRoot stays true) is refused here, at `kubectl apply`, naming
the field and what to set beside it, rather than when the StatefulSet is applied. An unknown
key or a wrong type is refused the same way. Each template is judged on its own: set the
settings that go together in the same template.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from rlkube_api.base import ApiModel, CelRule


class SELinuxOptions(ApiModel):
    """SELinux labels of the containers."""

    level: str | None = Field(None, max_length=253, description="Level label.")
    role: str | None = Field(None, max_length=253, description="Role label.")
    type: str | None = Field(None, max_length=253, description="Type label.")
    user: str | None = Field(None, max_length=253, description="User label.")


class _Profile(ApiModel):
    """A profile the kubelet applies by name: the runtime's default, none, or one on the node."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "self.type == 'Localhost' ? has(self.localhostProfile) : !has(self.localhostProfile)",
            "localhostProfile is set exactly when type is Localhost",
            ".localhostProfile",
        ),
    )

    type: Literal["RuntimeDefault", "Unconfined", "Localhost"] = Field(description="Which profile.")


class SeccompProfile(_Profile):
    """The seccomp profile the containers run under."""

    localhost_profile: str | None = Field(None, max_length=4096, description="Path of a Localhost profile.")


class AppArmorProfile(_Profile):
    """The AppArmor profile the containers run under."""

    localhost_profile: str | None = Field(None, max_length=4096, description="Name of a Localhost profile.")


class WindowsSecurityContextOptions(ApiModel):
    """Windows-specific settings (Windows nodes only)."""

    gmsa_credential_spec_name: str | None = Field(None, max_length=253, description="GMSA credential spec name.")
    gmsa_credential_spec: str | None = Field(None, max_length=65536, description="GMSA credential spec.")
    run_as_user_name: str | None = Field(None, max_length=256, description="User name.")
    host_process: bool | None = Field(None, description="Run as a host process container.")


class Capabilities(ApiModel):
    """Linux capabilities added to or dropped from the container's."""

    add: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        None, max_length=64, description="Capabilities to add (e.g. IPC_LOCK for RDMA)."
    )
    drop: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        None, max_length=64, description="Capabilities to drop (the operator drops ALL)."
    )


def _adds(capability: str) -> str:
    return (
        "has(self.capabilities) && has(self.capabilities.add) && "
        f"self.capabilities.add.exists(c, c == '{capability}' || c == 'CAP_{capability}')"
    )


# Set on every trainer container by the operator; a template overrides them key by key.
_ESCALATION_ALLOWED = "has(self.allowPrivilegeEscalation) && self.allowPrivilegeEscalation"
_ROOT_ALLOWED = "has(self.runAsNonRoot) && !self.runAsNonRoot"


class ContainerSecurityContext(ApiModel):
    """The trainer container's securityContext (a Kubernetes SecurityContext), merged key by key
    over the operator's (allowPrivilegeEscalation false, capabilities drop ALL, runAsNonRoot,
    seccompProfile RuntimeDefault)."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            f"!(has(self.privileged) && self.privileged) || {_ESCALATION_ALLOWED}",
            "true cannot combine with the operator's allowPrivilegeEscalation: false; set "
            "allowPrivilegeEscalation: true beside it (refused where the restricted Pod Security Standard is enforced)",
            ".privileged",
        ),
        CelRule(
            f"!({_adds('SYS_ADMIN')}) || {_ESCALATION_ALLOWED}",
            "SYS_ADMIN cannot combine with the operator's allowPrivilegeEscalation: false; set "
            "allowPrivilegeEscalation: true beside it",
            ".capabilities.add",
        ),
        CelRule(
            f"!(has(self.runAsUser) && self.runAsUser == 0) || {_ROOT_ALLOWED}",
            "0 (root) cannot combine with the operator's runAsNonRoot: true; set runAsNonRoot: false "
            "beside it (refused where the restricted Pod Security Standard is enforced)",
            ".runAsUser",
        ),
    )

    allow_privilege_escalation: bool | None = Field(
        None, description="Whether a process may gain more privileges than its parent (the operator: false)."
    )
    app_armor_profile: AppArmorProfile | None = Field(None, description="AppArmor profile.")
    capabilities: Capabilities | None = Field(None, description="Capabilities (the operator drops ALL).")
    privileged: bool | None = Field(None, description="Run privileged (needs allowPrivilegeEscalation: true).")
    proc_mount: Literal["Default", "Unmasked"] | None = Field(None, description="The /proc mount type.")
    read_only_root_filesystem: bool | None = Field(None, description="A read-only root filesystem.")
    run_as_group: int | None = Field(None, ge=0, le=2147483647, description="Group id of the process.")
    run_as_non_root: bool | None = Field(None, description="Refuse to start as root (the operator: true).")
    run_as_user: int | None = Field(None, ge=0, le=2147483647, description="User id of the process.")
    se_linux_options: SELinuxOptions | None = Field(None, description="SELinux labels.")
    seccomp_profile: SeccompProfile | None = Field(None, description="Seccomp profile (the operator: RuntimeDefault).")
    windows_options: WindowsSecurityContextOptions | None = Field(None, description="Windows settings.")


class Sysctl(ApiModel):
    """A namespaced kernel parameter of the pod."""

    name: str = Field(min_length=1, max_length=253, description="Parameter name.")
    value: str = Field(max_length=1024, description="Its value.")


class PodSecurityContext(ApiModel):
    """The pod's securityContext (a Kubernetes PodSecurityContext), merged key by key over the
    operator's (runAsNonRoot, seccompProfile RuntimeDefault, fsGroup 1000, fsGroupChangePolicy
    OnRootMismatch)."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            f"!(has(self.runAsUser) && self.runAsUser == 0) || {_ROOT_ALLOWED}",
            "0 (root) cannot combine with the operator's runAsNonRoot: true; set runAsNonRoot: false "
            "beside it (refused where the restricted Pod Security Standard is enforced)",
            ".runAsUser",
        ),
    )

    app_armor_profile: AppArmorProfile | None = Field(None, description="AppArmor profile.")
    fs_group: int | None = Field(None, ge=0, le=2147483647, description="Group given to the pod's volumes.")
    fs_group_change_policy: Literal["OnRootMismatch", "Always"] | None = Field(
        None, description="When the volumes' group is changed."
    )
    run_as_group: int | None = Field(None, ge=0, le=2147483647, description="Group id of the processes.")
    run_as_non_root: bool | None = Field(None, description="Refuse to start as root (the operator: true).")
    run_as_user: int | None = Field(None, ge=0, le=2147483647, description="User id of the processes.")
    se_linux_change_policy: Literal["MountOption", "Recursive"] | None = Field(
        None, description="How SELinux labels reach the volumes."
    )
    se_linux_options: SELinuxOptions | None = Field(None, description="SELinux labels.")
    seccomp_profile: SeccompProfile | None = Field(None, description="Seccomp profile (the operator: RuntimeDefault).")
    supplemental_groups: list[Annotated[int, Field(ge=0, le=2147483647)]] | None = Field(
        None, max_length=64, description="More groups of the processes."
    )
    supplemental_groups_policy: Literal["Merge", "Strict"] | None = Field(
        None, description="How supplementalGroups combine with the image's."
    )
    sysctls: list[Sysctl] | None = Field(None, max_length=64, description="Namespaced kernel parameters.")
    windows_options: WindowsSecurityContextOptions | None = Field(None, description="Windows settings.")
