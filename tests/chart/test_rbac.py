"""The operator's RBAC: the rendered rules are exactly the contract in chart_kit
(JOB_RULES), with no wildcard; namespaced mode puts them in a Role per watched
namespace and nowhere cluster-wide; and, against the real API server's
authorizer, the installed ServiceAccount may do every one of those things and
none of a list of things beyond them."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import pytest
from kubernetes.client import (
    ApiClient,
    AuthorizationV1Api,
    V1ResourceAttributes,
    V1SubjectAccessReview,
    V1SubjectAccessReviewSpec,
)

from rlkube_e2e.testing import Kubectl
from tests.chart.chart_kit import (
    CLUSTER_RUNTIME_PERMISSIONS,
    JOB_PERMISSIONS,
    NAMESPACE_OBSERVATION_PERMISSIONS,
    OBSERVATION_PERMISSIONS,
    Helm,
    Obj,
    Permission,
    Release,
    installed,
    of_kind,
    one,
    permissions_of,
    release_name,
    scratch_namespaces,
)

RBAC_KINDS = ("ClusterRole", "Role")
NAMESPACED = "watchNamespaces={team-a,team-b}"


def _leader_election(obj: Obj) -> bool:
    """The Role (and binding) for the Lease, checked on its own: its rules name the Lease."""
    return str(obj["metadata"]["name"]).endswith("-leader-election")


def _rules_bound_to(objects: list[Obj], account: Obj) -> dict[tuple[str, str | None], list[Obj]]:
    """(kind, namespace) of each bound (Cluster)Role -> its rules, for bindings naming the
    account; the leader election Role aside."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects}
    bound: dict[tuple[str, str | None], list[Obj]] = {}
    bindings = of_kind(objects, "RoleBinding") + of_kind(objects, "ClusterRoleBinding")
    for binding in [b for b in bindings if not _leader_election(b)]:
        subjects = binding["subjects"]
        assert subjects == [
            {
                "kind": "ServiceAccount",
                "name": account["metadata"]["name"],
                "namespace": account["metadata"]["namespace"],
            }
        ]
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        role = roles[(ref["kind"], namespace, ref["name"])]
        bound.setdefault((ref["kind"], namespace), []).extend(role["rules"])
    return bound


@pytest.mark.parametrize("sets", [(), (NAMESPACED,), ("rbac.kopfObservation=false",)])
def test_no_rule_has_a_wildcard(helm: Helm, sets: tuple[str, ...]) -> None:
    for role in [o for o in helm.template(*sets) if o["kind"] in RBAC_KINDS]:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert "*" not in rule.get(field, []), (role["metadata"]["name"], rule)
            assert all("*" not in r for r in rule["resources"]), rule  # no "pods/*" either


def test_cluster_wide_grants_exactly_the_contract(helm: Helm) -> None:
    objects = helm.template()
    assert not [r for r in of_kind(objects, "Role") if not _leader_election(r)]
    bound = _rules_bound_to(objects, one(objects, "ServiceAccount"))
    assert set(bound) == {("ClusterRole", None)}
    expected = JOB_PERMISSIONS | OBSERVATION_PERMISSIONS | CLUSTER_RUNTIME_PERMISSIONS
    assert permissions_of(bound[("ClusterRole", None)]) == expected
    # kopf runs standalone: no peering objects, no Namespaces when watching everything.
    assert not any(group in ("kopf.dev", "zalando.org") for group, _, _ in permissions_of(bound[("ClusterRole", None)]))


def test_namespaced_mode_grants_the_contract_only_in_watched_namespaces(helm: Helm) -> None:
    objects = helm.template(NAMESPACED)
    bound = _rules_bound_to(objects, one(objects, "ServiceAccount"))
    assert set(bound) == {("Role", "team-a"), ("Role", "team-b"), ("ClusterRole", None)}
    for namespace in ("team-a", "team-b"):
        assert permissions_of(bound[("Role", namespace)]) == JOB_PERMISSIONS
    # The ClusterRoles are kopf's read-only observation and the cluster runtimes' reading:
    # nothing of the jobs' resources.
    cluster_wide = permissions_of(bound[("ClusterRole", None)])
    assert cluster_wide == OBSERVATION_PERMISSIONS | NAMESPACE_OBSERVATION_PERMISSIONS | CLUSTER_RUNTIME_PERMISSIONS
    assert not {resource for _, resource, _ in cluster_wide} & {resource for _, resource, _ in JOB_PERMISSIONS}


