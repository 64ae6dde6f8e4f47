"""Training prompts: verl-format rows read from files, tokenized, and handed out in a resumable order.

A row holds `data_source`, `prompt` (a chat-message list `[{role, content}, ...]` or plain text),
`ability`, `reward_model: {style, ground_truth}` and `extra_info`. The column names come from
`DataConfig` (`prompt_key`, `reward_fn_key`, `ground_truth_key` as a dotted path, `extra_info_key`), so
other datasets work without rewriting them. Files are chosen by extension: `.parquet`, `.arrow` /
`.feather` (Arrow IPC, file or stream format) and `.jsonl` / `.json` (JSON lines).

Prompt length policy (lengths in tokens, after the chat template):

- a prompt no longer than `max_prompt_length` is kept as is;
- `filter_overlong_prompts=True`: longer prompts are dropped while the dataset is built; how many is
  logged as a warning and kept in `PromptDataset.num_filtered`;
- otherwise `truncation` decides: "error" raises `PromptTooLongError` naming the file, the row and both
  lengths; "left" / "right" drop whole tokens from that side. Truncation works on token ids, so a token
  is never cut in half.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict, overload

import pyarrow as pa
import pyarrow.ipc as pa_ipc
import pyarrow.parquet as pq
from transformers import PreTrainedTokenizerBase

from rlkube_api.config import DataConfig

logger = logging.getLogger(__name__)

Message = dict[str, str]
RawPrompt = str | list[Message]
Truncation = Literal["error", "left", "right"]

PARQUET_SUFFIXES = (".parquet",)
ARROW_SUFFIXES = (".arrow", ".feather")
JSON_LINES_SUFFIXES = (".jsonl", ".json")

# Rows are tokenized in chunks: the fast tokenizers parallelise a batch, one call per row is slow.
_TOKENIZE_CHUNK = 1024


class DataError(ValueError):
    """A data file or row the trainer cannot use; the message names the file (and row)."""


class PromptTooLongError(DataError):
    """A prompt longer than data.max_prompt_length with data.truncation "error"."""


# --------------------------------------------------------------------------- reading files


@dataclass(frozen=True)
class DataFile:
    """The rows of one data file, as Python objects, with the file's column names."""

    path: str
    columns: list[str]
    rows: list[dict[str, Any]]


def read_data_file(path: str | Path) -> DataFile:
    """Reads a parquet, Arrow IPC or JSON-lines file, chosen by its extension."""
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix not in (*PARQUET_SUFFIXES, *ARROW_SUFFIXES, *JSON_LINES_SUFFIXES):
        known = ", ".join((*PARQUET_SUFFIXES, *ARROW_SUFFIXES, *JSON_LINES_SUFFIXES))
        raise DataError(f"data file {path}: unknown extension {file.suffix!r} (expected one of {known})")
    if not file.is_file():
        raise FileNotFoundError(f"data file {path} does not exist")
    if suffix in JSON_LINES_SUFFIXES:
        return _read_json_lines(str(path), file)
    try:
        table = pq.read_table(file) if suffix in PARQUET_SUFFIXES else _read_arrow_ipc(file)
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"data file {path} could not be read: {err}") from err
    return DataFile(path=str(path), columns=list(table.column_names), rows=table.to_pylist())


def _read_arrow_ipc(file: Path) -> pa.Table:
    # Both IPC layouts use these extensions: the random-access file format (Feather v2) and the
    # stream format; the file format has a magic header, so try it first.
    try:
        with pa_ipc.open_file(file) as reader:
            return reader.read_all()
    except pa.ArrowInvalid:
        with pa_ipc.open_stream(file) as stream:
            return stream.read_all()


