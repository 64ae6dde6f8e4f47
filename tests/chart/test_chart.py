"""The chart without a cluster: helm lint, the values schema, and the rendered
Deployment, Service and monitors checked against the operator's own code (its
command-line parser, its ports, the labels it puts on trainer pods)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from rlkube_api.names import CONTROLLER_ROLE, LABEL_MANAGED_BY, LABEL_ROLE, MANAGED_BY
from rlkube_operator.__main__ import parse_args
from rlkube_operator.children.statefulset import container_ports
from tests.chart.chart_kit import CHART, Helm, Obj, container, of_kind, one

MONITORS = ("metrics.serviceMonitor.enabled=true", "trainerMetrics.podMonitor.enabled=true")


@pytest.mark.parametrize("strict", [False, True], ids=["lint", "lint-strict"])
@pytest.mark.parametrize(
    "sets", [(), ("watchNamespaces={team-a,team-b}", *MONITORS)], ids=["defaults", "namespaced-with-monitors"]
)
def test_helm_lint_passes(helm: Helm, strict: bool, sets: tuple[str, ...]) -> None:
    args = ["lint", str(CHART), *(["--strict"] if strict else [])]
    for value in sets:
        args += ["--set", value]
    result = helm(*args, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_crds_directory_holds_only_the_generated_crds() -> None:
    # Helm installs crds/ verbatim on first install; the files are `rlkube_api.crd --write`'s output.
    from rlkube_api.crd import CRD_FILES, RUNTIME_CRD_FILES  # noqa: PLC0415

    assert sorted(p.name for p in (CHART / "crds").iterdir()) == ["rljob.yaml", "rljobruntimes.yaml"]
    assert (CHART / "crds" / "rljob.yaml").read_text() == CRD_FILES[0].read_text()
    assert (CHART / "crds" / "rljobruntimes.yaml").read_text() == RUNTIME_CRD_FILES[0].read_text()


def test_the_default_runtime_is_the_trainer_image_and_the_shared_claim(helm: Helm) -> None:
    runtime = one(helm.template(), "ClusterRLJobRuntime")
    assert runtime["metadata"]["name"] == "default"
    template = runtime["spec"]["template"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert template["image"] == f"rlkube-trainer:{chart['appVersion']}"
    assert template["volumes"] == [
        {"name": "work", "mountPath": "/rlkube", "source": {"persistentVolumeClaim": {"claimName": "rlkube-work"}}}
    ]
    assert "locked" not in runtime["spec"]


def test_the_default_runtime_takes_image_pools_and_locks_from_values_or_is_off(helm: Helm) -> None:
    pool = "defaultRuntime.template.roles.rollout.pool.nodeSelector.pool=rollout"
    runtime = one(
        helm.template("defaultRuntime.template.image=trainer:1", pool, "defaultRuntime.locked={image}"),
        "ClusterRLJobRuntime",
    )
    assert runtime["spec"]["template"]["image"] == "trainer:1"
    assert runtime["spec"]["template"]["roles"] == {"rollout": {"pool": {"nodeSelector": {"pool": "rollout"}}}}
    assert runtime["spec"]["locked"] == ["image"]
    assert not of_kind(helm.template("defaultRuntime.enabled=false"), "ClusterRLJobRuntime")


@pytest.mark.parametrize(
    ("value", "field"),
    [
        # Two standalone operators would both reconcile every RLJob.
        ("leaderElection.enabled=false,replicaCount=2", "/replicaCount"),
        ("leaderElection.leaseDurationSeconds=1", "/leaderElection/leaseDurationSeconds"),
        ("metrics.port=http", "/metrics/port"),
        ("health.port=70000", "/health/port"),
        ("logLevel=trace", "/logLevel"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("watchNamespaces={Team_A}", "/watchNamespaces/0"),
        ("metrics.serviceMonitor.interval=soon", "/metrics/serviceMonitor/interval"),
        ("rbac.create=maybe", "/rbac/create"),
    ],
)
def test_the_schema_refuses_a_bad_value_naming_the_field(helm: Helm, value: str, field: str) -> None:
    result = helm("template", "rlkube", str(CHART), "--set", value, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert f"at '{field}'" in result.stderr, result.stderr


@pytest.mark.parametrize("key", ["replicas", "metrics.prot", "rbac.clusterWide"])
def test_the_schema_refuses_an_unknown_key(helm: Helm, key: str) -> None:
    result = helm("template", "rlkube", str(CHART), "--set", f"{key}=1", check=False)
    assert result.returncode != 0
    assert f"additional properties '{key.rsplit('.', 1)[-1]}' not allowed" in result.stderr, result.stderr


# --- the Deployment --------------------------------------------------------------------------------


def test_two_replicas_one_active_through_a_lease_rolled_one_at_a_time(helm: Helm) -> None:
    objects = helm.template()
    spec = one(objects, "Deployment")["spec"]
    assert spec["replicas"] == 2
    # Only the Lease holder reconciles, so pods may overlap: the new one stands by first.
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    operator = container(objects)
    args = parse_args(operator["args"])
    assert args.leader_elect is True
    assert args.lease_name == "rlkube-leader"
    assert (args.lease_duration, args.renew_every, args.retry_every) == (10, 2, 1)
    # The Lease lives in the release namespace; each replica is named after its pod.
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in operator["env"] if "valueFrom" in e}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}


def test_the_replicas_prefer_different_nodes_and_a_drain_evicts_one_at_a_time(helm: Helm) -> None:
    objects = helm.template()
    deployment = one(objects, "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    [preferred] = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    # Soft: a one-node cluster still runs both replicas.
    assert preferred["podAffinityTerm"] == {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": selector},
    }
    budget = one(objects, "PodDisruptionBudget")
    assert budget["metadata"]["namespace"] == "rlkube-system"
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    assert (
        one(helm.template("podDisruptionBudget.maxUnavailable=2", "replicaCount=3"), "PodDisruptionBudget")["spec"][
            "maxUnavailable"
        ]
        == 2
    )


def test_a_users_affinity_replaces_the_spreading_and_one_replica_has_no_budget(helm: Helm) -> None:
    zone = "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]"
    objects = helm.template(f"{zone}.matchExpressions[0].key=pool", f"{zone}.matchExpressions[0].operator=Exists")
    assert set(one(objects, "Deployment")["spec"]["template"]["spec"]["affinity"]) == {"nodeAffinity"}
    unspread = one(helm.template("spreadReplicas=false"), "Deployment")["spec"]["template"]["spec"]
    assert "affinity" not in unspread
    # With one replica a budget would block every drain; off, there is none either.
    for sets in (("leaderElection.enabled=false", "replicaCount=1"), ("podDisruptionBudget.enabled=false",)):
        assert not [o for o in helm.template(*sets) if o["kind"] == "PodDisruptionBudget"]


def test_without_leader_election_one_replica_recreated_never_rolled(helm: Helm) -> None:
    objects = helm.template("leaderElection.enabled=false", "replicaCount=1")
    spec = one(objects, "Deployment")["spec"]
    assert spec["replicas"] == 1
    # A rolling update would run two standalone kopf operators side by side.
    assert spec["strategy"] == {"type": "Recreate"}
    operator = container(objects)
    assert parse_args(operator["args"]).leader_elect is False
    assert "env" not in operator


def test_user_env_follows_the_charts_own(helm: Helm) -> None:
    operator = container(helm.template("env[0].name=EXTRA", "env[0].value=on"))
    assert [e["name"] for e in operator["env"]] == ["POD_NAME", "POD_NAMESPACE", "EXTRA"]


def test_the_operator_runs_non_root_with_a_read_only_root_and_no_capabilities(helm: Helm) -> None:
    objects = helm.template()
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] != 0
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    operator = container(objects)["securityContext"]
    assert operator["readOnlyRootFilesystem"] is True
    assert operator["allowPrivilegeEscalation"] is False
    assert operator["capabilities"] == {"drop": ["ALL"]}
    # With a read-only root, the only writable place is the /tmp emptyDir.
    assert [m["mountPath"] for m in container(objects)["volumeMounts"]] == ["/tmp"]


def test_cluster_wide_args_are_what_the_operator_parses(helm: Helm) -> None:
    operator = container(helm.template())
    args = parse_args(operator["args"])
    assert args.all_namespaces is True
    assert args.namespace == []
    assert (args.metrics_port, args.health_port, args.verbose) == (9090, 8080, False)
    # The chart's defaults are the operator's defaults (and Dockerfile.operator's EXPOSE).
    assert (args.metrics_port, args.health_port) == (parse_args([]).metrics_port, parse_args([]).health_port)


def test_namespaced_args_name_every_watched_namespace(helm: Helm) -> None:
    operator = container(
        helm.template("watchNamespaces={team-a,team-b}", "logLevel=debug", "metrics.port=9191", "health.port=8181")
    )
    args = parse_args(operator["args"])
    assert args.namespace == ["team-a", "team-b"]
    assert args.all_namespaces is False
    assert (args.metrics_port, args.health_port, args.verbose) == (9191, 8181, True)
    ports = {p["name"]: p["containerPort"] for p in operator["ports"]}
    assert ports == {"metrics": 9191, "health": 8181}


def test_probes_use_kopfs_health_endpoint_on_the_health_port(helm: Helm) -> None:
    operator = container(helm.template())
    ports = {p["name"]: p["containerPort"] for p in operator["ports"]}
    assert ports == {"metrics": 9090, "health": 8080}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        # handlers: kopf.run(liveness_endpoint="http://0.0.0.0:<health-port>/healthz")
        assert operator[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe


def test_scheduling_and_image_values_reach_the_pod(helm: Helm) -> None:
    objects = helm.template(
        "image.repository=registry.example/rlkube-operator",
        "image.tag=1.2.3",
        "image.pullPolicy=Always",
        "imagePullSecrets[0].name=regcred",
        "priorityClassName=system-cluster-critical",
        "nodeSelector.pool=system",
        "tolerations[0].key=dedicated",
        "tolerations[0].operator=Exists",
        "podAnnotations.team=ml",
        "env[0].name=EXTRA",
        "env[0].value=enabled",
    )
    pod = one(objects, "Deployment")["spec"]["template"]
    spec = pod["spec"]
    operator = container(objects)
    assert operator["image"] == "registry.example/rlkube-operator:1.2.3"
    assert operator["imagePullPolicy"] == "Always"
    assert operator["env"][-1] == {"name": "EXTRA", "value": "enabled"}  # after the chart's own
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["nodeSelector"] == {"pool": "system"}
    assert spec["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert pod["metadata"]["annotations"] == {"team": "ml"}


def test_the_image_tag_defaults_to_the_apps_version(helm: Helm) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert container(helm.template())["image"] == f"rlkube-operator:{chart['appVersion']}"


def test_the_pod_runs_as_the_charts_service_account(helm: Helm) -> None:
    objects = helm.template(release="ml")
    account = one(objects, "ServiceAccount")
    assert account["metadata"]["namespace"] == "rlkube-system"
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]


# --- metrics ---------------------------------------------------------------------------------------


def test_the_metrics_service_targets_the_operators_metrics_port(helm: Helm) -> None:
    objects = helm.template()
    service = one(objects, "Service")
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]


def test_monitors_are_off_by_default(helm: Helm) -> None:
    kinds = {o["kind"] for o in helm.template()}
    assert not kinds & {"ServiceMonitor", "PodMonitor"}


def test_the_service_monitor_scrapes_the_metrics_service(helm: Helm) -> None:
    objects = helm.template(MONITORS[0], "metrics.serviceMonitor.labels.release=prom")
    monitor = one(objects, "ServiceMonitor")
    service = one(objects, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [service["metadata"]["namespace"]]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]


def test_a_service_monitor_without_the_service_is_refused(helm: Helm) -> None:
    result = helm(
        "template", "rlkube", str(CHART), "--set", MONITORS[0], "--set", "metrics.service.enabled=false", check=False
    )
    assert result.returncode != 0
    assert "metrics.serviceMonitor.enabled needs metrics.service.enabled" in result.stderr


def _pod_monitor(objects: list[Obj]) -> dict[str, Any]:
    monitor = one(objects, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    return dict(monitor["spec"])


def test_the_pod_monitor_selects_the_drivers_the_operator_creates(helm: Helm) -> None:
    spec = _pod_monitor(helm.template(MONITORS[1]))
    # The labels and the port name are the operator's, not copies that could drift.
    assert spec["selector"] == {"matchLabels": {LABEL_MANAGED_BY: MANAGED_BY, LABEL_ROLE: CONTROLLER_ROLE}}
    driver_ports = {p["name"] for p in container_ports(CONTROLLER_ROLE)}
    [endpoint] = spec["podMetricsEndpoints"]
    assert endpoint["port"] in driver_ports
    assert spec["namespaceSelector"] == {"any": True}


def test_the_pod_monitor_looks_only_in_watched_namespaces(helm: Helm) -> None:
    spec = _pod_monitor(helm.template(MONITORS[1], "watchNamespaces={team-a,team-b}"))
    assert spec["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


# --- docs ------------------------------------------------------------------------------------------


def _value_keys(values: Any, prefix: str = "") -> set[str]:
    """Every key path of values.yaml ("metrics.service.port"), inner ones included."""
    keys: set[str] = set()
    if isinstance(values, dict):
        for key, value in values.items():
            path = f"{prefix}{key}"
            keys.add(path)
            keys |= _value_keys(value, f"{path}.")
    return keys


def test_the_readme_documents_every_value_and_only_real_ones() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    keys = _value_keys(values)
    readme = (CHART / "README.md").read_text()
    table = readme.split("## Values", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE))
    assert documented, "no values table in charts/rlkube/README.md"
    assert documented <= keys, f"README documents values that do not exist: {sorted(documented - keys)}"
    # A key is documented itself or through a documented parent (e.g. `resources`).
    undocumented = {k for k in keys if not any(k == d or k.startswith(f"{d}.") for d in documented)}
    # Parents of documented keys need no row of their own.
    undocumented = {k for k in undocumented if not any(d.startswith(f"{k}.") for d in documented)}
    assert not undocumented, f"values missing from the README table: {sorted(undocumented)}"