def test_namespaced_mode_without_observation_reads_only_cluster_runtimes_cluster_wide(helm: Helm) -> None:
    objects = helm.template(NAMESPACED, "rbac.kopfObservation=false")
    assert permissions_of(r for role in of_kind(objects, "ClusterRole") for r in role["rules"]) == (
        CLUSTER_RUNTIME_PERMISSIONS
    )
    assert len(of_kind(objects, "ClusterRoleBinding")) == 1
    job_roles = [r for r in of_kind(objects, "Role") if not _leader_election(r)]
    assert sorted(r["metadata"]["namespace"] for r in job_roles) == ["team-a", "team-b"]


LEASE_RULES = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": ["rlkube-leader"],
        "verbs": ["get", "update"],
    },
]


@pytest.mark.parametrize("sets", [(), (NAMESPACED,)])
def test_leader_election_may_touch_only_its_lease_in_the_release_namespace(helm: Helm, sets: tuple[str, ...]) -> None:
    objects = helm.template(*sets)
    role = one([r for r in of_kind(objects, "Role") if _leader_election(r)], "Role")
    assert role["metadata"]["namespace"] == "rlkube-system"
    assert role["rules"] == LEASE_RULES
    binding = one([b for b in of_kind(objects, "RoleBinding") if _leader_election(b)], "RoleBinding")
    assert binding["metadata"]["namespace"] == "rlkube-system"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == one(objects, "ServiceAccount")["metadata"]["name"]


def test_no_lease_permission_without_leader_election(helm: Helm) -> None:
    objects = helm.template("leaderElection.enabled=false", "replicaCount=1")
    assert not [o for o in objects if _leader_election(o)]


def test_rbac_can_be_left_to_the_cluster_admin(helm: Helm) -> None:
    kinds = {o["kind"] for o in helm.template("rbac.create=false")}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    assert "Deployment" in kinds


def test_the_readme_table_is_the_contract() -> None:
    from tests.chart.chart_kit import CHART, JOB_RULES  # noqa: PLC0415

    readme = (CHART / "README.md").read_text()
    for group, resources, verbs in JOB_RULES:
        group_cell = f"`{group}`" if group else '`""`'
        resource_cells = ", ".join(f"`{r}`" for r in resources)
        row = f"| {group_cell} | {resource_cells} | {', '.join(verbs)} |"
        assert row in readme, f"README's RBAC table lacks or differs from: {row}"


# --- against the API server's authorizer ----------------------------------------------------------

# Beyond the contract: each must be denied everywhere.
DENIED: tuple[Permission, ...] = (
    ("rlkube.dev", "rljobs", "create"),
    ("rlkube.dev", "rljobs", "update"),
    ("rlkube.dev", "rljobs", "patch"),
    ("rlkube.dev", "rljobs", "delete"),
    ("rlkube.dev", "rljobs", "deletecollection"),
    ("rlkube.dev", "rljobs/status", "update"),
    ("", "pods", "create"),
    ("", "pods", "update"),
    ("", "pods/exec", "create"),
    ("", "pods/log", "get"),
    ("", "pods/status", "patch"),
    ("", "secrets", "get"),
    ("", "secrets", "patch"),
    ("", "secrets", "update"),
    ("", "secrets", "watch"),
    ("", "secrets", "list"),
    ("", "configmaps", "watch"),
    ("", "configmaps", "update"),
    ("", "persistentvolumeclaims", "create"),
    ("", "persistentvolumeclaims", "list"),
    ("", "persistentvolumeclaims", "patch"),
    ("apps", "deployments", "create"),
    ("apps", "statefulsets", "update"),
    ("batch", "jobs", "create"),
    ("rbac.authorization.k8s.io", "roles", "escalate"),
    ("rbac.authorization.k8s.io", "roles", "bind"),
    ("rbac.authorization.k8s.io", "rolebindings", "update"),
    ("", "events", "patch"),
    ("*", "*", "*"),
)
# Cluster-scoped: denied in every mode.
DENIED_CLUSTER_SCOPED: tuple[Permission, ...] = (
    ("", "nodes", "list"),
    ("", "namespaces", "delete"),
    ("", "namespaces", "create"),
    ("rbac.authorization.k8s.io", "clusterroles", "create"),
    ("rbac.authorization.k8s.io", "clusterrolebindings", "create"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "create"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "get"),
    ("kopf.dev", "clusterkopfpeerings", "list"),
)