def _read_json_lines(path: str, file: Path) -> DataFile:
    # Parsed with the json module rather than pyarrow.json: values such as ground truths may be a
    # string in one row and a list in the next, which Arrow's schema inference refuses.
    rows: list[dict[str, Any]] = []
    columns: dict[str, None] = {}  # insertion-ordered set: the union of the rows' keys
    with file.open(encoding="utf-8") as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"data file {path} line {line_number}: invalid JSON: {err}") from err
            if not isinstance(row, dict):
                raise DataError(
                    f"data file {path} line {line_number}: expected one JSON object per line (JSON lines), "
                    f"got {type(row).__name__}"
                )
            rows.append(row)
            columns.update(dict.fromkeys(row))
    return DataFile(path=path, columns=list(columns), rows=rows)


# --------------------------------------------------------------------------- row fields


@dataclass(frozen=True)
class RowKeys:
    """Where a row's fields are, as configured in DataConfig."""

    prompt: str
    data_source: str
    ground_truth: str
    extra_info: str
    require_ground_truth: bool = True

    @classmethod
    def from_config(cls, cfg: DataConfig, require_ground_truth: bool = True) -> RowKeys:
        return cls(cfg.prompt_key, cfg.reward_fn_key, cfg.ground_truth_key, cfg.extra_info_key, require_ground_truth)

    def check_columns(self, data: DataFile) -> None:
        """Fails when a configured column is absent, before any row is processed."""
        required = [("data.prompt_key", self.prompt), ("data.reward_fn_key", self.data_source)]
        if self.require_ground_truth:
            required.append(("data.ground_truth_key", self.ground_truth))
        # extra_info is optional in verl's format; a non-default key that is missing is a typo.
        if self.extra_info != DataConfig.model_fields["extra_info_key"].default:
            required.append(("data.extra_info_key", self.extra_info))
        for setting, key in required:
            if _column_of(key, data.columns) not in data.columns:
                raise DataError(f"{setting} {key!r} not in {data.path} columns {data.columns}")


def _column_of(key: str, columns: Sequence[str]) -> str:
    # A column literally named "reward_model.ground_truth" (flattened data) wins over the nested path.
    return key if key in columns else key.split(".", 1)[0]


def lookup(row: Mapping[str, Any], key: str, where: str) -> Any:
    """The value at `key` in a row: a column name or a dotted path into nested records."""
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise DataError(f"{where}: no {key!r} in the row")
        value = value[part]
    return value


