"""The process node runs pods for real: environment, volumes, DNS, API access, lifecycle.

One node (proc-0, pool `local`) runs for the module; every pod selects it with
`rlkube.dev/pool: local`. The programs inside the pods are short Python scripts
that print one `RESULT {json}` line, which the tests read from the pod's log.
The tests at the end check the node's pure parts and need no cluster.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes.client import ApiClient, CoreV1Api

from rlkube_e2e.procnode import logs, network
from rlkube_e2e.procnode.containers import should_restart
from rlkube_e2e.procnode.dns import Entry, pod_names, render
from rlkube_e2e.procnode.env import expand
from rlkube_e2e.procnode.kubelet import parse_query
from rlkube_e2e.procnode.mounts import RootBuilder
from rlkube_e2e.procnode.node import ProcessNode
from rlkube_e2e.procnode.status import ContainerRecord, pod_phase, running, terminated, waiting
from rlkube_e2e.procnode.testing import phase_is, pod_log, read_pod, running_node, wait_pod
from rlkube_e2e.testing import ClusterInfo, Kubectl, wait_for

LOCAL = {"rlkube.dev/pool": "local"}
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
Test = TypeVar("Test", bound=Callable[..., None])


def on_process_node(test: Test) -> Test:
    """Marks a test that needs the cluster and runs pods for real."""
    marked: Test = pytest.mark.e2e(pytest.mark.cluster(test))
    return marked


@pytest.fixture(scope="module")
def node(cluster: ClusterInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessNode]:
    reason = ProcessNode.unavailable()
    if reason:
        pytest.skip(reason)
    with running_node(cluster.kubeconfig, tmp_path_factory.mktemp("procnode")) as started:
        yield started


@pytest.fixture
def core(kube: ApiClient) -> CoreV1Api:
    return CoreV1Api(kube)


def create(kubectl: Kubectl, namespace: str, manifest: dict[str, Any]) -> None:
    kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(manifest))


def python(script: str) -> list[str]:
    return ["python", "-c", textwrap.dedent(script)]


def pod_manifest(name: str, command: list[str], **spec: Any) -> dict[str, Any]:
    metadata = spec.pop("metadata", {})
    container = {"name": "main", "image": "ignored:latest", "command": command, **spec.pop("container", {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **metadata},
        "spec": {"nodeSelector": LOCAL, "containers": [container], "terminationGracePeriodSeconds": 2, **spec},
    }


def result_lines(node: ProcessNode, namespace: str, name: str) -> list[str]:
    return [line for line in pod_log(node, namespace, name).splitlines() if line.startswith("RESULT ")]


def result(node: ProcessNode, namespace: str, name: str) -> dict[str, Any]:
    """The last `RESULT {json}` line the pod printed."""
    lines = result_lines(node, namespace, name)
    assert lines, f"no RESULT line in {node.log_path(namespace, name)}:\n{pod_log(node, namespace, name)[-3000:]}"
    parsed: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return parsed


def container_status(pod: dict[str, Any]) -> dict[str, Any]:
    statuses: list[dict[str, Any]] = pod["status"].get("containerStatuses") or [{}]
    return statuses[0]


# -- environment and volumes -------------------------------------------------------

ENV_AND_VOLUMES = """
    import json, os, socket
    def read(path):
        with open(path) as handle:
            return handle.read()
    def writable(path):
        try:
            with open(os.path.join(path, "probe"), "w") as handle:
                handle.write("x")
            return True
        except OSError:
            return False
    names = ["POD_NAME", "POD_NAMESPACE", "POD_UID", "POD_IP", "NODE_NAME", "ACCOUNT", "RANK", "NOTE",
             "PASSWORD", "GREETING", "MISSING", "CFG_greeting", "EXPANDED", "KUBERNETES_SERVICE_HOST"]
    os.makedirs("/scratch/sub-dir-check", exist_ok=True)
    mounts = read("/proc/mounts")
    print("RESULT " + json.dumps({
        "env": {name: os.environ.get(name) for name in names},
        "argv": os.sys.argv[1:],
        "cwd": os.getcwd(),
        "hostname": socket.gethostname(),
        "settings": sorted(os.listdir("/etc/rlkube/settings")),
        "settings_yaml": read("/etc/rlkube/settings/app.yaml"),
        "item": read("/config-items/nested/hello.txt"),
        "item_mode": oct(os.stat("/config-items/nested/hello.txt").st_mode & 0o777),
        "secret": read("/etc/secret-vol/password"),
        "host_file": read("/host-data/input.txt"),
        "host_writable": writable("/host-data"),
        "config_writable": writable("/etc/rlkube/settings"),
        "scratch_writable": writable("/scratch"),
        "sub_path": read("/sub/file.txt"),
        "shm_is_tmpfs": any(line.split()[1:3] == ["/dev/shm", "tmpfs"] for line in mounts.splitlines()),
        "token": os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"),
    }))
