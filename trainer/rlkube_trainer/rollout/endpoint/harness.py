"""The user's harness, one process per episode, against the endpoint; what each episode came to.

Each process gets, in its environment, `OPENAI_BASE_URL` (the endpoint with its episode's path),
`OPENAI_API_KEY` (the job's token), `RLKUBE_REWARD_URL` (where to POST `{"reward": x}`) and
`RLKUBE_EPISODE` (the caller's task as JSON: a row's prompt messages, say, and what scores it).
A harness that crashes (non-zero exit), outlives `timeout` (killed, with its process group), makes
no call, breaks its context (recorder.py) or, when a reward is required, reports none, loses
its episode: the loss is logged by episode and reason and counted, and the other episodes go on.
All episodes of a batch run at once, so the batch is complete when every harness has ended or
`timeout` has passed, whichever comes first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from rlkube_trainer.rollout.endpoint.recorder import EpisodeRecord
from rlkube_trainer.rollout.endpoint.server import Endpoint

log = logging.getLogger("rlkube.trainer")


@dataclass(frozen=True)
class Outcome:
    """One episode's end: its record when it finished, else why it was lost."""

    episode_id: str
    record: EpisodeRecord | None
    lost: str | None


def _lost_reason(
    code: int | None, record: EpisodeRecord, stderr: str, require_reward: bool, timeout: float
) -> str | None:
    if code is None:
        return f"the harness ran past {timeout:g} s and was killed"
    if code != 0:
        tail = stderr.strip().splitlines()[-1:] or [""]
        return f"the harness exited with code {code}: {tail[0][:200]}"
    if not record.calls:
        return "the harness made no call"
    if record.broken:
        return record.broken
    if require_reward and record.reward is None:
        return "the harness reported no reward"
    return None


def run_episodes(
    endpoint: Endpoint,
    base_url: str,
    command: Sequence[str],
    tasks: Sequence[dict[str, Any]],
    timeout: float,
    require_reward: bool,
    prefix: str = "ep",
) -> list[Outcome]:
    """Run one harness process per task, all at once; the outcomes in task order."""
    ids = [f"{prefix}-{i}" for i in range(len(tasks))]
    # stderr to files, not pipes: a chatty harness must not block on a full pipe while others run.
    with contextlib.ExitStack() as files:
        errs = [files.enter_context(tempfile.TemporaryFile()) for _ in ids]
        return _run(endpoint, base_url, command, tasks, timeout, require_reward, ids, errs)


def _run(
    endpoint: Endpoint,
    base_url: str,
    command: Sequence[str],
    tasks: Sequence[dict[str, Any]],
    timeout: float,
    require_reward: bool,
    ids: list[str],
    errs: Sequence[IO[bytes]],
) -> list[Outcome]:
    procs: list[subprocess.Popen[bytes]] = []
    for episode_id, task, err in zip(ids, tasks, errs, strict=True):
        endpoint.open(episode_id)
        env = {
            **os.environ,
            "OPENAI_BASE_URL": f"{base_url}/episodes/{episode_id}/v1",
            "OPENAI_API_KEY": endpoint.token,
            "RLKUBE_REWARD_URL": f"{base_url}/v1/episodes/{episode_id}/reward",
            "RLKUBE_EPISODE": json.dumps(task),
        }
        # Its own process group (start_new_session), killed whole on timeout.
        procs.append(
            subprocess.Popen(list(command), env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        )
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    outcomes = []
    for episode_id, proc, err in zip(ids, procs, errs, strict=True):
        code = proc.poll()
        if code is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        err.seek(0)
        stderr = err.read().decode(errors="replace")
        record = endpoint.close_episode(episode_id)
        lost = _lost_reason(code, record, stderr, require_reward, timeout)
        if lost is not None:
            log.warning("episode %s lost: %s", episode_id, lost)
        outcomes.append(Outcome(episode_id, None if lost else record, lost))
    return outcomes
