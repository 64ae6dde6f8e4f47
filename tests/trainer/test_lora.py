"""LoRA (rlkube_trainer.model.lora): adapters injected on a frozen base, the base computed with them
off (the reference), the merged weights the engine loads, the adapter as PEFT writes it, and a
run in one process whose checkpoints and export hold the adapter and resume from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file

from rlkube_api.config import ModelConfig
from rlkube_api.validation import InvalidSpec, parse_trainer_config
from rlkube_trainer.checkpoint.state import load_torch
from rlkube_trainer.loop.driver import run_in_process
from rlkube_trainer.model.loading import load_causal_lm
from rlkube_trainer.model.lora import LoraSettings, adapters_disabled, apply_lora, merged_names, merged_weights
from rlkube_trainer.model.lora.export import ADAPTER_DIR, WEIGHTS_FILE, peft_adapter_state, write_adapter
from rlkube_trainer.tiny.task import init
from tests.trainer.tiny_model import build_tiny_model

SETTINGS = LoraSettings(rank=4, alpha=8)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("lora") / "model")


def _adapted(path: Path, settings: LoraSettings = SETTINGS, seed: int = 0) -> Any:
    model = apply_lora(load_causal_lm(str(path)), settings, seed)
    with torch.no_grad():  # B starts at 0 (the base's output): move it, as training would
        generator = torch.Generator().manual_seed(1)
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    return model


def _logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits  # type: ignore[no-any-return]


IDS = torch.tensor([[5, 17, 42, 99, 3, 250], [7, 7, 300, 1, 2, 64]])
TASK_IDS = IDS % 14  # the tiny task's vocabulary


def test_only_the_adapters_train_and_start_alike_on_every_rank(tiny: Path) -> None:
    torch.manual_seed(123)  # each rank seeds its RNG by rank: the adapters must not follow it
    first = apply_lora(load_causal_lm(str(tiny)), SETTINGS, seed=5)
    torch.manual_seed(456)
    second = apply_lora(load_causal_lm(str(tiny)), SETTINGS, seed=5)
    trains = [name for name, p in first.named_parameters() if p.requires_grad]
    assert trains and all(".lora_A." in n or ".lora_B." in n for n in trains)
    # all-linear: every projection of every layer, never the LM head
    assert sum(".lora_A." in n for n in trains) == 2 * 7
    assert not any("lm_head" in n or "embed" in n for n in trains)
    for (name, a), (_, b) in zip(first.state_dict().items(), second.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    # B = 0: the adapted model computes what the base does
    assert torch.equal(_logits(first, IDS), _logits(load_causal_lm(str(tiny)), IDS))


def test_target_and_exclude_modules(tiny: Path) -> None:
    model = apply_lora(
        load_causal_lm(str(tiny)), LoraSettings(4, 8, ("q_proj", "v_proj"), ("layers.1.self_attn.v_proj",))
    )
    adapted = {n.split(".lora_A.")[0] for n, _ in model.named_parameters() if ".lora_A." in n}
    assert adapted == {
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.v_proj",
        "model.layers.1.self_attn.q_proj",
    }
    with pytest.raises(ValueError, match=r"no module .* matches targetModules"):
        apply_lora(load_causal_lm(str(tiny)), LoraSettings(4, 8, ("nothing_here",)))


def test_adapters_disabled_is_the_base_model(tiny: Path) -> None:
    model = _adapted(tiny)
    base = _logits(load_causal_lm(str(tiny)), IDS)
    assert not torch.allclose(_logits(model, IDS), base)
    with adapters_disabled(model):
        assert torch.equal(_logits(model, IDS), base)
    assert not torch.allclose(_logits(model, IDS), base)  # on again after the block
    assert all(p.requires_grad for n, p in model.named_parameters() if ".lora_" in n)


def test_merged_weights_are_the_adapted_model_under_the_base_names(tiny: Path) -> None:
    model = _adapted(tiny)
    names = list(model.state_dict())
    merged = dict(merged_weights(model.state_dict().items(), SETTINGS.scaling))
    assert list(merged) == merged_names(names)  # the order the engine and the manifest expect
    plain = load_causal_lm(str(tiny))
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(merged)
    torch.testing.assert_close(_logits(plain, IDS), _logits(model, IDS), atol=1e-5, rtol=1e-5)
    # PEFT's own merge gives the same weights
    from peft import PeftModel  # noqa: PLC0415

    peft_merged = PeftModel(load_causal_lm(str(tiny)), SETTINGS.peft_config())
    peft_merged.base_model.model.load_state_dict(model.state_dict())
    for name, tensor in peft_merged.merge_and_unload().state_dict().items():
        torch.testing.assert_close(merged[name], tensor, atol=1e-6, rtol=1e-6)


def test_merged_weights_refuse_a_layer_without_its_adapter() -> None:
    half = [("m.q.base_layer.weight", torch.zeros(2, 2)), ("m.q.lora_A.default.weight", torch.zeros(1, 2))]
    with pytest.raises(ValueError, match="without their A or B"):
        list(merged_weights(half, 1.0))


def test_the_adapter_is_written_as_peft_reads_it(tiny: Path, tmp_path: Path) -> None:
    from peft import PeftModel  # noqa: PLC0415

    model = _adapted(tiny)
    write_adapter(tmp_path, SETTINGS, peft_adapter_state(model.state_dict().items()), str(tiny))
    assert (tmp_path / "adapter_config.json").is_file()
    loaded = PeftModel.from_pretrained(load_causal_lm(str(tiny)), str(tmp_path))
    assert torch.equal(_logits(loaded, IDS), _logits(model, IDS))


def test_module_lists_take_verls_single_string_but_no_regular_expression() -> None:
    config = ModelConfig.model_validate({"path": "/m", "target_modules": "all-linear", "exclude_modules": None})
    assert config.target_modules == ["all-linear"] and config.exclude_modules == []
    with pytest.raises(ValueError, match="regular expression"):
        ModelConfig.model_validate({"path": "/m", "target_modules": ".*(q|v)_proj"})


def test_a_reference_with_pods_of_its_own_is_refused_with_lora(tmp_path: Path) -> None:
    raw: dict[str, Any] = yaml.safe_load(init(tmp_path, "grpo", steps=1).read_text())
    raw["model"]["lora_rank"] = 8
    raw["actor"]["use_kl_loss"] = True
    raw["roles"]["reference"] = {"replicas": 1, "gpus_per_replica": 0}
    with pytest.raises(InvalidSpec, match="loraRank"):
        parse_trainer_config(raw)


def _run_config(workdir: Path, steps: int) -> Any:
    raw: dict[str, Any] = yaml.safe_load(init(workdir, "gae", steps=steps).read_text())
    raw["rollout"].update(name="hf", calculate_log_probs=True)
    raw["data"]["train_batch_size"] = 8
    raw["actor"].update(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=8, use_kl_loss=True)
    raw["model"].update(lora_rank=4, lora_alpha=8)
    raw["critic"].update(lora_rank=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])
    raw["trainer"].update(test_freq=-1, save_freq=1)
    raw["checkpoint"]["export_hf"] = "final"
    return parse_trainer_config(raw)


def _adapter_only(state: dict[str, torch.Tensor], head: bool = False) -> bool:
    return all(".lora_" in n or (head and n.startswith("value_head.")) for n in state)


@pytest.mark.trainer
def test_a_lora_run_trains_the_adapters_only_and_resumes_from_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run_in_process(_run_config(tmp_path, 2), progress=False)
    assert len(result.history) == 2
    # The engine generated with the merged weights: its log-probs are the actor's (an engine
    # on the base, or on unmerged names, would differ once the adapters moved at step 1).
    assert result.history[-1]["training/rollout_probs_diff_max"] < 1e-4
    assert result.history[-1]["actor/kl_loss"] > 0  # the reference (adapters off) is the base, not the policy
    step2 = tmp_path / "checkpoints" / "step_000002"
    actor = load_torch(step2 / "actor" / "rank_0.pt")["state"]
    critic = load_torch(step2 / "critic" / "rank_0.pt")["state"]
    # The checkpoint holds the adapters and their optimizer state, not the frozen base.
    assert actor["model"] and _adapter_only(actor["model"])
    assert len(actor["optimizer"]["state"]) == len(actor["model"])
    assert _adapter_only(critic["model"], head=True)
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in critic["model"] if ".lora_" in n} == {"q_proj", "v_proj"}

    # The export: the merged model, loadable as any, and the adapter as PEFT reads it.
    from peft import PeftModel  # noqa: PLC0415

    export = result.output_dir / "hf"
    merged = load_causal_lm(str(export))
    adapter = load_file(str(export / ADAPTER_DIR / WEIGHTS_FILE))
    assert len(adapter) == len(actor["model"])
    base = tmp_path / "model"
    with_adapter = PeftModel.from_pretrained(load_causal_lm(str(base)), str(export / ADAPTER_DIR))
    torch.testing.assert_close(_logits(merged, TASK_IDS), _logits(with_adapter, TASK_IDS), atol=1e-5, rtol=1e-5)
    # Only the adapters changed: every tensor without one is the initial model's, bit for bit.
    initial = load_causal_lm(str(base)).state_dict()
    adapted = {n.removeprefix("base_model.model.").split(".lora_")[0] for n in adapter}
    for name, tensor in merged.state_dict().items():
        if name.rsplit(".", 1)[0] not in adapted:
            assert torch.equal(tensor, initial[name]), name

    # Resume: a third step starts from step 2's adapters and optimizer state.
    from rlkube_trainer.workers.training import Trainable  # noqa: PLC0415

    loaded: list[dict[str, torch.Tensor]] = []
    load = Trainable.load_state_dict

    def recording(self: Trainable, state: dict[str, Any]) -> None:
        load(self, state)
        loaded.append({k: v.clone() for k, v in self._model_state().items()})

    monkeypatch.setattr(Trainable, "load_state_dict", recording)
    resumed = run_in_process(_run_config(tmp_path, 3), progress=False)
    assert [row["step"] for row in resumed.history] == [1, 2, 3]  # steps 1-2 read back from metrics.jsonl
    assert len(loaded) == 2  # actor and critic, from step 2
    for name, tensor in actor["model"].items():
        assert torch.equal(loaded[0][name], tensor), name
    step3 = load_torch(tmp_path / "checkpoints" / "step_000003" / "actor" / "rank_0.pt")["state"]["model"]
    assert any(not torch.equal(step3[n], actor["model"][n]) for n in actor["model"])


def test_use_shm_copies_the_model_once_per_host(tiny: Path, tmp_path: Path) -> None:
    from rlkube_trainer.model.loading import shm_copy  # noqa: PLC0415

    first = Path(shm_copy(str(tiny), root=tmp_path))
    assert first.parent == tmp_path and (first / "config.json").is_file()
    (first / "marker").touch()
    assert Path(shm_copy(str(tiny), root=tmp_path)) == first and (first / "marker").exists()  # reused
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no staging dir left behind


def test_layered_summon_caps_the_sync_bucket_at_one_decoder_layer(tiny: Path) -> None:
    from rlkube_trainer.workers.actor import decoder_layer_bytes  # noqa: PLC0415

    model = load_causal_lm(str(tiny))
    layer = model.model.layers[0]
    assert decoder_layer_bytes(model) == sum(p.numel() * p.element_size() for p in layer.parameters())
