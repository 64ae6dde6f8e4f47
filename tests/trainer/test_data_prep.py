"""`rlkube-trainer data gsm8k|math SRC DEST` on small files laid out as the Hub lays them out."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlkube_trainer.data.prepare import GSM8K_INSTRUCTION, MATH_INSTRUCTION, split_of
from rlkube_trainer.pod.cli import main
from rlkube_trainer.scorers import default_compute_score


def _write(path: Path, rows: list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_gsm8k(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "gsm8k"
    _write(
        src / "main" / "train-00000-of-00001.parquet",
        [
            {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
            {"question": "A big one?", "answer": "lots\n#### 1,200"},
        ],
    )
    _write(src / "main" / "test-00000-of-00001.parquet", [{"question": "Q?", "answer": "#### -3"}])
    assert main(["data", "gsm8k", str(src), str(tmp_path / "out")]) == 0
    assert "train: " in capsys.readouterr().out
    train = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    assert train[0] == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"Tom has 3 apples and buys 4. How many? {GSM8K_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "7"},
        "extra_info": {
            "split": "train",
            "index": 0,
            "answer": "3 + 4 = <<3+4=7>>7\n#### 7",
            "question": "Tom has 3 apples and buys 4. How many?",
        },
    }
    assert train[1]["reward_model"]["ground_truth"] == "1200"
    test = pq.read_table(tmp_path / "out" / "test.parquet").to_pylist()
    assert test[0]["reward_model"]["ground_truth"] == "-3" and test[0]["extra_info"]["index"] == 0
    # The built-in scorer reads these rows as they are.
    assert (
        default_compute_score(train[1]["data_source"], "so #### 1200", train[1]["reward_model"]["ground_truth"])[
            "score"
        ]
        == 1.0
    )


def test_math(tmp_path: Path) -> None:
    src = tmp_path / "test.parquet"
    _write(
        src,
        [
            {
                "problem": "What is $1/2 + 1/2$?",
                "solution": "It is $\\boxed{1}$, or \\boxed{\\frac{2}{2}}.",
                "level": "1",
            }
        ],
    )
    assert main(["data", "math", str(src), str(tmp_path / "out")]) == 0
    [row] = pq.read_table(tmp_path / "out" / "test.parquet").to_pylist()
    assert row["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
    assert row["prompt"] == [{"role": "user", "content": f"What is $1/2 + 1/2$? {MATH_INSTRUCTION}"}]
    assert row["reward_model"] == {"style": "rule", "ground_truth": "\\frac{2}{2}"}  # the last boxed answer
    assert row["extra_info"] == {"split": "test", "index": 0}
    assert default_compute_score(row["data_source"], "\\boxed{1}", row["reward_model"]["ground_truth"])["score"] == 1.0


def test_wrong_columns_name_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path / "train.parquet", [{"problem": "p", "solution": "s"}])
    assert main(["data", "gsm8k", str(tmp_path / "train.parquet"), str(tmp_path / "out")]) == 2
    assert "train.parquet: no column ['question', 'answer'] for gsm8k" in capsys.readouterr().err


def test_split_of() -> None:
    assert split_of(Path("train-00000-of-00001.parquet")) == "train"
    assert split_of(Path("test.parquet")) == "test"
    assert split_of(Path("gsm8k_test.parquet")) == "test"
    assert split_of(Path("other.parquet")) == "other"
