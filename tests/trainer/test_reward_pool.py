"""rlkube_trainer.reward.pool: a reward function in worker processes, each importing the user's
file once; results in row order; a call that raises, runs past its time or kills its worker is
named by function, row and data source, and fails the batch or scores 0 (reward.onFailure).

Pools of 2 workers and functions that take milliseconds: the worker processes start in about
a second each time a pool starts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlkube_api.config import RewardConfig
from rlkube_trainer.reward.function import FunctionSource, RewardFunctionError
from rlkube_trainer.reward.pool import RewardPool
from rlkube_trainer.reward.scoring import (
    FAILED_METRIC,
    FunctionRewardScorer,
    RewardInput,
    build_reward_scorer,
    reward_workers,
)

# Logs each import of the file (one line per process that imported it); the answers say which
# process scored them. "raise", "hang" and "crash" misbehave as their names say.
MISBEHAVING = """
import os, time
from pathlib import Path

with open(Path(__file__).with_name("imports.log"), "a") as log:
    log.write(f"{os.getpid()}\\n")

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "raise":
        raise ValueError("cannot parse the answer")
    if solution_str == "hang":
        time.sleep(60)
    if solution_str == "crash":
        os._exit(3)
    time.sleep(0.01)
    return {"score": float(solution_str == ground_truth), "pid": os.getpid(), "row": extra_info["row"]}
"""


@pytest.fixture
def reward_file(tmp_path: Path) -> Path:
    path = tmp_path / "reward.py"
    path.write_text(MISBEHAVING)
    return path


def rows(*solutions: str) -> list[RewardInput]:
    return [RewardInput(f"source-{i % 2}", s, "4", {"row": i}) for i, s in enumerate(solutions)]


def pooled(path: Path, on_failure: str = "fail", timeout: float | None = 2.0) -> FunctionRewardScorer:
    config = {"function": {"path": str(path)}, "numWorkers": 2, "onFailure": on_failure}
    if timeout is not None:
        config["timeoutSeconds"] = timeout
    scorer = build_reward_scorer(RewardConfig.model_validate(config))
    assert isinstance(scorer, FunctionRewardScorer)
    return scorer


def test_results_come_in_row_order_and_each_worker_imports_the_file_once(reward_file: Path) -> None:
    scorer = pooled(reward_file)
    try:
        batch = rows(*["4", "5"] * 10)
        first = scorer.score(batch)
        second = scorer.score(batch)
    finally:
        scorer.close()
    for result in (first, second):
        assert result.scores == [1.0, 0.0] * 10
        assert result.extra["row"] == [float(i) for i in range(20)]
    workers = {int(pid) for pid in first.extra["pid"] + second.extra["pid"]}
    assert len(workers) == 2 and os.getpid() not in workers
    imports = [int(line) for line in (reward_file.parent / "imports.log").read_text().split()]
    # The driver loads the file once to check it at start; each worker once, for all 40 calls.
    assert sorted(imports) == sorted([os.getpid(), *workers])


def test_a_raising_call_fails_the_batch_naming_function_row_and_data_source(reward_file: Path) -> None:
    scorer = pooled(reward_file)
    try:
        with pytest.raises(RewardFunctionError) as failure:
            scorer.score(rows("4", "4", "4", "raise", "4"))
    finally:
        scorer.close()
    assert str(failure.value) == (
        f"reward function compute_score ({reward_file}) on batch row 3 (data_source 'source-1') "
        "raised ValueError: cannot parse the answer"
    )


def test_a_call_past_its_time_is_stopped_and_named(reward_file: Path) -> None:
    scorer = pooled(reward_file, timeout=0.5)
    try:
        with pytest.raises(
            RewardFunctionError, match=r"on batch row 2 \(data_source 'source-0'\) timed out after 0.5 s"
        ):
            scorer.score(rows("4", "5", "hang", "4"))
    finally:
        scorer.close()


def test_with_on_failure_zero_failed_rows_score_zero_and_are_counted(reward_file: Path) -> None:
    scorer = pooled(reward_file, on_failure="zero", timeout=0.5)
    try:
        result = scorer.score(rows("4", "crash", "hang", "raise", "4", "5"))
        # The crashed and the stopped workers were replaced: the pool goes on scoring.
        after = scorer.score(rows("4", "5", "4"))
    finally:
        scorer.close()
    assert result.scores == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert result.extra[FAILED_METRIC] == [0.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    # Their other numbers are 0 too: a NaN would make the batch's means NaN.
    assert result.extra["row"] == [0.0, 0.0, 0.0, 0.0, 4.0, 5.0]
    assert after.scores == [1.0, 0.0, 1.0]
    assert after.extra[FAILED_METRIC] == [0.0, 0.0, 0.0]


def test_a_crashed_worker_is_named_with_its_exit_code(reward_file: Path) -> None:
    scorer = pooled(reward_file, timeout=None)
    try:
        with pytest.raises(
            RewardFunctionError, match=r"row 1 \(data_source 'source-1'\) crashed its worker process \(exit code 3\)"
        ):
            scorer.score(rows("4", "crash"))
    finally:
        scorer.close()


def test_a_worker_that_cannot_load_the_function_is_reported(tmp_path: Path) -> None:
    pool = RewardPool(FunctionSource("compute_score", path=str(tmp_path / "absent.py")), 1)
    with pytest.raises(
        RewardFunctionError, match=r"could not load the function: reward function file .*absent\.py does not exist"
    ):
        pool([{"data_source": "x", "solution_str": "", "ground_truth": "", "extra_info": None}], True)


def test_zero_workers_call_the_function_in_this_process(reward_file: Path) -> None:
    scorer = build_reward_scorer(RewardConfig.model_validate({"function": {"path": str(reward_file)}, "numWorkers": 0}))
    assert isinstance(scorer, FunctionRewardScorer) and scorer.calls is None
    result = scorer.score(rows("4", "5"))
    assert result.scores == [1.0, 0.0]
    assert result.extra["pid"] == [float(os.getpid())] * 2


def test_unset_num_workers_is_the_cpus_this_process_may_use_within_its_cpu_limit(tmp_path: Path) -> None:
    cpus = len(os.sched_getaffinity(0))
    limit = tmp_path / "cpu.max"
    assert reward_workers(3, limit) == 3
    assert reward_workers(None, limit) == cpus  # no cgroup file
    limit.write_text("max 100000\n")
    assert reward_workers(None, limit) == cpus
    limit.write_text("50000 100000\n")  # half a CPU: one worker
    assert reward_workers(None, limit) == 1