"""


@on_process_node
def test_env_and_volumes(node: ProcessNode, kubectl: Kubectl, core: CoreV1Api, namespace: str, tmp_path: Path) -> None:
    assert not Path("/etc/rlkube").exists(), "this test checks that /etc/rlkube is not created on the host"
    settings = {"greeting": "hello", "app.yaml": "steps: 3\n"}
    create(
        kubectl,
        namespace,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": settings},
    )
    secret = {"password": base64.b64encode(b"s3cret").decode()}
    create(kubectl, namespace, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"}, "data": secret})
    host_dir = tmp_path / "host-data"
    host_dir.mkdir()
    (host_dir / "input.txt").write_text("from the host")
    scratch_sub = "sub"
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "ACCOUNT", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
        {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{POD_INDEX_LABEL}']"}}},
        {"name": "NOTE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['note']"}}},
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
        {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "greeting"}}},
        {"name": "MISSING", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "nope", "optional": True}}},
        {"name": "EXPANDED", "value": "$(GREETING)-world $$(GREETING)"},
    ]
    mounts = [
        {"name": "settings", "mountPath": "/etc/rlkube/settings"},
        {"name": "items", "mountPath": "/config-items"},
        {"name": "secret", "mountPath": "/etc/secret-vol", "readOnly": True},
        {"name": "host", "mountPath": "/host-data", "readOnly": True},
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "scratch", "mountPath": "/sub", "subPath": scratch_sub},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    volumes = [
        {"name": "settings", "configMap": {"name": "settings"}},
        {
            "name": "items",
            "configMap": {
                "name": "settings",
                "items": [{"key": "greeting", "path": "nested/hello.txt", "mode": 0o600}],
            },
        },
        {"name": "secret", "secret": {"secretName": "creds"}},
        {"name": "host", "hostPath": {"path": str(host_dir), "type": "Directory"}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    init = {
        "name": "prepare",
        "image": "ignored",
        "command": ["sh", "-c", f"mkdir /scratch/{scratch_sub} && echo from-init > /scratch/{scratch_sub}/file.txt"],
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    }
    manifest = pod_manifest(
        "env-and-volumes",
        python(ENV_AND_VOLUMES),
        metadata={"labels": {POD_INDEX_LABEL: "3"}, "annotations": {"note": "from-annotation"}},
        container={
            "args": ["$(POD_NAME)", "$(UNDEFINED)"],
            "env": env,
            "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
            "volumeMounts": mounts,
            "workingDir": "/scratch",
        },
        restartPolicy="Never",
        volumes=volumes,
        initContainers=[init],
    )
    create(kubectl, namespace, manifest)
    pod = wait_pod(core, node, namespace, "env-and-volumes", "to succeed", phase_is("Succeeded", "Failed"))
    assert pod["status"]["phase"] == "Succeeded", pod_log(node, namespace, "env-and-volumes")
    assert container_status(pod)["state"]["terminated"]["exitCode"] == 0
    assert pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    found = result(node, namespace, "env-and-volumes")
    assert found["env"] == {
        "POD_NAME": "env-and-volumes",
        "POD_NAMESPACE": namespace,
        "POD_UID": pod["metadata"]["uid"],
        "POD_IP": pod["status"]["podIP"],
        "NODE_NAME": node.name,
        "ACCOUNT": "default",
        "RANK": "3",
        "NOTE": "from-annotation",
        "PASSWORD": "s3cret",
        "GREETING": "hello",
        "MISSING": None,
        "CFG_greeting": "hello",
        "EXPANDED": "hello-world $(GREETING)",
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    }
    assert found["argv"] == ["env-and-volumes", "$(UNDEFINED)"]
    assert found["cwd"] == "/scratch"
    assert found["hostname"] == "env-and-volumes"
    assert found["settings"] == ["app.yaml", "greeting"]
    assert found["settings_yaml"] == "steps: 3\n"
    assert (found["item"], found["item_mode"]) == ("hello", "0o600")
    assert found["secret"] == "s3cret"
    assert found["host_file"] == "from the host"
    # readOnly on the mount, configMaps always; emptyDirs are writable.
    assert (found["host_writable"], found["config_writable"], found["scratch_writable"]) == (False, False, True)
    assert found["sub_path"] == "from-init\n"
    assert found["shm_is_tmpfs"] is True
    assert found["token"] is True
    assert not Path("/etc/rlkube").exists(), "the pod's mount targets leaked onto the host"
    assert not (host_dir / "probe").exists()


# -- DNS between StatefulSet pods ---------------------------------------------------

PEERS = """
    import json, os, socket, time
    index = int(os.environ["RANK"])
    own = socket.gethostbyname(socket.gethostname())
    if index == 0:
        server = socket.create_server(("0.0.0.0", 7000))
        connection, _ = server.accept()
        message = connection.recv(1024).decode()
        print("RESULT " + json.dumps({"received": message, "own": own}), flush=True)
    else:
        peer = f"peers-0.peers.{os.environ['NAMESPACE']}.svc.cluster.local"
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection((peer, 7000), timeout=2) as connection:
                    connection.sendall(f"hello from {socket.gethostname()}".encode())
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        addresses = {name: socket.gethostbyname(name) for name in (peer, "peers-0.peers", "peers-0")}
        print("RESULT " + json.dumps({"resolved": addresses, "own": own}), flush=True)
    time.sleep(3600)
