"""The shipped router adapter is merged once and reloaded from the cache (no peft import, no merge at startup)."""

from __future__ import annotations

import shutil

import pytest

from agent.backends import models
from agent.backends.models import ROUTER_ADAPTER, merged_model_dir


def test_second_load_reads_the_kept_merge_and_computes_the_same(smollm2_dir, tmp_path, monkeypatch):
    import torch

    from agent.backends.hf import TransformersPolicy

    monkeypatch.setenv("KBROUTER_CACHE", str(tmp_path / "cache"))  # the merge is kept here; the base stays put
    adapter = tmp_path / "adapter"  # a snapshot: the shipped adapter may be replaced while the test runs
    shutil.copytree(ROUTER_ADAPTER, adapter)
    first = TransformersPolicy(smollm2_dir, adapter=str(adapter))
    folder = merged_model_dir(smollm2_dir, adapter, str(torch.float32))
    assert (folder / "config.json").is_file() and not list(folder.parent.glob("*.tmp*"))

    def no_merge(*args, **kwargs):  # noqa: ANN002, ANN003
        raise AssertionError("a kept merge must not be merged again")

    monkeypatch.setattr(models, "apply_adapter", no_merge)
    second = TransformersPolicy(smollm2_dir, adapter=str(adapter))
    a, b = first.model.state_dict(), second.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    base = TransformersPolicy(smollm2_dir).model.state_dict()
    assert not torch.equal(base["model.layers.0.self_attn.q_proj.weight"], b["model.layers.0.self_attn.q_proj.weight"])


@pytest.mark.parametrize("dtype", ["torch.float32", "torch.bfloat16"])
def test_merge_folder_changes_with_the_adapter_bytes_and_the_dtype(smollm2_dir, tmp_path, dtype):
    adapter = tmp_path / "adapter"
    shutil.copytree(ROUTER_ADAPTER, adapter)
    before = merged_model_dir(smollm2_dir, adapter, dtype)
    assert before == merged_model_dir(smollm2_dir, adapter, dtype)  # stable
    assert before != merged_model_dir(smollm2_dir, adapter, "torch.float16")
    weights = adapter / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # a retrained adapter
    weights.write_bytes(bytes(data))
    assert merged_model_dir(smollm2_dir, adapter, dtype) != before
