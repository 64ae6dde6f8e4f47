"""An e2e RLJob with a tool from a ConfigMap on the local cluster: a multi-turn,
tool-calling job from the trainer image on the real nodes, its rollout in a pod of its own.

The tool is a class in a module (`lookup_agent.LookupTool`) named by verl's tool config
(`tools.yaml`), both keys of one ConfigMap that the operator mounts at /etc/rlkube-agent, as in
examples/multi-turn-tools.yaml. The model is the tiny Qwen2 of the trainer tests, taught first
to write a hermes tool call and repeat the tool's answer, so that its episodes really call the
tool (a random model never writes `<tool_call>`). The job Succeeds, and its metrics show the
episodes happened: verl's `num_turns/*` above a single answer's and `tool_call_counts/*` above
zero, read from the metrics.jsonl the driver writes to the job's checkpoint folder.

The pods run with the example's Localhost seccomp profile (`profiles/rlkube-sandbox.json`, which the real nodes hold as the
README asks of users' nodes), set in the job's pod template as the example sets it; the code
interpreter it is for is tested in a pod of its own under the restricted standard
(test_sandbox_seccomp.py; this job's work folder is a hostPath volume, which that standard refuses).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from rlkube_api.pod_template import TRAINER_CONTAINER
from rlkube_e2e import tinyjob
from rlkube_e2e.testing import Kubectl
from tests.e2e.real_node_kit import PodLogs
from tests.trainer.tiny_model import build_tiny_model, teach

if TYPE_CHECKING:
    from tests.e2e.real_node_kit import RealCluster
    from tests.operator.cluster_kit import OperatorProcess

pytestmark = [pytest.mark.cluster, pytest.mark.e2e, pytest.mark.slow]

STEPS = 3
SANDBOX_PROFILE = {"type": "Localhost", "localhostProfile": "profiles/rlkube-sandbox.json"}
TIMEOUT = 900.0
KEYS = "abcdefgh"
TABLE = dict(zip(KEYS, "31750264", strict=True))
TOOLS_CONFIG_MAP = "agent-tools"
REWARD_CONFIG_MAP = "agent-reward"
# The tool's module and verl's tool config naming it, shipped together in the ConfigMap.
TOOL_MODULE = f"""
from rlkube_trainer.rollout.agent.schemas import ToolResponse
from rlkube_trainer.rollout.agent.tools import BaseTool

TABLE = {TABLE!r}


class LookupTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=TABLE.get(str(parameters.get("key")), "none")), 0.0, {{}}
"""
TOOLS_YAML = {
    "tools": [
        {
            "class_name": "lookup_agent.LookupTool",
            "config": {"type": "native"},
            "tool_schema": {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "The value of a key.",
                    "parameters": {
                        "type": "object",
                        "properties": {"key": {"type": "string", "description": "The key."}},
                        "required": ["key"],
                    },
                },
            },
        }
    ]
}
# The answer is the text after the last assistant header (the tool's output is in the decoded
# trajectory too, and earns nothing).
REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.rsplit("assistant\\n", 1)[-1].strip() == ground_truth)
"""


def _conversation(prompt: str, key: str) -> str:
    call = f'<tool_call>{{"name": "lookup", "arguments": {{"key": "{key}"}}}}</tool_call><|im_end|>'
    return prompt + call + f"<|im_start|>tool\n{TABLE[key]}<|im_end|>\n<|im_start|>assistant\n{TABLE[key]}<|im_end|>"