"""


@on_process_node
def test_statefulset_pods_reach_each_other_by_dns(
    node: ProcessNode, kubectl: Kubectl, core: CoreV1Api, namespace: str
) -> None:
    labels = {"app": "peers"}
    service = {"clusterIP": "None", "selector": labels}
    create(kubectl, namespace, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "peers"}, "spec": service})
    env = [
        {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{POD_INDEX_LABEL}']"}}},
        {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    template = {"metadata": {"labels": labels}, "spec": pod_manifest("", python(PEERS), container={"env": env})["spec"]}
    stateful_set = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "peers"},
        "spec": {
            "serviceName": "peers",
            "replicas": 2,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": template,
        },
    }
    create(kubectl, namespace, stateful_set)

    def printed_result(pod: dict[str, Any]) -> bool:
        return bool(result_lines(node, namespace, pod["metadata"]["name"]))

    pods = {
        name: wait_pod(core, node, namespace, name, "to print its result", printed_result)
        for name in ("peers-0", "peers-1")
    }
    server, client = result(node, namespace, "peers-0"), result(node, namespace, "peers-1")
    ip0, ip1 = (pods[name]["status"]["podIP"] for name in ("peers-0", "peers-1"))
    assert server == {"received": "hello from peers-1", "own": ip0}
    assert client["own"] == ip1
    assert set(client["resolved"].values()) == {ip0}
    for name in pods:
        pod = wait_pod(core, node, namespace, name, "to be Ready", phase_is("Running"))
        ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"


# -- the API server from inside a pod --------------------------------------------------

IN_CLUSTER = """
    import json, os
    from kubernetes import client, config
    config.load_incluster_config()
    api = client.CoreV1Api()
    name, namespace = os.environ["POD_NAME"], open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read()
    pod = api.read_namespaced_pod(name, namespace)
    api.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": {"rlkube.dev/seen": "yes"}}})
    print("RESULT " + json.dumps({"ip": pod.status.pod_ip, "host": client.Configuration.get_default_copy().host}))
