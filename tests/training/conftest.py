"""Fixtures for the training tests: real SmolLM2 (cached folder), real step data, a tiny random Qwen2.5-VL."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import SHARED

for _k, _v in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "TRL_EXPERIMENTAL_SILENCE": "1"}.items():  # fmt: skip
    os.environ.setdefault(_k, _v)

REPO = Path(__file__).resolve().parents[2]
PAPER_STEPS = SHARED / "r1router" / "stepgrpo_valid.jsonl"
COCO = SHARED / "image" / "coco" / "images"
CPU_GRPO_RECIPE = REPO / "configs" / "train" / "smollm2_grpo_cpu.yaml"
CPU_SFT_RECIPE = REPO / "configs" / "train" / "smollm2_sft_cpu.yaml"


@pytest.fixture(scope="session")
def paper_steps() -> Path:
    if not PAPER_STEPS.exists():
        pytest.skip(f"shared step data absent: {PAPER_STEPS}")
    return PAPER_STEPS


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    from agent.backends.models import smollm2_path

    return smollm2_path()  # converted once from the packaged GGUF into ~/.cache/kbrouter (or $KBROUTER_CACHE)


@pytest.fixture(scope="session")
def short_steps_file(paper_steps, tmp_path_factory) -> Path:
    """Real step prompts from the paper's dev set as StepRecord JSONL: its shortest plan and final steps.

    Two prompts (one per reward family) keep a CPU GRPO step short while every reward component applies.
    """
    from training.step_data import load_step_records

    records = load_step_records(paper_steps, "paper")

    def shortest(pred):
        return min((r for r in records if pred(r)), key=lambda r: len(r.messages[-1]["content"]))

    chosen = [
        shortest(lambda r: r.step_type == "plan" and r.gold["sub_question"] is not None),
        shortest(lambda r: r.step_type == "final"),
    ]
    path = tmp_path_factory.mktemp("steps") / "steps.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in chosen))
    return path


@pytest.fixture(scope="session")
def coco_image() -> str:
    images = sorted(COCO.glob("*.jpg")) if COCO.exists() else []
    if not images:
        pytest.skip(f"shared COCO images absent: {COCO}")
    return str(images[0])


@pytest.fixture(scope="session")
def tiny_vl_dir(smollm2_dir, tmp_path_factory) -> str:
    """A randomly initialised ~6M-parameter Qwen2.5-VL built from a config (env-probe §6), saved with its processor."""
    import importlib.resources

    import torch
    from transformers import (
        AutoTokenizer,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    tok.add_special_tokens(
        {"additional_special_tokens": ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]}
    )
    template = (importlib.resources.files("trl") / "chat_templates" / "qwen2_5_vl.jinja").read_text()
    tok.chat_template = template
    ids = {
        t: tok.convert_tokens_to_ids(t)
        for t in ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    }
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
        ),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           window_size=56, fullatt_block_indexes=[1]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(config)
    image_processor = Qwen2VLImageProcessor(min_pixels=64 * 64, max_pixels=128 * 128)
    processor = Qwen2_5_VLProcessor(
        image_processor=image_processor, tokenizer=tok, video_processor=Qwen2VLVideoProcessor(), chat_template=template
    )
    out = tmp_path_factory.mktemp("tiny_qwen2_5_vl")
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return str(out)
