"""The code-interpreter sandbox contains hostile code and reports a clear error."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

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


def test_reading_etc_passwd_is_refused() -> None:
    result = run_python("print(open('/etc/passwd').read())", _FAST)
    assert not result.ok and result.error is not None and "PermissionError" in result.error
    assert "root:" not in result.stdout


def test_only_the_scratch_directory_is_readable_and_writable() -> None:
    outside = Path(tempfile.mkdtemp(prefix="rlkube-sandbox-test-"))
    try:
        (outside / "secret").write_text("s3cr3t")
        code = (
            "import os\n"
            "open('notes.txt', 'w').write('kept')\n"  # the scratch dir is the working directory
            "print(open('notes.txt').read())\n"
            f"for path in ({str(outside / 'secret')!r}, {__file__!r}):\n"
            "    try:\n"
            "        open(path).read(); print('READ', path)\n"
            "    except PermissionError:\n"
            "        print('denied')\n"
            f"try:\n    open({str(outside / 'new')!r}, 'w')\nexcept PermissionError:\n    print('denied')\n"
            "try:\n    os.listdir('/')\nexcept PermissionError:\n    print('denied')\n"
        )
        result = run_python(code, _FAST)
        assert result.ok, result.stderr
        assert result.stdout.split() == ["kept", "denied", "denied", "denied", "denied"], result.stdout
        assert not (outside / "new").exists()
    finally:
        shutil.rmtree(outside)


def test_the_interpreter_runs_its_standard_library_inside_the_confinement() -> None:
    result = run_python(
        "import json, decimal, collections\nprint(json.dumps({'a': str(decimal.Decimal(1) / 8)}))", _FAST
    )
    assert result.ok and result.stdout.strip() == '{"a": "0.125"}', result.stderr
