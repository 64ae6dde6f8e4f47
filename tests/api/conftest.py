"""The RLJob CRD installed once per test session."""

from __future__ import annotations

import pytest

from rlkube_api.crd import CRD_FILES
from rlkube_e2e.testing import Kubectl, wait_established


@pytest.fixture(scope="session")
def rljob_crd(kubectl: Kubectl) -> None:
    kubectl("apply", "--server-side", "-f", str(CRD_FILES[0]))
    # Polled: `kubectl wait` fails outright while the CRD has no conditions yet.
    wait_established(kubectl, "rljobs.rlkube.dev")
