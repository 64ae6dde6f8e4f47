"""How a training role's ranks divide its model: tensor × pipeline × Ulysses sequence × data
parallel, from the role's world size and its RLJob fields (roles.<role>.tensorParallelSize,
pipelineParallelSize, virtualPipelineParallelSize, ulyssesSequenceParallelSize, fsdpSize).

A layout the ranks or the model cannot take is refused at start with a message naming the
field and the numbers, never run with a silent fallback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class LayoutError(ValueError):
    """A role's parallel sizes do not fit its ranks or its model."""


@dataclass(frozen=True)
class ParallelLayout:
    """The sizes of a role's mesh dimensions; their product is the role's world size. `data` is
    what remains for FSDP2 (which shards over data × sequence: the ranks of a sequence-parallel
    group hold different tokens of the same samples, so their gradients are averaged like data
    parallel ones)."""

    tensor: int = 1
    pipeline: int = 1
    sequence: int = 1
    data: int = 1
    virtual_pipeline: int | None = None
    role: str = "actor"

    @property
    def world(self) -> int:
        return self.tensor * self.pipeline * self.sequence * self.data

    @property
    def model_parallel(self) -> int:
        """Ranks that work on the same samples: one tensor × sequence × pipeline group."""
        return self.tensor * self.pipeline * self.sequence

    @property
    def only_data_parallel(self) -> bool:
        """FSDP2 (or replicas) alone: today's path, untouched."""
        return self.model_parallel == 1

    def field(self, name: str) -> str:
        return f"roles.{self.role}.{name}"

    @classmethod
    def of(
        cls,
        role: str,
        world_size: int,
        tensor: int = 1,
        pipeline: int = 1,
        sequence: int = 1,
        virtual_pipeline: int | None = None,
        fsdp_size: int | None = None,
    ) -> ParallelLayout:
        """The layout of `role` over `world_size` ranks; raises LayoutError naming the field."""
        sizes = (("tensorParallelSize", tensor), ("pipelineParallelSize", pipeline))
        for name, size in (*sizes, ("ulyssesSequenceParallelSize", sequence)):
            if size < 1 or world_size % size:
                raise LayoutError(
                    f"roles.{role}.{name} {size} does not divide the role's {world_size} ranks "
                    "(replicas × gpusPerReplica)"
                )
        model_parallel = tensor * pipeline * sequence
        if world_size % model_parallel:
            raise LayoutError(
                f"roles.{role}: tensorParallelSize {tensor} × pipelineParallelSize {pipeline} × "
                f"ulyssesSequenceParallelSize {sequence} = {model_parallel} does not divide the role's "
                f"{world_size} ranks"
            )
        if virtual_pipeline is not None and virtual_pipeline > 1 and pipeline == 1:
            raise LayoutError(
                f"roles.{role}.virtualPipelineParallelSize {virtual_pipeline} needs pipelineParallelSize > 1"
            )
        layout = cls(tensor, pipeline, sequence, world_size // model_parallel, virtual_pipeline, role)
        if fsdp_size is not None and not layout.only_data_parallel:
            shard = layout.data * layout.sequence
            if fsdp_size > shard or shard % fsdp_size or fsdp_size % sequence:
                raise LayoutError(
                    f"roles.{role}.fsdpSize {fsdp_size} must divide the {shard} ranks FSDP2 shards over "
                    f"(data {layout.data} × ulyssesSequenceParallelSize {sequence}) and be a multiple "
                    f"of ulyssesSequenceParallelSize"
                )
        return layout

    def check_model(self, config: Any) -> None:
        """Refuse a model whose attention heads this layout cannot split (a transformers config:
        num_attention_heads, num_key_value_heads, num_hidden_layers)."""
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        numbers = f"the model has {heads} attention heads and {kv_heads} key/value heads"
        if self.tensor > 1 and (heads % self.tensor or kv_heads % self.tensor):
            raise LayoutError(
                f"{self.field('tensorParallelSize')} {self.tensor} does not divide the model's heads: {numbers}"
            )
        if self.sequence > 1:
            per_rank, kv_per_rank = heads // self.tensor, kv_heads // self.tensor
            if per_rank % self.sequence or kv_per_rank % self.sequence:
                raise LayoutError(
                    f"{self.field('ulyssesSequenceParallelSize')} {self.sequence} does not divide the heads "
                    f"each tensor-parallel rank holds ({per_rank} attention, {kv_per_rank} key/value): {numbers}"
                )
        layers = int(getattr(config, "num_hidden_layers", 0) or 0)
        stages = self.pipeline * (self.virtual_pipeline or 1)
        if self.pipeline > 1 and layers and layers < stages:
            raise LayoutError(
                f"{self.field('pipelineParallelSize')} {self.pipeline} × virtual "
                f"{self.virtual_pipeline or 1} = {stages} stages exceed the model's {layers} decoder layers"
            )
