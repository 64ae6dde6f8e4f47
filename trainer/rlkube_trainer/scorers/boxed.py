"""MATH-style answers: the response's last `\\boxed{...}` against the ground truth, compared
for mathematical equivalence by Hugging Face's math-verify (1/2, 0.5 and \\frac12 agree),
as verl's math_verify scorer does. A response without a parsable answer scores 0.0."""

from __future__ import annotations

import threading
from typing import Any

from math_verify import parse, verify

# math-verify bounds parsing and comparison with SIGALRM, which exists only in the main
# thread; elsewhere (a Ray actor's thread pool) the bound is off rather than an error.
_TIMEOUT_SECONDS = 5


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def compute_score(solution_str: str, ground_truth: Any) -> dict[str, Any]:
    timeout = _TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None
    truth = str(ground_truth)
    try:
        gold = parse(f"\\boxed{{{truth}}}", parsing_timeout=timeout)
        answer = parse(solution_str, parsing_timeout=timeout)
        correct = bool(gold) and bool(answer) and verify(gold, answer, timeout_seconds=timeout)
    except Exception:  # math-verify's own timeouts and parser failures: not a right answer
        correct = False
    return {"score": 1.0 if correct else 0.0, "pred": last_boxed(solution_str) or ""}
