"""`make test` runs on two pytest-xdist workers, and tests/conftest.py keeps together the tests
that share an expensive fixture. This runs a few quick modules of the real suite the way
`make test` does and checks that each module ran whole on one worker: if pytest or pytest-xdist
stop honouring the groups, every module's fixtures (and every cluster) would be built twice."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).parents[2]
MODULES = ("tests/api/test_layout.py", "tests/packaging/test_image_keys.py", "tests/trainer/test_algos.py")
RECORDER = """
import os

def pytest_runtest_logstart(nodeid, location):
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # the controller logs each start too
    if worker:
        with open(os.environ["WHERE_FILE"], "a") as out:
            out.write(worker + " " + nodeid.split("::", 1)[0] + "\\n")
"""


def test_each_module_runs_whole_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "where_recorder.py").write_text(RECORDER)
    where = tmp_path / "where.txt"
    env = {"PYTHONPATH": str(tmp_path), "WHERE_FILE": str(where), "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "where_recorder", "-p", "no:cacheprovider"),
            *("-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder", "--basetemp", str(tmp_path / "t")),
            *MODULES,
        ],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for line in where.read_text().splitlines():
        worker, module = line.split(" ", 1)
        workers[module].add(worker)
    assert set(workers) == set(MODULES)
    assert all(len(ran_on) == 1 for ran_on in workers.values()), dict(workers)
    assert len(set().union(*workers.values())) == 2, "the modules did not spread over both workers"