"""


@on_process_node
def test_in_cluster_config_reads_and_patches_own_pod(
    node: ProcessNode, kubectl: Kubectl, core: CoreV1Api, namespace: str
) -> None:
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "pods"}, "rules": [rule]}
    create(kubectl, namespace, role)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "pods"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
    }
    create(kubectl, namespace, binding)
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    create(
        kubectl,
        namespace,
        pod_manifest("in-cluster", python(IN_CLUSTER), container={"env": env}, restartPolicy="Never"),
    )
    pod = wait_pod(core, node, namespace, "in-cluster", "to finish", phase_is("Succeeded", "Failed"))
    assert pod["status"]["phase"] == "Succeeded", pod_log(node, namespace, "in-cluster")
    found = result(node, namespace, "in-cluster")
    assert found["ip"] == pod["status"]["podIP"]
    assert found["host"].startswith("https://10.96.0.1:")
    assert pod["metadata"]["annotations"]["rlkube.dev/seen"] == "yes"


# -- lifecycle ------------------------------------------------------------------------

PROCESS_TREE = """
    import os, signal, subprocess, time
    # Children in the same process group, one in its own session (as daemons do),
    # and one that ignores SIGTERM: all must die with the pod.
    subprocess.Popen(["sleep", "1000"])
    subprocess.Popen(["sleep", "1000"], start_new_session=True)
    subprocess.Popen(["python", "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(1000)"])
    print("RESULT {}", flush=True)
    time.sleep(1000)
"""


@on_process_node
def test_deleting_a_pod_kills_its_process_tree(
    node: ProcessNode, kubectl: Kubectl, core: CoreV1Api, namespace: str
) -> None:
    create(kubectl, namespace, pod_manifest("tree", python(PROCESS_TREE)))
    pod = wait_pod(
        core, node, namespace, "tree", "to start its children", lambda _: bool(result_lines(node, namespace, "tree"))
    )
    netns = node.netns(pod["metadata"]["uid"])

    # The sandbox, the launcher, its PID namespace's init, python and three children.
    def all_started() -> list[int] | None:
        pids = network.processes(netns)
        return pids if len(pids) >= 7 else None

    pids = wait_for(all_started, f"7 processes in {netns}")
    started = time.monotonic()
    core.delete_namespaced_pod("tree", namespace)
    wait_for(lambda: read_pod(core, namespace, "tree") is None, "the pod object to be deleted", timeout=30)
    # terminationGracePeriodSeconds is 2: the child that ignores SIGTERM is killed after it.
    assert time.monotonic() - started < 15
    assert netns not in network.namespaces(netns)
    survivors = [pid for pid in pids if _alive(pid)]
    assert not survivors, f"processes of the deleted pod still run: {survivors}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@on_process_node
def test_failing_container_under_restart_policy_never(
    node: ProcessNode, kubectl: Kubectl, core: CoreV1Api, namespace: str
) -> None:
    command = python("import sys; print('failing on purpose'); sys.exit(3)")
    create(kubectl, namespace, pod_manifest("fails", command, restartPolicy="Never"))
    pod = wait_pod(core, node, namespace, "fails", "to fail", phase_is("Failed", "Succeeded"))
    assert pod["status"]["phase"] == "Failed"
    status = container_status(pod)
    assert status["state"]["terminated"]["exitCode"] == 3
    assert status["state"]["terminated"]["reason"] == "Error"
    assert status["restartCount"] == 0
    assert "failing on purpose" in pod_log(node, namespace, "fails")


@on_process_node
def test_termination_messages_from_the_file_or_the_log(
    node: ProcessNode, kubectl: Kubectl, core: CoreV1Api, namespace: str
) -> None:
    """As the kubelet: the file at terminationMessagePath becomes the terminated state's
    message; with FallbackToLogsOnError, a failed container that wrote none gets its log's end."""
    wrote = python("import sys; open('/dev/termination-log', 'w').write('model.path missing'); sys.exit(78)")
    silent = python("import sys; print('line one'); print('the last line'); sys.exit(1)")
    fallback = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    create(kubectl, namespace, pod_manifest("wrote", wrote, restartPolicy="Never"))
    create(kubectl, namespace, pod_manifest("silent", silent, restartPolicy="Never", container=fallback))
    create(kubectl, namespace, pod_manifest("quiet", silent, restartPolicy="Never"))
    ended = {
        name: container_status(wait_pod(core, node, namespace, name, "to fail", phase_is("Failed")))["state"][
            "terminated"
        ]
        for name in ("wrote", "silent", "quiet")
    }
    assert (ended["wrote"]["exitCode"], ended["wrote"]["message"]) == (78, "model.path missing")
    assert ended["silent"]["message"] == "line one\nthe last line\n"
    assert "message" not in ended["quiet"]  # policy File, nothing written