def as_chat_messages(prompt: RawPrompt) -> list[Message]:
    """A plain-text prompt becomes a single user message."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt


def join_message_contents(prompt: RawPrompt) -> str:
    """The text of a prompt for a tokenizer without a chat template: message contents, one per line."""
    return prompt if isinstance(prompt, str) else "\n".join(message["content"] for message in prompt)


def _parse_raw_prompt(value: Any, where: str) -> RawPrompt:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(_is_message(item) for item in value):
        return [{"role": item["role"], "content": item["content"]} for item in value]
    raise DataError(
        f"{where}: the prompt must be text or a non-empty list of {{role, content}} messages, got {value!r}"
    )


def _is_message(item: Any) -> bool:
    return isinstance(item, Mapping) and isinstance(item.get("role"), str) and isinstance(item.get("content"), str)


# --------------------------------------------------------------------------- dataset


@dataclass(frozen=True)
class Prompt:
    """One training prompt, ready for rollout and reward."""

    index: int  # position in the dataset; samples of the same prompt are grouped by it (GRPO, RLOO)
    uid: str  # "<file>#<row>": the source row, stable when other rows are filtered out
    prompt_token_ids: list[int]
    prompt_text: str  # the text the ids were tokenized from (decoded from the kept ids when truncated)
    raw_prompt: RawPrompt  # as in the row: a reward model applies its own chat template to it
    data_source: str
    ground_truth: Any
    extra_info: Any


@dataclass(frozen=True)
class _PendingRow:
    uid: str
    where: str  # "<file> row <n>", for error messages
    raw_prompt: RawPrompt
    data_source: str
    ground_truth: Any
    extra_info: Any


class PromptDataset(Sequence[Prompt]):
    """The prompts of some data files, tokenized and length-checked up-front (see the module docstring).

    `require_ground_truth=False` suits reward models, which score without a ground truth.
    """

    def __init__(
        self,
        files: Sequence[str | Path],
        tokenizer: PreTrainedTokenizerBase,
        cfg: DataConfig,
        require_ground_truth: bool = True,
    ) -> None:
        if not files:
            raise DataError("no data files given")
        keys = RowKeys.from_config(cfg, require_ground_truth)
        self.use_chat_template = cfg.apply_chat_template and bool(getattr(tokenizer, "chat_template", None))
        self.num_filtered = 0
        self._prompts: list[Prompt] = []
        for path in files:
            data = read_data_file(path)
            keys.check_columns(data)
            self._add_file(data, keys, tokenizer, cfg)
        if self.num_filtered:
            logger.warning(
                "dropped %d of %d prompts longer than data.max_prompt_length=%d tokens (data.filter_overlong_prompts)",
                self.num_filtered,
                self.num_filtered + len(self._prompts),
                cfg.max_prompt_length,
            )

    def _add_file(self, data: DataFile, keys: RowKeys, tokenizer: PreTrainedTokenizerBase, cfg: DataConfig) -> None:
        pending = [_pending_row(data.path, row_number, row, keys) for row_number, row in enumerate(data.rows)]
        for start in range(0, len(pending), _TOKENIZE_CHUNK):
            chunk = pending[start : start + _TOKENIZE_CHUNK]
            texts = [self._render(tokenizer, row.raw_prompt) for row in chunk]
            # The chat template already places BOS and the like; adding special tokens would double them.
            encoded = tokenizer(texts, add_special_tokens=not self.use_chat_template)["input_ids"]
            for row, text, token_ids in zip(chunk, texts, encoded, strict=True):
                self._add_prompt(row, text, list(token_ids), tokenizer, cfg)

    def _render(self, tokenizer: PreTrainedTokenizerBase, prompt: RawPrompt) -> str:
        if not self.use_chat_template:
            return join_message_contents(prompt)
        text = tokenizer.apply_chat_template(as_chat_messages(prompt), add_generation_prompt=True, tokenize=False)
        assert isinstance(text, str)  # tokenize=False returns the rendered text
        return text

    def _add_prompt(
        self, row: _PendingRow, text: str, token_ids: list[int], tokenizer: PreTrainedTokenizerBase, cfg: DataConfig
    ) -> None:
        limit = cfg.max_prompt_length
        if len(token_ids) > limit:
            if cfg.filter_overlong_prompts:
                self.num_filtered += 1
                return
            token_ids = truncate_prompt(token_ids, limit, cfg.truncation, row.where)
            decoded = tokenizer.decode(token_ids)
            assert isinstance(decoded, str)  # one sequence of ids decodes to one string
            text = decoded
        self._prompts.append(
            Prompt(
                index=len(self._prompts),
                uid=row.uid,
                prompt_token_ids=token_ids,
                prompt_text=text,
                raw_prompt=row.raw_prompt,
                data_source=row.data_source,
                ground_truth=row.ground_truth,
                extra_info=row.extra_info,
            )
        )

    def __len__(self) -> int:
        return len(self._prompts)

    @overload
    def __getitem__(self, index: int) -> Prompt: ...
    @overload
    def __getitem__(self, index: slice) -> list[Prompt]: ...
    def __getitem__(self, index: int | slice) -> Prompt | list[Prompt]:
        return self._prompts[index]


def _pending_row(path: str, row_number: int, row: Mapping[str, Any], keys: RowKeys) -> _PendingRow:
    where = f"{path} row {row_number}"
    return _PendingRow(
        uid=f"{path}#{row_number}",
        where=where,
        raw_prompt=_parse_raw_prompt(lookup(row, keys.prompt, where), where),
        data_source=str(lookup(row, keys.data_source, where)),
        ground_truth=lookup(row, keys.ground_truth, where)
        if keys.require_ground_truth
        else _get(row, keys.ground_truth),
        extra_info=_get(row, keys.extra_info),
    )


def _get(row: Mapping[str, Any], key: str) -> Any:
    try:
        return lookup(row, key, "")
    except DataError:
        return None


def truncate_prompt(token_ids: list[int], limit: int, truncation: Truncation, where: str) -> list[int]:
    """Applies data.truncation to a prompt longer than `limit` tokens."""
    if truncation == "left":
        return token_ids[len(token_ids) - limit :]
    if truncation == "right":
        return token_ids[:limit]
    raise PromptTooLongError(
        f"{where}: prompt is {len(token_ids)} tokens, longer than data.max_prompt_length={limit} "
        "(set data.truncation to left or right, or data.filter_overlong_prompts)"
    )


# --------------------------------------------------------------------------- loader


class LoaderState(TypedDict):
    epoch: int
    batch_in_epoch: int  # the next batch to hand out


class PromptLoader:
    """Batches of prompts, epoch after epoch, in an order that a checkpoint can resume exactly.

    The order of an epoch depends only on the seed and the epoch number, so a resumed run that loads
    `state_dict()` continues with the very batches the interrupted run would have seen. Iterating yields
    the remaining batches of the current epoch and then moves on to the next epoch:

        while loader.epoch < total_epochs:
            for batch in loader: ...

    `state_dict()` always points at the next batch, so saving it after a step and loading it into a new
    loader (before iterating) resumes right after that step.
    """

    def __init__(
        self, dataset: Sequence[Prompt], batch_size: int, shuffle: bool, seed: int, drop_last: bool = True
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if len(dataset) < batch_size:
            raise DataError(
                f"the dataset has {len(dataset)} prompts, fewer than one batch of {batch_size} "
                "(data.train_batch_size); add data or lower the batch size"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self._epoch = 0
        self._batch_in_epoch = 0

    @classmethod
    def from_config(cls, dataset: Sequence[Prompt], cfg: DataConfig) -> PromptLoader:
        return cls(dataset, cfg.train_batch_size, cfg.shuffle, cfg.seed)

    @property
    def epoch(self) -> int:
        return self._epoch

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(len(self.dataset), self.batch_size)
        return full if self.drop_last or not rest else full + 1

    def epoch_order(self, epoch: int) -> list[int]:
        """The dataset indices of an epoch, in the order they are handed out."""
        order = list(range(len(self.dataset)))
        if self.shuffle:
            # A string seed is hashed with SHA-512, so the order is the same in every process and run.
            random.Random(f"rlkube-data:{self.seed}:{epoch}").shuffle(order)
        return order

    def __iter__(self) -> Iterator[list[Prompt]]:
        epoch, order, num_batches = self._epoch, self.epoch_order(self._epoch), len(self)
        for batch_number in range(self._batch_in_epoch, num_batches):
            indices = order[batch_number * self.batch_size : (batch_number + 1) * self.batch_size]
            # Advance before yielding: a checkpoint taken while the batch is in use resumes after it.
            if batch_number + 1 < num_batches:
                self._epoch, self._batch_in_epoch = epoch, batch_number + 1
            else:
                self._epoch, self._batch_in_epoch = epoch + 1, 0
            yield [self.dataset[i] for i in indices]

    def state_dict(self) -> LoaderState:
        return {"epoch": self._epoch, "batch_in_epoch": self._batch_in_epoch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        epoch, batch_in_epoch = state.get("epoch"), state.get("batch_in_epoch")
        if not isinstance(epoch, int) or not isinstance(batch_in_epoch, int) or epoch < 0:
            raise ValueError(f"invalid data loader state {dict(state)}")
        if not 0 <= batch_in_epoch < len(self):
            raise ValueError(
                f"data loader state points at batch {batch_in_epoch} but an epoch has {len(self)} batches; "
                "did the data or data.train_batch_size change since the checkpoint?"
            )
        self._epoch, self._batch_in_epoch = epoch, batch_in_epoch