def allowed(api: ApiClient, release: Release, permission: Permission, namespace: str | None) -> bool:
    """What `kubectl auth can-i --as=system:serviceaccount:<ns>:<sa>` asks (a
    SubjectAccessReview, groups included), without a kubectl process per question."""
    group, resource, verb = permission
    resource, _, subresource = resource.partition("/")
    review = V1SubjectAccessReview(
        spec=V1SubjectAccessReviewSpec(
            user=release.user,
            groups=["system:serviceaccounts", f"system:serviceaccounts:{release.namespace}", "system:authenticated"],
            resource_attributes=V1ResourceAttributes(
                group=group, resource=resource, subresource=subresource or None, verb=verb, namespace=namespace
            ),
        )
    )
    status = AuthorizationV1Api(api).create_subject_access_review(review).status
    assert status is not None
    return bool(status.allowed)


def denied(api: ApiClient, release: Release, permissions: set[Permission], namespace: str | None) -> list[Permission]:
    return [p for p in sorted(permissions) if not allowed(api, release, p, namespace)]


def granted(api: ApiClient, release: Release, permissions: Iterable[Permission], namespace: str | None) -> list[Obj]:
    return [
        {"permission": p, "namespace": namespace} for p in sorted(permissions) if allowed(api, release, p, namespace)
    ]


@pytest.fixture(scope="module")
def cluster_wide(cluster_helm: Helm, kubectl: Kubectl) -> Iterator[tuple[Release, str]]:
    """A cluster-wide release, and a namespace of its own with nothing in it."""
    stem = release_name()
    with (
        scratch_namespaces(kubectl, f"{stem}-system", f"{stem}-jobs") as (system, jobs),
        installed(cluster_helm, kubectl, system) as release,
    ):
        yield release, jobs


@pytest.fixture(scope="module")
def namespaced(cluster_helm: Helm, kubectl: Kubectl) -> Iterator[tuple[Release, tuple[str, str], str]]:
    """A release watching two namespaces, and a third namespace it does not watch."""
    stem = release_name()
    names = (f"{stem}-system", f"{stem}-a", f"{stem}-b", f"{stem}-other")
    with (
        scratch_namespaces(kubectl, *names) as (system, a, b, other),
        installed(cluster_helm, kubectl, system, f"watchNamespaces={{{a},{b}}}") as release,
    ):
        yield release, (a, b), other


@pytest.mark.cluster
def test_cluster_wide_sa_may_do_everything_the_operator_does_in_any_namespace(
    kube: ApiClient, cluster_wide: tuple[Release, str]
) -> None:
    release, jobs = cluster_wide
    for namespace in (jobs, "default"):
        assert not denied(kube, release, JOB_PERMISSIONS, namespace), namespace
    # A cluster-wide list/watch (namespace unset) is what kopf does for RLJobs, pods and StatefulSets.
    watched = {p for p in JOB_PERMISSIONS if p[2] in ("list", "watch")}
    assert not denied(kube, release, watched | OBSERVATION_PERMISSIONS | CLUSTER_RUNTIME_PERMISSIONS, None)


@pytest.mark.cluster
def test_cluster_wide_sa_may_do_nothing_beyond(kube: ApiClient, cluster_wide: tuple[Release, str]) -> None:
    release, jobs = cluster_wide
    beyond = granted(kube, release, DENIED, jobs) + granted(kube, release, DENIED_CLUSTER_SCOPED, None)
    # Watching every namespace needs no look at Namespaces themselves (kopf skips them).
    beyond += granted(kube, release, NAMESPACE_OBSERVATION_PERMISSIONS, None)
    assert not beyond, f"granted beyond the contract: {beyond}"


@pytest.mark.cluster
def test_namespaced_sa_may_do_everything_the_operator_does_in_watched_namespaces(
    kube: ApiClient, namespaced: tuple[Release, tuple[str, str], str]
) -> None:
    release, watched, _ = namespaced
    for namespace in watched:
        assert not denied(kube, release, JOB_PERMISSIONS, namespace), namespace
    cluster_scoped = OBSERVATION_PERMISSIONS | NAMESPACE_OBSERVATION_PERMISSIONS | CLUSTER_RUNTIME_PERMISSIONS
    assert not denied(kube, release, cluster_scoped, None)


@pytest.mark.cluster
def test_namespaced_sa_may_do_nothing_elsewhere(
    kube: ApiClient, namespaced: tuple[Release, tuple[str, str], str]
) -> None:
    release, watched, other = namespaced
    beyond = [g for namespace in watched for g in granted(kube, release, DENIED, namespace)]
    # None of the operator's own permissions outside the watched namespaces: not in
    # another namespace, not its own, not across all of them (namespace unset).
    for namespace in (other, release.namespace, None):
        beyond += granted(kube, release, JOB_PERMISSIONS, namespace)
    beyond += granted(kube, release, DENIED_CLUSTER_SCOPED, None)
    assert not beyond, f"granted beyond the contract: {beyond}"


