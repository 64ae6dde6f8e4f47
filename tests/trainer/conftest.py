"""Fixtures the trainer's tests share."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from rlkube_e2e.errors import ClusterError
from rlkube_e2e.s3server import S3Server


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3"))
    try:
        server.start()
    except ClusterError as error:
        pytest.fail(f"S3 server: {error}", pytrace=False)
    saved = {k: os.environ.get(k) for k in server.client_env()}
    os.environ.update(server.client_env())
    try:
        yield server
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
