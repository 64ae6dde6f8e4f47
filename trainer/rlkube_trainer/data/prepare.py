"""`rlkube-trainer data gsm8k|math SRC DEST`: the Hugging Face parquet files of GSM8K and
MATH, already on disk, as verl-format rows with the instruction verl's preprocessing adds,
so that the built-in scorers (`rlkube_trainer.scorers`) score them without a reward file.

SRC is a parquet file or a folder of them (as the Hub lays a dataset out, e.g.
`main/train-00000-of-00001.parquet`); each file's split (train or test) comes from its name.
DEST is a folder: DEST/train.parquet, DEST/test.parquet.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rlkube_trainer.data.prompts import DataError
from rlkube_trainer.scorers.boxed import last_boxed

Row = dict[str, Any]

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
_GSM8K_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


def gsm8k_row(source: Row, split: str, index: int) -> Row:
    """openai/gsm8k (`question`, `answer` ending in `#### <number>`)."""
    question, answer = str(source["question"]), str(source["answer"])
    found = _GSM8K_ANSWER.search(answer)
    if found is None:
        raise DataError(f"gsm8k {split} row {index}: the answer has no '#### <number>' line")
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"{question} {GSM8K_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": found.group(1).replace(",", "")},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def math_row(source: Row, split: str, index: int) -> Row:
    """MATH (lighteval's copy: `problem`, `solution` with the answer in its last \\boxed{})."""
    problem, solution = str(source["problem"]), str(source["solution"])
    answer = last_boxed(solution)
    if answer is None:
        raise DataError(f"math {split} row {index}: the solution has no \\boxed{{}} answer")
    return {
        "data_source": "DigitalLearningGmbH/MATH-lighteval",
        "prompt": [{"role": "user", "content": f"{problem} {MATH_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index},
    }


@dataclass(frozen=True)
class Dataset:
    columns: tuple[str, ...]
    row: Callable[[Row, str, int], Row]


DATASETS = {"gsm8k": Dataset(("question", "answer"), gsm8k_row), "math": Dataset(("problem", "solution"), math_row)}


def split_of(path: Path) -> str:
    name = path.name.lower()
    for split in ("train", "test", "validation"):
        if name.startswith(split) or f"{split}-" in name or f"{split}." in name or f"_{split}" in name:
            return split
    return path.stem


def prepare(dataset: str, src: Path, dest: Path) -> dict[str, Path]:
    """Converts every parquet file under `src`; returns the written file of each split."""
    spec = DATASETS[dataset]
    files = [src] if src.is_file() else sorted(src.rglob("*.parquet"))
    if not files:
        raise DataError(f"no parquet files in {src}")
    rows: dict[str, list[Row]] = {}
    for file in files:
        table = pq.read_table(file)
        missing = [c for c in spec.columns if c not in table.column_names]
        if missing:
            raise DataError(f"{file}: no column {missing} for {dataset} (columns: {table.column_names})")
        split = split_of(file)
        out = rows.setdefault(split, [])
        for source in table.to_pylist():
            out.append(spec.row(source, split, len(out)))
    dest.mkdir(parents=True, exist_ok=True)
    written = {}
    for split, split_rows in rows.items():
        written[split] = dest / f"{split}.parquet"
        pq.write_table(pa.Table.from_pylist(split_rows), written[split])
    return written
