"""The user's harness, one process per episode, against the endpoint; what each episode came to.

Each process gets, in its environment, `OPENAI_BASE_URL` (the endpoint with its episode's path),
`OPENAI_API_KEY` (the job's token), `RLKUBE_REWARD_URL` (where to POST `{"reward": x}`) and
`RLKUBE_EPISODE` (the caller's task as JSON: a row's prompt messages, say, and what scores it).
A harness that crashes (non-zero exit), outlives `timeout` from its start (killed, with its
process group), makes no call, breaks its context (recorder.py) or, when a reward is required,
reports none, loses its episode: the loss is logged by episode and reason and counted, and the
other episodes go on. All episodes of a batch run at once unless `max_concurrent` caps them (the
next starts when one ends), so with no cap the batch is complete when every harness has ended or
`timeout` has passed, whichever comes first, and the engine calls of killed harnesses have ended
(the engine is then free for others).
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
    max_concurrent: int | None = None,
) -> list[Outcome]:
    """Run one harness process per task, at most `max_concurrent` at once (all when None); the
    outcomes in task order."""
    ids = [f"{prefix}-{i}" for i in range(len(tasks))]
    # stderr to files, not pipes: a chatty harness must not block on a full pipe while others run.
    with contextlib.ExitStack() as files:
        errs = [files.enter_context(tempfile.TemporaryFile()) for _ in ids]
        episodes = [_Episode(i, t, e) for i, t, e in zip(ids, tasks, errs, strict=True)]
        cap = max_concurrent or len(episodes)
        waiting, running = list(episodes), list[_Episode]()
        try:
            while waiting or running:
                while waiting and len(running) < cap:
                    episode = waiting.pop(0)
                    episode.start(endpoint, base_url, command, timeout)
                    running.append(episode)
                time.sleep(0.05)
                running = [e for e in running if not e.ended()]
        finally:  # the driver interrupted (or a harness that cannot start): no process outlives it
            for episode in running:
                episode.kill()
            endpoint.drain()  # nor a killed harness's engine call
        return [e.outcome(endpoint, require_reward, timeout) for e in episodes]


class _Episode:
    """One harness process: started with its episode's environment, ended by exiting or by its
    deadline (its process group killed)."""

    def __init__(self, episode_id: str, task: dict[str, Any], err: IO[bytes]) -> None:
        self.episode_id, self.task, self.err = episode_id, task, err
        self.proc: subprocess.Popen[bytes] | None = None
        self.deadline = 0.0
        self.code: int | None = None

    def start(self, endpoint: Endpoint, base_url: str, command: Sequence[str], timeout: float) -> None:
        endpoint.open(self.episode_id)
        env = {
            **os.environ,
            "OPENAI_BASE_URL": f"{base_url}/episodes/{self.episode_id}/v1",
            "OPENAI_API_KEY": endpoint.token,
            "RLKUBE_REWARD_URL": f"{base_url}/v1/episodes/{self.episode_id}/reward",
            "RLKUBE_EPISODE": json.dumps(self.task),
        }
        self.deadline = time.monotonic() + timeout
        # Its own process group (start_new_session), killed whole on timeout.
        self.proc = subprocess.Popen(
            list(command), env=env, stdout=subprocess.DEVNULL, stderr=self.err, start_new_session=True
        )

    def ended(self) -> bool:
        """Whether the process has ended, killing it first when past its deadline."""
        assert self.proc is not None
        self.code = self.proc.poll()
        if self.code is None and time.monotonic() >= self.deadline:
            self.kill()
            return True
        return self.code is not None

    def kill(self) -> None:
        """Its process group, whole (its own children too)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def outcome(self, endpoint: Endpoint, require_reward: bool, timeout: float) -> Outcome:
        self.err.seek(0)
        stderr = self.err.read().decode(errors="replace")
        record = endpoint.close_episode(self.episode_id)
        lost = _lost_reason(self.code, record, stderr, require_reward, timeout)
        if lost is not None:
            log.warning("episode %s lost: %s", self.episode_id, lost)
        return Outcome(self.episode_id, None if lost else record, lost)