def _agent_model(path: Path) -> None:
    """The tiny model, taught the conversation's form (a call with the prompt's key, the tool's
    answer repeated): a few seconds of supervised steps."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    build_tiny_model(path, vocab=512, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = {
        key: str(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": f"key {key}"}], add_generation_prompt=True, tokenize=False
            )
        )
        for key in KEYS
    }
    teach(path, [_conversation(prompts[key], key) for key in KEYS], steps=60)


def _rows(count: int) -> str:
    rng = random.Random(0)
    rows = []
    for i in range(count):
        key = rng.choice(KEYS)
        rows.append(
            {
                "data_source": "lookup_task",
                "prompt": [{"role": "user", "content": f"key {key}"}],
                "reward_model": {"ground_truth": TABLE[key]},
                "extra_info": {"index": i},
            }
        )
    return "".join(json.dumps(row) + "\n" for row in rows)


def _agent_job(workdir: Path, image: str) -> tinyjob.TinyJob:
    """The tiny example's manifest (pool, work folder, image) turned into a multi-turn job: its
    own model and data under /rlkube/agent, the tool ConfigMap, one actor pod and one rollout pod."""
    job = tinyjob.prepare(workdir, name="agent", steps=STEPS, save_freq=STEPS)
    spec = job.manifest["spec"]
    agent = workdir / "agent"
    agent.mkdir(parents=True, exist_ok=True)
    _agent_model(agent / "model")
    (agent / "train.jsonl").write_text(_rows(64))
    spec["model"]["path"] = f"{tinyjob.MOUNT}/agent/model"
    spec["data"] = {
        "trainFiles": [f"{tinyjob.MOUNT}/agent/train.jsonl"],
        "maxPromptLength": 32,
        "maxResponseLength": 128,  # every turn of an episode
        "trainBatchSize": 8,
    }
    spec["actor"].update({"ppoMiniBatchSize": 8, "ppoMicroBatchSizePerGpu": 32, "optim": {"lr": 3e-4}})
    spec["rollout"].update(
        {
            "samplesPerPrompt": 4,
            "multiTurn": {
                "enable": True,
                "configMap": {"name": TOOLS_CONFIG_MAP},
                "toolConfigPath": "tools.yaml",
                "maxAssistantTurns": 2,
            },
        }
    )
    spec["reward"]["function"] = {"configMap": {"name": REWARD_CONFIG_MAP, "key": "reward.py"}}
    spec["trainer"].update({"testFreq": -1, "valBeforeTrain": False})
    spec["roles"]["actor"]["replicas"] = 1
    spec["podTemplate"] = {"securityContext": {"seccompProfile": SANDBOX_PROFILE}}
    assert spec["roles"]["rollout"]["placement"] == "separate"
    tinyjob.from_image(job, image)
    return job


def _config_maps(namespace: str) -> list[dict[str, Any]]:
    def config_map(name: str, data: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": data,
        }

    return [
        config_map(TOOLS_CONFIG_MAP, {"tools.yaml": yaml.safe_dump(TOOLS_YAML), "lookup_agent.py": TOOL_MODULE}),
        config_map(REWARD_CONFIG_MAP, {"reward.py": REWARD}),
    ]


def test_a_tool_calling_job_with_separate_rollout_succeeds(
    real_cluster: RealCluster,
    watching_operator: OperatorProcess,
    real_kubectl: Kubectl,
    real_namespace: str,
    tmp_path: Path,
) -> None:
    kubectl, namespace = real_kubectl, real_namespace
    job = _agent_job(tmp_path / "work", real_cluster.images["trainer-cpu"].ref)
    kubeconfig = real_cluster.cluster.kubeconfig
    with (
        PodLogs(kubeconfig, namespace, f"{job.name}-controller-0") as driver_log,
        PodLogs(kubeconfig, namespace, f"{job.name}-rollout-0") as rollout_log,
    ):
        kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(_config_maps(namespace)))
        kubectl("-n", namespace, "apply", "--server-side", "-f", "-", input=json.dumps(job.manifest))
        try:
            final = tinyjob.wait_state(kubectl, namespace, job.name, ("Succeeded", "Failed"), TIMEOUT)
            assert final["state"] == "Succeeded", final
        except (TimeoutError, AssertionError) as error:
            events = kubectl("-n", namespace, "get", "events", "--sort-by=.lastTimestamp", check=False).stdout
            (tmp_path / "driver.log").write_text(driver_log.text())  # whole: the ranks' logs come through it
            raise AssertionError(
                f"{error}\nevents:\n{events[-3000:]}\ndriver log:\n{driver_log.text()[-6000:]}"
                f"\nrollout pod log:\n{rollout_log.text()[-6000:]}"
                f"\noperator log:\n{watching_operator.log()[-2000:]}"
            ) from error
    assert final.get("restartCount", 0) == 0, final
    assert final["progress"]["step"] == STEPS
    rows = job.metrics()
    assert [int(row["step"]) for row in rows] == list(range(1, STEPS + 1)), rows
    # A single answer is 2 turns (the prompt's user turn and the model's); a tool call adds the
    # tool's turn and the model's next one. The taught model calls in about 6 episodes of 10.
    assert max(row["num_turns/max"] for row in rows) >= 4, rows
    assert sum(row["tool_call_counts/mean"] for row in rows) > 0, rows
    assert all(row["tool_call_errors/mean"] == 0 for row in rows), rows
    # The pods ran (and are gone with the job's end) from their StatefulSets' template: the
    # pod template's `securityContext` is the trainer container's, where the profile takes effect
    # over the operator's RuntimeDefault (the pod's own is `podSecurityContext`).
    template = (
        f'jsonpath={{.items[*].spec.template.spec.containers[?(@.name=="{TRAINER_CONTAINER}")]'
        ".securityContext.seccompProfile.localhostProfile}"
    )
    profiles = kubectl("-n", namespace, "get", "statefulsets", "-o", template).stdout.split()
    assert profiles and set(profiles) == {SANDBOX_PROFILE["localhostProfile"]}, profiles
    # Generated by the rollout pod's engine: its rank joined the driver's weight sync.
    assert "weight-sync group" in driver_log.text()
