"""RLJobs converted from verl configs (`rlkube-trainer convert --rljob`) are admitted by
the real API server, CEL rules included."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
import yaml

from rlkube_api.verl import convert, to_rljob
from tests.api.verl_examples import EXAMPLES

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.mark.cluster
@pytest.mark.parametrize("name", EXAMPLES)
def test_the_api_server_admits_the_converted_rljobs(
    kubectl: Kubectl, rljob_crd: None, namespace: str, name: str
) -> None:
    job = to_rljob(convert(EXAMPLES[name]).config, f"verl-{name}", "rlkube-trainer:0.1.0").to_wire()
    result = kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(job), check=False)
    assert result.returncode == 0, result.stderr
