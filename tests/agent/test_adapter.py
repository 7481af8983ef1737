"""LoRA adapters on the transformers backend: the shipped router alias, and the errors for a wrong or missing one."""

import json

import pytest

from agent.backends.models import ROUTER_ADAPTER, adapter_base_name, resolve_policy_model


@pytest.fixture(scope="module")
def tiny_adapter(tmp_path_factory, smollm2_dir):
    """A rank-2 LoRA adapter saved from SmolLM2 by peft, with non-zero weights (so merging changes outputs)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    out = tmp_path_factory.mktemp("adapter")
    peft_model.save_pretrained(out)
    return out


def test_router_alias_is_smollm2_plus_the_shipped_adapter():
    assert resolve_policy_model("smollm2-kbrouter", None) == ("smollm2", str(ROUTER_ADAPTER))
    assert resolve_policy_model("smollm2", None) == ("smollm2", None)
    with pytest.raises(ValueError, match="already brings its adapter"):
        resolve_policy_model("smollm2-kbrouter", "/some/adapter")


def test_shipped_adapter_is_small_safetensors_on_smollm2():
    weights = ROUTER_ADAPTER / "adapter_model.safetensors"
    assert weights.is_file(), "the router adapter ships in models/smollm2-kbrouter"
    assert weights.stat().st_size <= 25 * 2**20
    assert adapter_base_name(ROUTER_ADAPTER).endswith("SmolLM2-135M-Instruct")
    assert (ROUTER_ADAPTER / "README.md").is_file(), "the adapter has its model card"


def test_adapter_loads_merged_and_changes_the_model(tiny_adapter, smollm2_dir):
    from agent.backends.base import SamplingParams
    from agent.backends.hf import TransformersPolicy

    conv = [[{"role": "user", "content": "Name a large city."}]]
    params = SamplingParams(max_new_tokens=6)
    base = TransformersPolicy(smollm2_dir).generate(conv, params)[0].text
    tuned = TransformersPolicy(smollm2_dir, adapter=str(tiny_adapter))
    assert not any("lora" in n for n, _ in tuned.model.named_parameters())  # merged: base-model speed
    assert tuned.generate(conv, params)[0].text != base


def test_adapter_trained_on_another_base_is_one_clear_error(tiny_adapter, tmp_path, smollm2_dir):
    from agent.backends.hf import TransformersPolicy

    other = tmp_path / "other"
    other.mkdir()
    for f in tiny_adapter.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((other / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "Qwen/Qwen2.5-VL-7B-Instruct"
    (other / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"adapter_config.json' was trained on 'Qwen2.5-VL-7B-Instruct'"):
        TransformersPolicy(smollm2_dir, adapter=str(other))


def test_missing_adapter_names_the_folder(tmp_path):
    from agent.backends.hf import TransformersPolicy

    with pytest.raises(FileNotFoundError, match=r"nowhere.*has no adapter_config.json"):
        TransformersPolicy("smollm2", adapter=str(tmp_path / "nowhere"))


def test_adapter_on_a_backend_that_cannot_load_it_fails_in_the_config():
    from agent.backends.factory import PolicyConfig

    with pytest.raises(ValueError, match="policy.adapter is read by the transformers backend"):
        PolicyConfig(backend="vllm", model="m", adapter="/a")
    with pytest.raises(ValueError, match="runs on the transformers backend"):
        PolicyConfig(backend="vllm", model="smollm2-kbrouter")
