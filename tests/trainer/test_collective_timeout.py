"""trainer.ncclTimeout (verl's nccl_timeout) reaches the groups a rank builds: a collective
whose peer never comes fails after it, instead of after the built-in 300 s."""

from __future__ import annotations

import datetime
import threading
import time
from pathlib import Path

import pytest
import torch

from rlkube_trainer.loop.assembly import free_port
from rlkube_trainer.workers.weight_sync import WeightSyncGroup


def test_a_collective_without_its_peer_fails_after_the_configured_timeout() -> None:
    port, timeout = free_port(), datetime.timedelta(seconds=2)
    groups: dict[int, WeightSyncGroup] = {}

    def join(rank: int) -> None:
        groups[rank] = WeightSyncGroup("127.0.0.1", port, 2, rank, torch.device("cpu"), timeout, senders=1)

    threads = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert set(groups) == {0, 1}
    start = time.monotonic()
    with pytest.raises(RuntimeError):
        # Rank 1 never takes part: the broadcast must give up after 2 s, not 300.
        groups[0].groups[0].allreduce([torch.ones(4)]).wait()
    assert time.monotonic() - start < 60


def test_the_rank_takes_the_timeout_from_the_config() -> None:
    from rlkube_api.config import TrainerConfig  # noqa: PLC0415
    from rlkube_api.placement import placement_of  # noqa: PLC0415
    from rlkube_trainer.loop.assembly import rank_specs  # noqa: PLC0415
    from rlkube_trainer.tiny.task import trainer_config  # noqa: PLC0415
    from rlkube_trainer.workers.rank import Rank  # noqa: PLC0415

    raw = trainer_config(Path("/work"))
    raw["trainer"]["nccl_timeout"] = 45
    config = TrainerConfig.model_validate(raw)
    placement = placement_of(config).in_one_process()
    spec = rank_specs(placement, placement.groups[0], 1)[0]
    assert Rank(config.model_dump(mode="json"), spec).collective_timeout == datetime.timedelta(seconds=45)
