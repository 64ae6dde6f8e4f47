"""GSM8K: the answer follows `#### ` at the end of the response, as in the dataset's own
solutions; right is 1.0, anything else 0.0 (verl's gsm8k scorer, method "strict")."""

from __future__ import annotations

import re
from typing import Any

# Only the end of a long response is searched: the answer line is last, and a regular
# expression over tens of thousands of characters costs more than the rest of scoring.
_TAIL_CHARS = 300
_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


def extract_solution(solution_str: str) -> str | None:
    """The last `#### <number>` of the response, without thousands separators."""
    found = _ANSWER.findall(solution_str[-_TAIL_CHARS:])
    if not found:
        return None
    return str(found[-1]).replace(",", "").replace("$", "")


def compute_score(solution_str: str, ground_truth: Any) -> dict[str, Any]:
    answer = extract_solution(solution_str)
    correct = answer is not None and answer == str(ground_truth).replace(",", "")
    return {"score": 1.0 if correct else 0.0, "pred": answer or ""}
