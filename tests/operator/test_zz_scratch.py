import time, json
import pytest
from tests.operator.cluster_kit import Jobs, tiny_job, TINY_PODS
pytestmark = pytest.mark.cluster

def test_scratch(jobs: Jobs) -> None:
    j = jobs.create(tiny_job("tiny", jobs.namespace))
    jobs.wait_running("tiny")
    jobs.wait_pods("tiny", TINY_PODS)
    t0 = time.monotonic()
    jobs.kubectl("delete", "rljob", "tiny", "-n", jobs.namespace, "--wait=false")
    for i in range(20):
        try:
            m = jobs.get("tiny")["metadata"]
            print(round(time.monotonic() - t0, 2), m.get("finalizers"), m.get("deletionTimestamp"), sorted(jobs.children("tiny")))
        except Exception as e:
            print("gone", e.__class__)
            break
        time.sleep(0.05)
