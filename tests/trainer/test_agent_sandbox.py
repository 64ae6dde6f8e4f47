"""The code-interpreter sandbox contains hostile code and reports a clear error."""

from __future__ import annotations

from rlkube_trainer.rollout.agent.sandbox import SandboxLimits, run_python

_FAST = SandboxLimits(cpu_seconds=2, wall_seconds=5.0, memory_bytes=256 * 1024 * 1024)


def test_ordinary_code_runs() -> None:
    result = run_python("print(6 * 7)", _FAST)
    assert result.ok and result.stdout.strip() == "42"


def test_infinite_loop_is_killed() -> None:
    result = run_python("while True:\n    pass\n", _FAST)
    assert not result.ok and result.error is not None


def test_fork_bomb_is_contained() -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = run_python(code, _FAST)
    assert not result.ok and result.error is not None


def test_10gb_allocation_fails() -> None:
    result = run_python("x = bytearray(10 * 1024**3)\n", _FAST)
    assert not result.ok and result.error is not None and "MemoryError" in result.error


def test_socket_cannot_reach_network() -> None:
    code = "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\n"
    result = run_python(code, _FAST)
    assert not result.ok and result.error is not None


def test_output_is_capped() -> None:
    result = run_python("print('x' * 100000)", _FAST)
    assert result.ok and len(result.stdout) == _FAST.max_output_bytes