RESTARTS = """
    import json
    counts = {}
    for path in ("/data/runs", "/mem/runs"):
        with open(path, "a+") as handle:
            handle.write("run\\n")
            handle.seek(0)
            counts[path] = len(handle.readlines())
    print("RESULT " + json.dumps(counts), flush=True)
    raise SystemExit(1)
"""


@on_process_node
def test_restart_policy_always_restarts_and_keeps_empty_dirs(
    node: ProcessNode, kubectl: Kubectl, core: CoreV1Api, namespace: str
) -> None:
    manifest = pod_manifest(
        "restarts",
        python(RESTARTS),
        container={"volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "mem", "mountPath": "/mem"}]},
        volumes=[{"name": "data", "emptyDir": {}}, {"name": "mem", "emptyDir": {"medium": "Memory"}}],
    )
    create(kubectl, namespace, manifest)
    pod = wait_pod(
        core, node, namespace, "restarts", "to restart twice", lambda p: container_status(p).get("restartCount", 0) >= 2
    )
    assert pod["status"]["phase"] == "Running"
    assert container_status(pod)["lastState"]["terminated"]["exitCode"] == 1
    # emptyDirs (on disk and in memory) outlive container restarts.
    counts = wait_for(
        lambda: (found := result(node, namespace, "restarts"))["/data/runs"] >= 3 and found, "a third run"
    )
    assert counts["/data/runs"] == counts["/mem/runs"] >= 3


@on_process_node
def test_container_without_command_is_a_config_error(
    node: ProcessNode, kubectl: Kubectl, core: CoreV1Api, namespace: str
) -> None:
    create(kubectl, namespace, pod_manifest("no-command", []))

    def waiting_reason(pod: dict[str, Any]) -> bool:
        state: dict[str, Any] = container_status(pod).get("state", {})
        return bool(state.get("waiting", {}).get("reason") == "CreateContainerConfigError")

    pod = wait_pod(core, node, namespace, "no-command", "to report CreateContainerConfigError", waiting_reason)
    assert "has no command" in container_status(pod)["state"]["waiting"]["message"]
    assert pod["status"]["phase"] == "Pending"


@on_process_node
def test_restarted_node_restarts_or_fails_its_pods(
    node: ProcessNode, kubectl: Kubectl, core: CoreV1Api, namespace: str
) -> None:
    command = python("import time; print('RESULT {}', flush=True); time.sleep(1000)")
    create(kubectl, namespace, pod_manifest("always", command))
    create(kubectl, namespace, pod_manifest("never", command, restartPolicy="Never"))
    pods = {
        name: wait_pod(
            core, node, namespace, name, "to run", lambda p: bool(result_lines(node, namespace, p["metadata"]["name"]))
        )
        for name in ("always", "never")
    }
    netns = [node.netns(pod["metadata"]["uid"]) for pod in pods.values()]
    node.stop(grace=1)
    assert not [name for name in netns if network.namespaces(name)]
    node.start()
    always = wait_pod(
        core, node, namespace, "always", "to be restarted", lambda p: container_status(p).get("restartCount") == 1
    )
    assert always["status"]["phase"] == "Running"
    never = wait_pod(core, node, namespace, "never", "to fail", phase_is("Failed"))
    assert container_status(never)["state"]["terminated"]["reason"] == "ProcessNodeRestarted"


# -- kubectl logs through the node's kubelet endpoint ------------------------------

TALKS = """
    import os, sys, time
    path = "/data/runs"
    run = len(open(path).readlines()) if os.path.exists(path) else 0
    with open(path, "a") as handle:
        handle.write("x\\n")
    for line in range(3):
        print(f"run {run} line {line}", flush=True)
    sys.stderr.write(f"run {run} on stderr\\n")
    sys.stderr.flush()
    if run == 0:
        raise SystemExit(1)
    time.sleep(1000)
"""


@on_process_node
def test_kubectl_logs_reads_each_container_run(
    node: ProcessNode, kubectl: Kubectl, core: CoreV1Api, namespace: str
) -> None:
    """`kubectl logs` goes apiserver -> the node's kubelet endpoint -> the run's own log file:
    current and previous run, init containers, --tail, --timestamps, --since-time, --limit-bytes, -f."""
    manifest = pod_manifest(
        "talks",
        python(TALKS),
        container={"volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        volumes=[{"name": "data", "emptyDir": {}}],
        initContainers=[{"name": "setup", "image": "ignored", "command": ["echo", "init says hi"]}],
    )
    create(kubectl, namespace, manifest)
    wait_pod(core, node, namespace, "talks", "to restart once", lambda p: container_status(p).get("restartCount") == 1)

    def logs(*args: str) -> str:
        return kubectl("-n", namespace, "logs", "talks", *args).stdout

    current = wait_for(lambda: (out := logs()).count("\n") == 4 and out, "the second run's four lines")
    assert current == "run 1 line 0\nrun 1 line 1\nrun 1 line 2\nrun 1 on stderr\n"
    assert logs("--previous") == "run 0 line 0\nrun 0 line 1\nrun 0 line 2\nrun 0 on stderr\n"
    assert logs("-c", "setup") == "init says hi\n"
    assert logs("--tail=1") == "run 1 on stderr\n"
    assert logs("--limit-bytes=5") == "run 1"
    stamped = logs("--timestamps", "--tail=2").splitlines()
    assert [line.split(" ", 1)[1] for line in stamped] == ["run 1 line 2", "run 1 on stderr"]
    for line in stamped:
        written = datetime.fromisoformat(line.split(" ", 1)[0])
        assert abs((datetime.now(UTC) - written).total_seconds()) < 120
    assert logs("--since-time", (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")) == ""
    missing = kubectl("-n", namespace, "logs", "talks", "-c", "nope", check=False)
    assert missing.returncode != 0 and "nope" in missing.stderr


def _kubelet_healthz(port: int, client_cert: tuple[Path, Path] | None) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # the node's cert is self-signed
    if client_cert is not None:
        context.load_cert_chain(*client_cert)
    with socket.create_connection((network.GATEWAY, port), timeout=10) as raw, context.wrap_socket(raw) as tls:
        tls.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        answer = tls.recv(4096)  # TLS 1.3 reports a refused certificate at the first read
        if not answer:
            raise ConnectionError("the kubelet endpoint closed the connection")
        return answer


@on_process_node
def test_the_kubelet_endpoint_refuses_clients_without_a_cluster_certificate(node: ProcessNode, core: CoreV1Api) -> None:
    """Pods share the bridge with the node's kubelet endpoint: only holders of a client
    certificate signed by the cluster CA (the apiserver) may read logs through it."""
    port = core.read_node(node.name).status.daemon_endpoints.kubelet_endpoint.port
    credentials = node.state_dir / "credentials"
    assert _kubelet_healthz(port, (credentials / "client.crt", credentials / "client.key")).startswith(b"HTTP/1.0 200")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _kubelet_healthz(port, None)


@on_process_node
def test_kubectl_logs_follow_ends_with_the_container(
    node: ProcessNode, kubectl: Kubectl, core: CoreV1Api, namespace: str
) -> None:
    command = python("import time\nfor i in range(5):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.4)")
    create(kubectl, namespace, pod_manifest("ticks", command, restartPolicy="Never"))
    wait_pod(core, node, namespace, "ticks", "to run", phase_is("Running", "Succeeded"))
    started = time.monotonic()
    followed = kubectl("-n", namespace, "logs", "-f", "ticks", timeout=60)
    assert followed.stdout == "".join(f"tick {i}\n" for i in range(5))
    assert time.monotonic() - started < 30


# -- pure parts (no cluster) --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)-x", "1-x"),
        ("$$(A)", "$(A)"),
        ("$(UNSET)", "$(UNSET)"),
        ("$(A", "$(A"),
        ("a$b$", "a$b$"),
        ("$(A)$(B)", "12"),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert expand(text, {"A": "1", "B": "2"}) == expected


@pytest.mark.parametrize(
    ("policy", "exit_code", "init", "expected"),
    [
        ("Always", 0, False, True),
        ("OnFailure", 0, False, False),
        ("OnFailure", 1, False, True),
        ("Never", 1, False, False),
        ("Always", 0, True, False),
        ("Always", 1, True, True),
        ("Never", 1, True, False),
    ],
)
def test_should_restart(policy: str, exit_code: int, init: bool, expected: bool) -> None:
    assert should_restart(policy, exit_code, init=init) is expected


def _record(state: dict[str, Any], *, done: bool = False, restarts: int = 0) -> ContainerRecord:
    return ContainerRecord("c", "image", restart_count=restarts, state=state, done=done)


@pytest.mark.parametrize(
    ("init", "containers", "init_failed", "expected"),
    [
        ([], [_record(waiting("ContainerCreating"))], False, "Pending"),
        ([_record(running("t"))], [_record(waiting("PodInitializing"))], False, "Pending"),
        ([_record(terminated(0, "t", "t"), done=True)], [_record(running("t"))], False, "Running"),
        ([], [_record(waiting("CrashLoopBackOff"), restarts=1)], False, "Running"),
        ([], [_record(terminated(0, "t", "t"), done=True)], False, "Succeeded"),
        ([], [_record(terminated(0, "t", "t"), done=True), _record(running("t"))], False, "Running"),
        ([], [_record(terminated(2, "t", "t"), done=True)], False, "Failed"),
        ([_record(terminated(1, "t", "t"), done=True)], [_record(waiting("PodInitializing"))], True, "Failed"),
    ],
)
def test_pod_phase(
    init: list[ContainerRecord], containers: list[ContainerRecord], init_failed: bool, expected: str
) -> None:
    assert pod_phase(init, containers, init_failed=init_failed) == expected


def test_dns_names_of_a_statefulset_pod_and_other_namespaces() -> None:
    pod = {"metadata": {"name": "w-0", "namespace": "ns"}, "spec": {"hostname": "w-0", "subdomain": "w"}}
    names = pod_names(pod)
    assert names == ("w-0.w.ns.svc.cluster.local", "w-0.w.ns.svc", "w-0.w.ns", "w-0.w", "w-0")
    entry = Entry("uid", "proc-0", "ns", "10.89.1.7", names)
    own, other = render("ns", [entry], "10.96.0.1"), render("elsewhere", [entry], "10.96.0.1")
    assert "10.89.1.7\tw-0.w.ns.svc.cluster.local w-0.w.ns.svc w-0.w.ns w-0.w w-0\n" in own
    # Short names only resolve in the pod's own namespace, as with the search path.
    assert "10.89.1.7\tw-0.w.ns.svc.cluster.local w-0.w.ns.svc\n" in other
    assert pod_names({"metadata": {"name": "p", "namespace": "ns"}, "spec": {}}) == ("p",)


def test_paths_resolve_inside_the_container_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    (root / "var").mkdir()
    # Absolute links point into the root, not at the host.
    (root / "var" / "run").symlink_to("/run")
    builder = RootBuilder(root, tmp_path / "stash")
    assert builder.resolve("/var/run/secrets/token") == (root / "run", ["secrets", "token"])
    assert builder.resolve("/var/../run/") == (root / "run", [])


def test_cri_log_lines_split_long_lines_and_keep_unfinished_ones() -> None:
    pending = bytearray()
    first = logs.encode(b"one\ntw", pending, "T1")
    assert first == b"T1 F one\n" and pending == b"tw"
    assert logs.encode(b"o\n", pending, "T2") == b"T2 F two\n" and not pending
    long = b"x" * (logs.MAX_PIECE + 10)
    pieces = logs.encode(long + b"\n", pending, "T3").splitlines()
    assert pieces == [b"T3 P " + b"x" * logs.MAX_PIECE, b"T3 F " + b"x" * 10]
    assert logs.encode(b"tail", pending, "T4", final=True) == b"T4 P tail\n"
    # Read back: pieces join into the line, an unfinished line stays unfinished.
    entries = [logs.parse(line) for line in (b"T0 F a", b"2026-01-01T00:00:00.5Z P b", b"garbage")]
    assert entries[0] is None and entries[2] is None
    assert entries[1] is not None and entries[1].text == b"b" and entries[1].render(True) == b"2026-01-01T00:00:00.5Z b"


def _cri_file(path: Path, lines: list[tuple[int, str]]) -> None:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    with path.open("wb") as handle:
        for second, text in lines:
            handle.write(logs.encode(text.encode() + b"\n", bytearray(), logs.stamp(base + timedelta(seconds=second))))


def test_reading_a_log_applies_tail_since_limit_and_timestamps(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    _cri_file(path, [(0, "a"), (1, "b"), (2, "c")])

    def read(**options: Any) -> bytes:
        return b"".join(logs.read(path, logs.LogQuery(**options), lambda: False))

    assert read() == b"a\nb\nc\n"
    assert read(tail_lines=2) == b"b\nc\n" and read(tail_lines=0) == b""
    assert read(since=datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)) == b"b\nc\n"
    assert read(limit_bytes=3) == b"a\nb"
    assert read(timestamps=True, tail_lines=1) == b"2026-01-01T00:00:02.000000Z c\n"


def test_following_a_log_streams_until_the_run_ends(tmp_path: Path) -> None:
    path = tmp_path / "0.log"
    _cri_file(path, [(0, "first")])
    done = threading.Event()

    def writer() -> None:
        for text in ("second", "third"):
            time.sleep(0.3)
            with path.open("ab") as handle:
                handle.write(logs.encode(f"{text}\n".encode(), bytearray(), logs.stamp()))
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    out = b"".join(logs.read(path, logs.LogQuery(follow=True), lambda: not done.is_set()))
    thread.join()
    assert out == b"first\nsecond\nthird\n"


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"tailLines": ["x"]}, "tailLines: 'x' is not an integer"),
        ({"limitBytes": ["0"]}, "limitBytes: must be at least 1"),
        ({"sinceSeconds": ["5"], "sinceTime": ["2026-01-01T00:00:00Z"]}, "at most one"),
        ({"sinceTime": ["yesterday"]}, "sinceTime: 'yesterday' is not an RFC 3339 time"),
    ],
)
def test_bad_log_options_are_refused_by_name(query: dict[str, list[str]], message: str) -> None:
    with pytest.raises(logs.LogRequestError, match=message) as raised:
        parse_query(query, datetime.now(UTC))
    assert raised.value.status == 400


