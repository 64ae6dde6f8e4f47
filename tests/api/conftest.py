"""The RLJob CRD installed once per test session."""

from __future__ import annotations

import pytest

from rlkube_api.crd import CRD_FILES
from rlkube_e2e.testing import Kubectl


@pytest.fixture(scope="session")
def rljob_crd(kubectl: Kubectl) -> None:
    kubectl("apply", "--server-side", "-f", str(CRD_FILES[0]))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/rljobs.rlkube.dev")
