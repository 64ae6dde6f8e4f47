"""Name → function registries, the way verl's ``core_algos`` selects its math by config string.

Each kind keeps its registry in its own module (advantage.py, policy_loss.py), which the modules
of its families register into; this module holds only what the kinds share: registering (a different function under a taken name fails),
looking up (an unknown name fails, listing the known ones) and calling a function with the
arguments it names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["call_with", "lookup", "register", "takes"]

_FnT = TypeVar("_FnT", bound=Callable[..., Any])


def register(registry: dict[str, Any], kind: str, name: str) -> Callable[[_FnT], _FnT]:
    """Decorator adding a function to ``registry`` under ``name``."""

    def decorator(fn: _FnT) -> _FnT:
        existing = registry.get(name)
        if existing is not None and existing is not fn:
            raise ValueError(f"{kind} {name!r} is already registered to {existing!r}")
        registry[name] = fn
        return fn

    return decorator


def lookup(registry: dict[str, _FnT], kind: str, name: str) -> _FnT:
    """The function registered as ``name``; ValueError listing the known names otherwise."""
    try:
        return registry[name]
    except KeyError:
        known = ", ".join(sorted(registry))
        raise ValueError(f"unknown {kind} {name!r}; known: {known}") from None


def call_with(fn: Callable[..., Any], **available: Any) -> Any:
    """Calls fn with the arguments it names, from those available (estimators and losses
    differ in what they need: values for gae, the group index for grpo, tau_pos for sapo, ...)."""
    params = inspect.signature(fn).parameters
    return fn(**{name: value for name, value in available.items() if name in params})


def takes(fn: Callable[..., Any], name: str) -> bool:
    """Whether fn names the argument `name`: the loop produces an input some estimators alone
    read (ReMax's reward_baselines, the optimal token baseline's sum_pi_squared) only for those."""
    return name in inspect.signature(fn).parameters
