"""A user's reward function: loading it from a file or a module, and reading what it returned.

Free of torch and transformers: the reward pool's worker processes import this module and the
user's file, nothing heavier (pool.py).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, SupportsFloat, cast

RewardFunction = Callable[..., Any]

# verl calls reward functions with these keywords, so a function must accept them by name.
REWARD_FUNCTION_PARAMETERS = ("data_source", "solution_str", "ground_truth", "extra_info")


class RewardFunctionError(RuntimeError):
    """A reward function that cannot be loaded, or that failed or returned something unusable on a row."""


@dataclass(frozen=True)
class FunctionSource:
    """Where a reward function is defined, as a worker process finds it again: a file
    (reward.function.path) or an importable module (the built-in scorers)."""

    name: str
    path: str | None = None
    module: str | None = None

    def load(self) -> RewardFunction:
        if self.path is not None:
            return load_reward_function(self.path, self.name)
        assert self.module is not None
        return cast(RewardFunction, getattr(importlib.import_module(self.module), self.name))


def load_reward_function(path: str | Path, name: str = "compute_score") -> RewardFunction:
    """Imports a Python file and returns its function `name`, checked to accept verl's arguments."""
    file = Path(path)
    if not file.is_file():
        raise RewardFunctionError(f"reward function file {path} does not exist")
    module = _import_file(file)
    function = getattr(module, name, None)
    if function is None:
        defined = sorted(attr for attr, value in vars(module).items() if inspect.isfunction(value))
        raise RewardFunctionError(f"{path} defines no {name!r} (functions defined: {defined})")
    if not callable(function):
        raise RewardFunctionError(f"{path}: {name!r} is a {type(function).__name__}, not a function")
    _check_signature(function, f"{path}: {name}")
    return cast(RewardFunction, function)


def _import_file(file: Path) -> ModuleType:
    # An explicit source loader imports any file name: a ConfigMap key need not end in ".py".
    module_name = f"rlkube_reward_{abs(hash(str(file.resolve())))}"
    loader = importlib.machinery.SourceFileLoader(module_name, str(file))
    spec = importlib.util.spec_from_file_location(module_name, file, loader=loader)
    if spec is None:
        raise RewardFunctionError(f"reward function file {file} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    # Registered before running, as a normal import would be: dataclasses and pickling in the user's
    # file look their module up in sys.modules.
    sys.modules[module_name] = module
    try:
        loader.exec_module(module)
    except SyntaxError as err:
        del sys.modules[module_name]
        raise RewardFunctionError(f"{file}:{err.lineno}: syntax error: {err.msg}") from err
    except Exception as err:
        del sys.modules[module_name]
        raise RewardFunctionError(f"importing reward function file {file} failed: {type(err).__name__}: {err}") from err
    return module


def _check_signature(function: RewardFunction, what: str) -> None:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # some builtins and extension functions have none to inspect
        return
    try:
        signature.bind(**dict.fromkeys(REWARD_FUNCTION_PARAMETERS))
    except TypeError as err:
        raise RewardFunctionError(
            f"{what}{signature} must accept (data_source, solution_str, ground_truth, extra_info=None): {err}"
        ) from err


# --------------------------------------------------------------------------- what it returned


def parse_result(result: Any, where: str) -> tuple[float, dict[str, float]]:
    """The score and the other numbers of a result: a number, or a dict with a "score" key."""
    if isinstance(result, Mapping):
        if "score" not in result:
            raise RewardFunctionError(f"{where} returned a dict without a 'score' key: {sorted(result)}")
        row_metrics = {
            str(key): float(value)
            for key, value in result.items()
            if key != "score" and isinstance(value, SupportsFloat)
        }
        return _as_score(result["score"], where), row_metrics
    return _as_score(result, where), {}


def text_entries(result: Any) -> dict[str, str]:
    if not isinstance(result, Mapping):
        return {}
    return {str(key): value for key, value in result.items() if isinstance(value, str)}


def _as_score(value: Any, where: str) -> float:
    # SupportsFloat covers Python and numpy numbers and one-element tensors, but not strings.
    if not isinstance(value, SupportsFloat):
        raise RewardFunctionError(f"{where} returned {value!r}; expected a number or a dict with a 'score'")
    score = float(value)
    # A NaN or infinite reward would silently poison every advantage in the batch.
    if not math.isfinite(score):
        raise RewardFunctionError(f"{where} returned a non-finite score {score}")
    return score


def align_metrics(metrics: Sequence[Mapping[str, float]]) -> dict[str, list[float]]:
    names = list(dict.fromkeys(name for row in metrics for name in row))
    return {name: [row.get(name, math.nan) for row in metrics] for name in names}


# --------------------------------------------------------------------------- calling it on rows

# One call's keywords: REWARD_FUNCTION_PARAMETERS.
Call = dict[str, Any]


@dataclass(frozen=True)
class CallFailed:
    """A call that produced no result: the function raised, ran past its time, or its process died."""

    why: str  # e.g. "raised ValueError: ...", "timed out after 2 s (reward.timeoutSeconds)"
    # The exception itself where it was raised in this process (its traceback is the user's).
    error: Exception | None = field(default=None, compare=False)


def serial_calls(function: RewardFunction, calls: Sequence[Call], stop_on_failure: bool) -> list[Any]:
    """The results in row order, in this process; a failure is a CallFailed in its row's place
    (with stop_on_failure, the last entry: the rows after it are not called)."""
    results: list[Any] = []
    for call in calls:
        try:
            results.append(function(**call))
        except Exception as err:
            results.append(CallFailed(f"raised {type(err).__name__}: {err}", err))
            if stop_on_failure:
                break
    return results
