"""One config block selects the policy backend: `backend: transformers | vl | openai | vllm`."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from agent.backends.base import Policy

BACKENDS = ("transformers", "vl", "openai", "vllm")


@dataclass(frozen=True)
class PolicyConfig:
    """Which model answers, and through what."""

    backend: str = field(default="transformers", metadata={"help": f"one of {BACKENDS}"})
    model: str = field(default="smollm2", metadata={"help": "hub name, local folder, or `smollm2` (packaged)"})
    adapter: str | None = field(default=None, metadata={"help": "peft (LoRA) adapter folder loaded onto `model`"})
    plan_adapter: str | None = field(
        default=None,
        metadata={
            "help": "transformers backend: a second adapter folder for the plan steps alone (sub-question and KB "
            "choice); answer and final steps keep `adapter` (a second merged copy of the model is held)"
        },
    )
    gguf_file: str | None = None
    dtype: str = "float32"
    device: str | None = None
    max_batch_size: int = 16
    # On by default: same tokens out, and on SmolLM2 (2 cores, fp32) 1.13-1.63x the lockstep loop at batch 4-32
    # (docs/benchmarks/agent_throughput_sweep_n32.txt); a few MB a prefix
    prefix_cache_mb: int = field(
        default=256,
        metadata={
            "help": "transformers / vl backends: MB of KV cache kept for the prompt prefix a batch shares (system "
            "prompt, KB list, few-shot turns), computed once and reused across rows, steps and batches; 0 = off"
        },
    )
    continuous_batching: bool = field(
        default=False,
        metadata={
            "help": "transformers backend: unconstrained steps go through transformers' continuous batching "
            "(generate_batch, paged attention); constrained steps keep generate"
        },
    )
    base_url: str | None = field(default=None, metadata={"help": "openai backend: e.g. http://127.0.0.1:8000/v1"})
    api_key: str | None = None
    grammar_field: str = field(
        default="vllm",
        metadata={"help": "openai backend: how a step grammar is sent: vllm | sglang | llamacpp | none (hosted APIs)"},
    )
    send_step: bool = field(
        default=False,
        metadata={
            "help": "openai backend: send each request's agent step as `kbrouter_step`, so a `kbrouter serve "
            "--plan-adapter` server answers the plan steps with its plan adapter (hosted APIs reject the field)"
        },
    )
    concurrency: int = 8
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    max_model_len: int = 8192
    max_images: int = 4
    min_pixels: int = 64 * 28 * 28
    max_pixels: int = 512 * 28 * 28

    def __post_init__(self) -> None:
        from retrievers.config import check_field_types

        check_field_types(self, "policy.")
        for key in ("max_batch_size", "concurrency", "tensor_parallel_size", "max_model_len"):
            if getattr(self, key) < 1:
                raise ValueError(f"policy.{key} must be >= 1, got {getattr(self, key)}")
        if self.prefix_cache_mb < 0:
            raise ValueError(f"policy.prefix_cache_mb must be >= 0 (0 = off), got {self.prefix_cache_mb}")
        if self.max_images < 0 or not 0 < self.min_pixels <= self.max_pixels:
            raise ValueError(
                f"need policy.max_images >= 0 and 0 < policy.min_pixels <= policy.max_pixels; got {self.max_images}, "
                f"{self.min_pixels} and {self.max_pixels}"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"policy.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.backend not in BACKENDS:
            raise ValueError(f"policy.backend {self.backend!r} is unknown; valid: {list(BACKENDS)}")
        if self.model.lower() == "smollm2-kbrouter" and self.backend != "transformers":
            raise ValueError(
                "model 'smollm2-kbrouter' (SmolLM2 + the shipped LoRA adapter) runs on the transformers "
                f"backend, not {self.backend!r}"
            )
        for key in ("adapter", "plan_adapter"):
            if getattr(self, key) and self.backend != "transformers":
                raise ValueError(
                    f"policy.{key} is read by the transformers backend, not {self.backend!r}: merge it into "
                    "the model (peft merge_and_unload + save_pretrained) and serve that folder"
                )
        if self.send_step and self.backend != "openai":
            raise ValueError(f"policy.send_step is read by the openai backend, not {self.backend!r}")
        if self.backend == "openai" and not self.base_url:
            raise ValueError("policy.backend 'openai' needs policy.base_url, e.g. http://127.0.0.1:8000/v1")

    @classmethod
    def from_dict(cls, d: dict, where: str = "policy") -> PolicyConfig:
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - valid)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; valid keys: {sorted(valid)}")
        return cls(**d)


def make_policy(cfg: PolicyConfig) -> Policy:
    """Load the policy a config names (heavy imports happen here, not at import time)."""
    if cfg.backend == "transformers":
        from agent.backends.hf import TransformersPolicy

        return TransformersPolicy(
            cfg.model,
            gguf_file=cfg.gguf_file,
            dtype=cfg.dtype,
            device=cfg.device,
            max_batch_size=cfg.max_batch_size,
            adapter=cfg.adapter,
            prefix_cache_mb=cfg.prefix_cache_mb,
            continuous_batching=cfg.continuous_batching,
            plan_adapter=cfg.plan_adapter,
        )
    if cfg.backend == "vl":
        from agent.backends.hf_vl import VisionLanguagePolicy

        return VisionLanguagePolicy(
            cfg.model,
            dtype=cfg.dtype,
            device=cfg.device,
            max_batch_size=cfg.max_batch_size,
            max_images=cfg.max_images,
            min_pixels=cfg.min_pixels,
            max_pixels=cfg.max_pixels,
            prefix_cache_mb=cfg.prefix_cache_mb,
        )
    if cfg.backend == "openai":
        from agent.backends.openai_compat import OpenAICompatiblePolicy

        return OpenAICompatiblePolicy(
            cfg.base_url or "",
            cfg.model,
            api_key=cfg.api_key,
            concurrency=cfg.concurrency,
            grammar_field=cfg.grammar_field,
            send_step=cfg.send_step,
        )
    from agent.backends.vllm_engine import VLLMPolicy

    return VLLMPolicy(
        cfg.model,
        tensor_parallel_size=cfg.tensor_parallel_size,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        max_model_len=cfg.max_model_len,
        dtype="auto" if cfg.dtype == "float32" else cfg.dtype,
    )
