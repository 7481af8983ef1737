"""A tiny randomly initialised Qwen2.5-VL (about 6.5M parameters) built offline, for tests and smoke runs.

Nothing is downloaded: the tokenizer is the cached SmolLM2 tokenizer (ChatML) plus the four Qwen vision special
tokens, the chat template is TRL's `qwen2_5_vl.jinja`, and the model comes from a config (env-probe §6). The saved
folder loads with `AutoProcessor` / `AutoModelForImageTextToText`, hence with `VisionLanguagePolicy(out_dir)`.

Example::

    from agent.backends.tiny_vl import build_tiny_qwen2_5_vl
    from agent.backends.hf_vl import VisionLanguagePolicy

    policy = VisionLanguagePolicy(build_tiny_qwen2_5_vl("/tmp/tiny-qwen-vl"))
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
MARKER = "tiny_qwen2_5_vl.done"  # written last: a folder without it is an interrupted build


def qwen2_5_vl_chat_template() -> str:
    """TRL's Qwen2.5-VL chat template (it renders `{"type": "image"}` parts as vision tokens)."""
    try:
        import trl
    except ImportError as e:
        raise ImportError("the tiny Qwen2.5-VL takes its chat template from TRL: pip install 'kbrouter[train]'") from e
    path = Path(trl.__file__).parent / "chat_templates" / "qwen2_5_vl.jinja"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; this TRL version ships no Qwen2.5-VL chat template")
    return path.read_text()


def build_tiny_qwen2_5_vl(out_dir: str | os.PathLike, seed: int = 0, force: bool = False) -> str:
    """Build (once) and save a tiny random Qwen2.5-VL with its processor into `out_dir`.

    Args:
        out_dir: folder to write; reused when a finished build is already there (unless `force`).
        seed: torch seed for the random weights (same seed, same weights).
        force: rebuild even when a finished folder exists.

    Returns:
        `out_dir` as a string, ready for `VisionLanguagePolicy(out_dir)` or `AutoProcessor.from_pretrained`.
    """
    out = Path(out_dir)
    if (out / MARKER).exists() and not force:
        return str(out)
    import torch
    from transformers import (
        AutoTokenizer,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    from agent.backends.models import smollm2_path

    template = qwen2_5_vl_chat_template()
    tok = AutoTokenizer.from_pretrained(smollm2_path())
    tok.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    tok.chat_template = template
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    # Small pixel bounds keep the tiny model's image token count low (a 640 px photo becomes ~16-64 tokens).
    image_processor = Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)
    video_processor = Qwen2VLVideoProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)
    processor = Qwen2_5_VLProcessor(
        image_processor=image_processor, tokenizer=tok, video_processor=video_processor, chat_template=template
    )

    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=4096,
            # mrope_section must sum to head_dim / 2 = 64 / 4 / 2 = 8
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
            bos_token_id=tok.bos_token_id,
        ),
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=64,
            window_size=56,
            fullatt_block_indexes=[1],
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    processor.save_pretrained(tmp)
    (tmp / MARKER).write_text("ok\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # atomic: a half-written folder is never taken for a finished one
    logger.info("built tiny Qwen2.5-VL (%d params) in %s", sum(p.numel() for p in model.parameters()), out)
    return str(out)


def tiny_qwen2_5_vl_path() -> str:
    """The tiny Qwen2.5-VL in kbrouter's cache (`$KBROUTER_CACHE/models/tiny-qwen2.5-vl`), built on first use."""
    from agent.backends.models import cache_dir

    return build_tiny_qwen2_5_vl(cache_dir() / "models" / "tiny-qwen2.5-vl")