def test_log_options_are_parsed() -> None:
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    query, previous = parse_query({"follow": ["true"], "previous": ["1"], "sinceSeconds": ["60"]}, now)
    assert previous and query.follow and not query.timestamps
    assert query.since == datetime(2026, 1, 1, 11, 59, tzinfo=UTC)


def test_a_claim_mounts_the_host_path_of_its_persistent_volume(tmp_path: Path) -> None:
    from rlkube_e2e.procnode.env import ConfigError  # noqa: PLC0415
    from rlkube_e2e.procnode.volumes import prepare_volumes  # noqa: PLC0415

    bound = {"models": tmp_path / "pv-models", "ckpt": tmp_path / "pv-ckpt"}

    def claims(name: str) -> Path:
        if name not in bound:
            raise ConfigError(f"persistentVolumeClaim {name!r} is not bound to a PersistentVolume yet")
        return bound[name]

    def volumes(*entries: dict[str, Any]) -> dict[str, Any]:
        pod = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"volumes": list(entries)}}
        return prepare_volumes(pod, tmp_path / "pod", lambda *_: None, lambda *_: "", "10.0.0.2", "10.0.0.1", claims)

    got = volumes(
        {"name": "m", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
        {"name": "c", "persistentVolumeClaim": {"claimName": "ckpt"}},
    )
    assert (got["m"].path, got["m"].read_only) == (bound["models"], True)
    assert (got["c"].path, got["c"].read_only, got["c"].writable_source) == (bound["ckpt"], False, True)
    with pytest.raises(ConfigError, match="'other' is not bound"):
        volumes({"name": "o", "persistentVolumeClaim": {"claimName": "other"}})