def _may_on_lease(api: ApiClient, release: Release, verb: str, namespace: str, name: str | None) -> bool:
    review = V1SubjectAccessReview(
        spec=V1SubjectAccessReviewSpec(
            user=release.user,
            groups=["system:serviceaccounts", f"system:serviceaccounts:{release.namespace}", "system:authenticated"],
            resource_attributes=V1ResourceAttributes(
                group="coordination.k8s.io", resource="leases", verb=verb, namespace=namespace, name=name
            ),
        )
    )
    status = AuthorizationV1Api(api).create_subject_access_review(review).status
    assert status is not None
    return bool(status.allowed)


@pytest.mark.cluster
def test_the_sa_may_renew_its_own_lease_and_no_other(kube: ApiClient, cluster_wide: tuple[Release, str]) -> None:
    release, jobs = cluster_wide
    lease = f"{release.service_account}-leader"  # the release's full name + "-leader"
    assert _may_on_lease(kube, release, "create", release.namespace, None)
    for verb in ("get", "update"):
        assert _may_on_lease(kube, release, verb, release.namespace, lease), verb
        assert not _may_on_lease(kube, release, verb, release.namespace, "someone-elses-lease"), verb
        assert not _may_on_lease(kube, release, verb, jobs, lease), verb
    assert not _may_on_lease(kube, release, "delete", release.namespace, lease)
    assert not _may_on_lease(kube, release, "list", release.namespace, None)


# What every authenticated user may do (system:basic-user, system:discovery, system:public-info-viewer):
# `kubectl auth can-i --list` shows these too; they are not the operator's.
EVERYONE = frozenset(
    {
        ("authentication.k8s.io", "selfsubjectreviews", "create"),
        ("authorization.k8s.io", "selfsubjectaccessreviews", "create"),
        ("authorization.k8s.io", "selfsubjectrulesreviews", "create"),
    }
)


def can_i_list(kubectl: Kubectl, release: Release, namespace: str) -> set[Permission]:
    """`kubectl auth can-i --list` as the operator's ServiceAccount: its resource permissions
    in `namespace`, as (apiGroup, resource, verb)."""
    result = kubectl("auth", "can-i", "--list", f"--as={release.user}", "-n", namespace)
    found: set[Permission] = set()
    for line in result.stdout.splitlines()[1:]:  # after the header
        # Resources, Non-Resource URLs, Resource Names, Verbs; the last three in brackets.
        resource, lists = line.split()[0], re.findall(r"\[([^\]]*)\]", line)
        verbs = lists[-1].split() if lists else []
        if resource.startswith("[") or not verbs:  # a non-resource URL's row
            continue
        # e.g. rljobs.rlkube.dev/status -> ("rlkube.dev", "rljobs/status")
        qualified, _, subresource = resource.partition("/")
        name, _, group = qualified.partition(".")
        name += f"/{subresource}" if subresource else ""
        found |= {(group, name, verb) for verb in verbs}
    return found


@pytest.mark.cluster
def test_can_i_list_as_the_operator_shows_exactly_the_contract(
    kubectl: Kubectl, cluster_wide: tuple[Release, str]
) -> None:
    """The operator's permissions as a user would list them, cluster-wide mode, in a namespace of jobs."""
    release, jobs = cluster_wide
    listed = can_i_list(kubectl, release, jobs) - EVERYONE
    assert listed == JOB_PERMISSIONS | OBSERVATION_PERMISSIONS | CLUSTER_RUNTIME_PERMISSIONS


@pytest.mark.cluster
def test_can_i_list_as_the_operator_in_an_unwatched_namespace_shows_nothing_of_the_jobs(
    kubectl: Kubectl, namespaced: tuple[Release, tuple[str, str], str]
) -> None:
    release, watched, other = namespaced
    cluster_scoped = OBSERVATION_PERMISSIONS | NAMESPACE_OBSERVATION_PERMISSIONS | CLUSTER_RUNTIME_PERMISSIONS
    assert can_i_list(kubectl, release, watched[0]) - EVERYONE == JOB_PERMISSIONS | cluster_scoped
    assert can_i_list(kubectl, release, other) - EVERYONE == cluster_scoped
