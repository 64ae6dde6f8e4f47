"""rlkube_trainer.data.prompts: reading verl-format rows, tokenizing prompts, the length policy and the resumable loader.

The tokenizer is a word-level one built here (nothing is downloaded), so every expected token id below
is read straight off VOCAB rather than recomputed by the code under test.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as pa_ipc
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rlkube_api.config import DataConfig
from rlkube_trainer.data.prompts import (
    DataError,
    Prompt,
    PromptDataset,
    PromptLoader,
    PromptTooLongError,
    read_data_file,
)

SPECIALS = ["[PAD]", "[UNK]", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
WORDS = ["what", "is", "one", "plus", "two", "three", "four", "five", "six", "be", "brief"]
VOCAB = {token: i for i, token in enumerate([*SPECIALS, *WORDS])}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(chat_template: bool = True) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(SPECIALS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="</s>", pad_token="[PAD]", unk_token="[UNK]"
    )
    if chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


def ids(text: str) -> list[int]:
    return [VOCAB[token] for token in text.split()]


def verl_row(index: int, words: str = "what is one plus two", ground_truth: Any = "three") -> dict[str, Any]:
    return {
        "data_source": "toy/arith",
        "prompt": [{"role": "user", "content": words}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"index": index, "split": "train"},
    }


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_arrow(path: Path, rows: list[dict[str, Any]], stream: bool) -> Path:
    table = pa.Table.from_pylist(rows)
    open_writer = pa_ipc.new_stream if stream else pa_ipc.new_file
    with pa.OSFile(str(path), "wb") as sink, open_writer(sink, table.schema) as writer:
        writer.write_table(table)
    return path


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def config(path: Path, **overrides: Any) -> DataConfig:
    return DataConfig(train_files=[str(path)], **overrides)


def dataset(path: Path, tokenizer: PreTrainedTokenizerFast, **overrides: Any) -> PromptDataset:
    return PromptDataset([path], tokenizer, config(path, **overrides))


# --------------------------------------------------------------------------- file formats

ROWS = [verl_row(0), verl_row(1, "what is two plus two", "four")]
EXPECTED_IDS = [ids("<|user|> what is one plus two <|assistant|>"), ids("<|user|> what is two plus two <|assistant|>")]


@pytest.mark.parametrize(
    "name, write",
    [
        ("train.parquet", write_parquet),
        ("train.arrow", lambda path, rows: write_arrow(path, rows, stream=False)),
        ("train.feather", lambda path, rows: write_arrow(path, rows, stream=False)),
        ("train-stream.arrow", lambda path, rows: write_arrow(path, rows, stream=True)),
        ("train.jsonl", write_jsonl),
        ("train.json", write_jsonl),
    ],
)
def test_each_format_reads_the_same_prompts(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast, name: str, write: Any
) -> None:
    path = write(tmp_path / name, ROWS)
    prompts = list(dataset(path, tokenizer))
    assert [p.prompt_token_ids for p in prompts] == EXPECTED_IDS
    assert prompts[1] == Prompt(
        index=1,
        uid=f"{path}#1",
        prompt_token_ids=EXPECTED_IDS[1],
        prompt_text="<|user|> what is two plus two <|assistant|>",
        raw_prompt=[{"role": "user", "content": "what is two plus two"}],
        data_source="toy/arith",
        ground_truth="four",
        extra_info={"index": 1, "split": "train"},
    )


def test_several_files_are_concatenated_in_order(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    first = write_parquet(tmp_path / "a.parquet", [verl_row(0, "one")])
    second = write_jsonl(tmp_path / "b.jsonl", [verl_row(0, "two"), verl_row(1, "three")])
    data = PromptDataset([first, second], tokenizer, config(first))
    assert [(p.index, p.uid, p.raw_prompt) for p in data] == [
        (0, f"{first}#0", [{"role": "user", "content": "one"}]),
        (1, f"{second}#0", [{"role": "user", "content": "two"}]),
        (2, f"{second}#1", [{"role": "user", "content": "three"}]),
    ]


def test_unknown_extension_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "train.csv"
    path.write_text("prompt\nhi\n")
    with pytest.raises(DataError, match=r"train\.csv: unknown extension '\.csv'"):
        read_data_file(path)


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nothere\.parquet does not exist"):
        read_data_file(tmp_path / "nothere.parquet")


def test_bad_json_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(verl_row(0)) + "\n{not json\n")
    with pytest.raises(DataError, match=r"train\.jsonl line 2: invalid JSON"):
        read_data_file(path)


def test_missing_column_names_the_setting_key_and_file(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    path = write_parquet(tmp_path / "train.parquet", ROWS)
    with pytest.raises(DataError, match=r"data\.prompt_key 'question' not in .*train\.parquet columns \['data_source'"):
        dataset(path, tokenizer, prompt_key="question")
    with pytest.raises(DataError, match=r"data\.ground_truth_key 'answer\.value' not in .*train\.parquet"):
        dataset(path, tokenizer, ground_truth_key="answer.value")


def test_missing_nested_ground_truth_names_the_row(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    rows = [verl_row(0), {**verl_row(1), "reward_model": {"style": "model"}}]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(DataError, match=r"train\.jsonl row 1: no 'reward_model\.ground_truth'"):
        dataset(path, tokenizer)


def test_ground_truth_is_optional_for_reward_models(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [{"data_source": "chat", "prompt": "what is one"}])
    data = PromptDataset([path], tokenizer, config(path), require_ground_truth=False)
    assert (data[0].ground_truth, data[0].extra_info) == (None, None)


# --------------------------------------------------------------------------- keys and prompts


def test_custom_keys_and_nested_ground_truth(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    rows = [
        {"source": "quiz", "question": "what is six", "meta": {"answer": {"value": 6}}, "info": {"id": "q7"}},
    ]
    path = write_parquet(tmp_path / "quiz.parquet", rows)
    data = dataset(
        path,
        tokenizer,
        prompt_key="question",
        reward_fn_key="source",
        ground_truth_key="meta.answer.value",
        extra_info_key="info",
    )
    # A plain-text prompt becomes a single user message for the chat template.
    assert data[0].prompt_token_ids == ids("<|user|> what is six <|assistant|>")
    assert (data[0].data_source, data[0].ground_truth, data[0].extra_info) == ("quiz", 6, {"id": "q7"})


def test_flat_column_named_like_a_dotted_path_wins(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    rows = [{"data_source": "flat", "prompt": "one", "reward_model.ground_truth": "flat-answer"}]
    path = write_jsonl(tmp_path / "flat.jsonl", rows)
    assert dataset(path, tokenizer)[0].ground_truth == "flat-answer"


def test_non_default_extra_info_key_must_exist(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", ROWS)
    with pytest.raises(DataError, match=r"data\.extra_info_key 'meta' not in .*train\.jsonl"):
        dataset(path, tokenizer, extra_info_key="meta")


def test_chat_template_applied_or_not(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is two"}]
    path = write_jsonl(tmp_path / "train.jsonl", [{**verl_row(0), "prompt": messages}])

    templated = dataset(path, tokenizer)[0]
    assert templated.prompt_token_ids == ids("<|system|> be brief <|user|> what is two <|assistant|>")

    # Without a template the message contents are joined, one per line.
    plain = dataset(path, tokenizer, apply_chat_template=False)[0]
    assert plain.prompt_token_ids == ids("be brief what is two")
    assert plain.prompt_text == "be brief\nwhat is two"

    # A tokenizer without a chat template falls back to the same, even when the config asks for one.
    no_template = dataset(path, build_tokenizer(chat_template=False))[0]
    assert no_template.prompt_token_ids == plain.prompt_token_ids


def test_malformed_prompt_names_the_row(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [verl_row(0), {**verl_row(1), "prompt": [{"text": "hi"}]}])
    with pytest.raises(DataError, match=r"train\.jsonl row 1: the prompt must be text or"):
        dataset(path, tokenizer)


# --------------------------------------------------------------------------- length policy

# Rows of 5, 3 and 7 tokens with the template: "<|user|> ... <|assistant|>".
LENGTH_ROWS = [verl_row(0, "one two three"), verl_row(1, "four"), verl_row(2, "one two three four five")]


def test_prompts_within_the_limit_are_kept_whole(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    path = write_parquet(tmp_path / "train.parquet", LENGTH_ROWS)
    data = dataset(path, tokenizer, max_prompt_length=7)
    assert [len(p.prompt_token_ids) for p in data] == [5, 3, 7]


def test_truncation_error_names_file_row_and_lengths(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    path = write_parquet(tmp_path / "train.parquet", LENGTH_ROWS)
    with pytest.raises(PromptTooLongError, match=r"train\.parquet row 2: prompt is 7 tokens, longer than .*=6"):
        dataset(path, tokenizer, max_prompt_length=6, truncation="error")


def test_left_truncation_drops_leading_tokens(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    path = write_parquet(tmp_path / "train.parquet", LENGTH_ROWS)
    data = dataset(path, tokenizer, max_prompt_length=4, truncation="left")
    assert [p.prompt_token_ids for p in data] == [
        ids("one two three <|assistant|>"),
        ids("<|user|> four <|assistant|>"),
        ids("three four five <|assistant|>"),
    ]
    assert data[2].prompt_text == "three four five <|assistant|>"


def test_right_truncation_drops_trailing_tokens(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    path = write_parquet(tmp_path / "train.parquet", LENGTH_ROWS)
    data = dataset(path, tokenizer, max_prompt_length=4, truncation="right")
    assert [p.prompt_token_ids for p in data] == [
        ids("<|user|> one two three"),
        ids("<|user|> four <|assistant|>"),
        ids("<|user|> one two three"),
    ]


def test_filter_overlong_drops_and_reports(
    tmp_path: Path, tokenizer: PreTrainedTokenizerFast, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_parquet(tmp_path / "train.parquet", LENGTH_ROWS)
    with caplog.at_level(logging.WARNING, logger="rlkube_trainer.data.prompts"):
        # The filter wins over truncation="error": overlong rows are dropped, not fatal.
        data = dataset(path, tokenizer, max_prompt_length=4, filter_overlong_prompts=True, truncation="error")
    assert data.num_filtered == 2
    assert [(p.index, p.uid, p.prompt_token_ids) for p in data] == [
        (0, f"{path}#1", ids("<|user|> four <|assistant|>"))
    ]
    assert "dropped 2 of 3 prompts" in caplog.text


# --------------------------------------------------------------------------- loader


def make_prompts(n: int) -> list[Prompt]:
    return [Prompt(i, f"p#{i}", [i], str(i), str(i), "toy", None, None) for i in range(n)]


def indices(batches: list[list[Prompt]]) -> list[list[int]]:
    return [[p.index for p in batch] for batch in batches]


def run_epochs(loader: PromptLoader, epochs: int) -> list[list[int]]:
    seen: list[list[Prompt]] = []
    while loader.epoch < epochs:
        seen.extend(loader)
    return indices(seen)


def test_loader_batches_cover_each_epoch_and_drop_the_rest() -> None:
    loader = PromptLoader(make_prompts(10), batch_size=3, shuffle=True, seed=5)
    assert len(loader) == 3
    first_epoch = indices(list(loader))
    assert [len(b) for b in first_epoch] == [3, 3, 3]
    assert len({i for b in first_epoch for i in b}) == 9
    assert loader.state_dict() == {"epoch": 1, "batch_in_epoch": 0}


def test_loader_without_shuffle_keeps_dataset_order() -> None:
    loader = PromptLoader(make_prompts(5), batch_size=2, shuffle=False, seed=0, drop_last=False)
    assert len(loader) == 3
    assert indices(list(loader)) == [[0, 1], [2, 3], [4]]


def test_loader_order_depends_only_on_seed_and_epoch() -> None:
    prompts = make_prompts(16)
    a = run_epochs(PromptLoader(prompts, batch_size=4, shuffle=True, seed=7), epochs=3)
    b = run_epochs(PromptLoader(prompts, batch_size=4, shuffle=True, seed=7), epochs=3)
    other_seed = run_epochs(PromptLoader(prompts, batch_size=4, shuffle=True, seed=8), epochs=3)
    assert a == b
    assert a != other_seed
    assert a[0:4] != a[4:8]  # epochs are shuffled differently
    fresh = PromptLoader(prompts, batch_size=4, shuffle=True, seed=7)
    assert fresh.epoch_order(2) == [i for batch in a[8:12] for i in batch]


def test_loader_resumes_mid_epoch_with_the_identical_remaining_sequence() -> None:
    prompts = make_prompts(14)
    reference = run_epochs(PromptLoader(prompts, batch_size=4, shuffle=True, seed=3), epochs=3)  # 3 batches/epoch

    interrupted = PromptLoader(prompts, batch_size=4, shuffle=True, seed=3)
    consumed: list[list[Prompt]] = list(interrupted)  # epoch 0
    batches = iter(interrupted)
    consumed.append(next(batches))  # epoch 1, batch 0: then the run is killed
    state = interrupted.state_dict()
    assert state == {"epoch": 1, "batch_in_epoch": 1}

    resumed = PromptLoader(prompts, batch_size=4, shuffle=True, seed=3)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # as written to and read from a checkpoint
    assert indices(consumed) + run_epochs(resumed, epochs=3) == reference


def test_loader_state_after_the_last_batch_points_at_the_next_epoch() -> None:
    loader = PromptLoader(make_prompts(4), batch_size=2, shuffle=True, seed=1)
    batches = iter(loader)
    next(batches)
    next(batches)
    assert loader.state_dict() == {"epoch": 1, "batch_in_epoch": 0}


def test_loader_rejects_a_dataset_smaller_than_a_batch() -> None:
    with pytest.raises(DataError, match=r"3 prompts, fewer than one batch of 4"):
        PromptLoader(make_prompts(3), batch_size=4, shuffle=False, seed=0)


def test_loader_rejects_a_state_beyond_the_epoch() -> None:
    loader = PromptLoader(make_prompts(8), batch_size=4, shuffle=False, seed=0)
    with pytest.raises(ValueError, match=r"batch 2 but an epoch has 2 batches"):
        loader.load_state_dict({"epoch": 0, "batch_in_epoch": 2})
