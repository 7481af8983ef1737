"""Transformers backend for chat vision-language models (Qwen2.5-VL and other `AutoProcessor` chat VLMs).

Conversations use the same messages as every backend; a user turn with images carries content parts
`{"type": "image", "image": PATH}` (see `agent.protocol.prompts`). Images stay paths in trajectories and step records and
are loaded here with PIL, under a pixel budget:

- `max_images` per conversation: the first ones are kept (the question image comes first in every step, evidence
  images after it), the rest are dropped and counted in `Completion.metadata["images_dropped"]`;
- every image is scaled (aspect kept) so width * height lies in [`min_pixels`, `max_pixels`] before the processor
  sees it, so a multi-step context stays within the model's context whatever the photo size.

Evidence pixels (retrieved images, frames sampled from retrieved clips) enter a conversation as image parts the
prompt builder adds (`agent.protocol.add_evidence_images`); this backend only loads and budgets them.

Example (CPU, tiny random model; GPU: `VisionLanguagePolicy("Qwen/Qwen2.5-VL-7B-Instruct", dtype="bfloat16")`)::

    from agent.backends.tiny_vl import build_tiny_qwen2_5_vl
    policy = VisionLanguagePolicy(build_tiny_qwen2_5_vl("/tmp/tiny-qwen-vl"))
"""

from __future__ import annotations

import os
from pathlib import Path

from agent.backends.base import Completion, Message, SamplingParams, check_grammar_rows, row_params
from agent.backends.hf import abandoned_completion, all_abandoned, generate_completions, padded_continuations
from agent.backends.models import resolve_model, warn_if_slow_bf16
from agent.backends.prefix_cache import PrefixCache, batch_prefix_length, expanded, prefixed_layout
from retrievers.media import MediaError, fit_pixels, load_image

TINY_VL = "tiny-qwen2.5-vl"  # alias: the tiny random Qwen2.5-VL, built offline into the cache on first use
DEFAULT_MIN_PIXELS = 28 * 28 * 4  # Qwen2.5-VL: 28x28 pixels per visual token after the 2x2 merge
DEFAULT_MAX_PIXELS = 28 * 28 * 256  # <= 256 visual tokens per image keeps a 3-step context small


def _budget(messages: list[Message], max_images: int) -> tuple[list[Message], list[str], int]:
    """Keep the first `max_images` image parts; returns (messages, kept paths, number dropped)."""
    kept: list[str] = []
    dropped = 0
    out = []
    for m in messages:
        content = m["content"]
        if not isinstance(content, list):
            out.append(m)
            continue
        parts = []
        for part in content:
            if part.get("type") == "image" or "image" in part:
                if len(kept) >= max_images:
                    dropped += 1
                    continue
                kept.append(str(part["image"]))
                parts.append({"type": "image", "image": str(part["image"])})
            else:
                parts.append(part)
        out.append({**m, "content": parts})
    return out, kept, dropped


def is_vision_language_model(path: str | os.PathLike) -> bool:
    """Whether a local model folder is a chat VLM (its config has a `vision_config`); hub names are not inspected."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    import json

    return "vision_config" in json.loads(config.read_text())


class VisionLanguagePolicy:
    """Batched generation with a chat VLM through `AutoProcessor` and `AutoModelForImageTextToText`.

    Args:
        model: a local folder or hub name (e.g. `Qwen/Qwen2.5-VL-7B-Instruct`, or a folder written by
            `agent.backends.tiny_vl.build_tiny_qwen2_5_vl`), or the alias `tiny-qwen2.5-vl` (random weights, for
            smoke runs: the plumbing works, the answers are noise).
        dtype: `float32` (CPU), `bfloat16`/`float16` (GPU) or `auto`.
        device: `cpu`, `cuda`, ...; default picks CUDA when available.
        max_batch_size: conversations per `generate` call; larger batches are split.
        max_images: images per conversation (question image first, then evidence).
        min_pixels: lower bound on width * height of every image.
        max_pixels: upper bound on width * height of every image.
        prefix_cache_mb: keep the KV cache of the text prefix a batch shares (system prompt, few-shot turns; never
            past the first image) up to this many MB and reuse it (`agent.backends.prefix_cache`); 0 turns it off.
    """

    supports_grammar = True  # shares the text backend's xgrammar path (`generate_completions`)

    def __init__(
        self,
        model: str,
        dtype: str = "float32",
        device: str | None = None,
        max_batch_size: int = 8,
        max_images: int = 4,
        min_pixels: int = DEFAULT_MIN_PIXELS,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        prefix_cache_mb: int = 0,
    ) -> None:
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        if max_images < 0:
            raise ValueError(f"max_images must be >= 0, got {max_images}")
        if not 0 < min_pixels <= max_pixels:
            raise ValueError(f"need 0 < min_pixels <= max_pixels, got {min_pixels} and {max_pixels}")
        if model.lower() == TINY_VL:
            from agent.backends.tiny_vl import tiny_qwen2_5_vl_path

            path = tiny_qwen2_5_vl_path()
        else:
            path = resolve_model(model)
        self.name = Path(path).name if Path(path).exists() else path
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.processor = AutoProcessor.from_pretrained(path)
        self.tokenizer = self.processor.tokenizer
        self.tokenizer.padding_side = "left"  # decoder-only batching pads on the left
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
        warn_if_slow_bf16(dtype == "bfloat16", self.device)
        self.model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch_dtype).to(self.device)
        self.model.eval()
        self.max_batch_size = max_batch_size
        self.max_images = max_images
        self.min_pixels = min_pixels
        self.max_pixels = max_pixels
        if prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0 (0 = off), got {prefix_cache_mb}")
        if prefix_cache_mb and "vision_start_token_id" not in self.model.config.to_dict():
            raise ValueError(
                f"policy.prefix_cache_mb: prefix reuse in the vl backend knows Qwen2-VL / Qwen2.5-VL models (their "
                f"vision tokens and rope offsets), not {type(self.model).__name__}; set policy.prefix_cache_mb: 0"
            )
        self.prefix_cache = PrefixCache(prefix_cache_mb * 2**20) if prefix_cache_mb else None

    def render(self, conversation: list[Message], continue_final: bool = False) -> tuple[str, list[str], int]:
        """The prompt string for one conversation, the image paths it uses (in order), and how many were dropped;
        `continue_final` leaves its last (assistant) message open instead of opening a new assistant turn."""
        messages, paths, dropped = _budget(conversation, self.max_images)
        if continue_final:
            text = self.processor.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=False, continue_final_message=True
            )
        else:
            text = self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text, paths, dropped

    def prompt_logprobs(
        self,
        conversations: list[list[Message]],
        step: str | None = None,  # noqa: ARG002 - one set of weights here (no plan adapter)
    ) -> list[tuple[list[int], list[float | None]]]:
        """Per conversation (its last message an assistant reply to continue), the processed prompt's token ids
        (images expanded) and each token's log-probability given the ones before it (None for the first): what
        `kbrouter serve --backend vl` answers a scoring request with.

        Conversations with the same images (a route prior's one request per KB name) share one padded forward
        pass; a row's scores read only its own positions, and Qwen2.5-VL's rope positions follow the mask."""
        groups: dict[tuple[str, ...], list[tuple[int, str]]] = {}
        for i, conv in enumerate(conversations):
            if not conv or conv[-1]["role"] != "assistant":
                raise ValueError("prompt_logprobs continues the last message: it must be an assistant message")
            text, paths, _ = self.render(conv, continue_final=True)
            groups.setdefault(tuple(paths), []).append((i, text))
        out: list[tuple[list[int], list[float | None]] | None] = [None] * len(conversations)
        for paths, members in groups.items():
            images = [self._load(p) for p in paths]
            for start in range(0, len(members), self.max_batch_size):
                chunk = members[start : start + self.max_batch_size]
                for (i, _), scored in zip(chunk, self._scored_texts([t for _, t in chunk], images), strict=True):
                    out[i] = scored
        return out  # type: ignore[return-value]

    def _scored_texts(self, texts: list[str], images: list) -> list[tuple[list[int], list[float | None]]]:
        """Token ids and per-token log-probabilities of prompts that all show `images`, in one forward pass."""
        import torch

        enc = self.processor(
            text=texts,
            images=images * len(texts) or None,
            padding=True,
            return_tensors="pt",
            add_special_tokens=False,
        )
        self._forget_rope_offsets()
        with torch.inference_mode():
            logits = self.model(**enc.to(self.device)).logits
        self._forget_rope_offsets()
        out = []
        for row, mask in zip(enc["input_ids"], enc["attention_mask"], strict=True):
            where = mask.nonzero()[:, 0].to(self.device)  # a row's real tokens: contiguous, padded on either side
            ids = row[where.cpu()]
            picked = logits[len(out), where[:-1]].float().log_softmax(-1).gather(-1, ids[1:, None].to(self.device))
            out.append((ids.tolist(), [None, *(float(x) for x in picked[:, 0])]))
        return out

    def _load(self, path: str):
        return fit_pixels(load_image(path), self.min_pixels, self.max_pixels)

    def generate(self, conversations: list[list[Message]], params: SamplingParams) -> list[Completion]:
        """One completion per conversation; an unreadable image fails only its own item (`finish_reason='error'`)."""
        check_grammar_rows(params, len(conversations))
        out: list[Completion | None] = [None] * len(conversations)
        ready: list[tuple[int, str, list, int]] = []
        for i, conv in enumerate(conversations):
            text, paths, dropped = self.render(conv)
            try:
                images = [self._load(p) for p in paths]
            except (FileNotFoundError, MediaError) as e:  # bad_input: `kbrouter serve` answers 422, not 5xx
                out[i] = Completion(text="", finish_reason="error", metadata={"error": str(e), "bad_input": True})
                continue
            ready.append((i, text, images, dropped))
        # Sorting by length keeps padding small inside each chunk; results go back in input order.
        ready.sort(key=lambda r: len(r[1]) + 1000 * len(r[2]))
        for start in range(0, len(ready), self.max_batch_size):
            chunk = ready[start : start + self.max_batch_size]
            for (i, _, images, dropped), c in zip(
                chunk, self._generate_chunk(chunk, row_params(params, [r[0] for r in chunk])), strict=True
            ):
                c.metadata.update(images=len(images), images_dropped=dropped)
                out[i] = c
        return out  # type: ignore[return-value]

    supports_continuation_scoring = True  # `continuation_logprobs`: what `agent.route_prior` reads

    def continuation_logprobs(
        self,
        conversations: list[list[Message]],
        prefixes: list[str],
        continuations: list[str],
        step: str | None = None,  # noqa: ARG002 - one set of weights here (no plan adapter)
    ) -> list[list[float]]:
        """Per conversation, the summed log-probability of each continuation after its rendered prompt + prefix,
        with the conversation's images (under the same pixel budget as `generate`).

        One forward pass per conversation over as many rows as continuations: each row is the processed prompt
        (images expanded) followed by one continuation's tokens, right-padded, so a row's scores read only its own
        positions and Qwen2.5-VL's rope positions follow the attention mask.
        """
        import torch

        cont, tail, real = padded_continuations(self.tokenizer, continuations)
        out = []
        for conv, prefix in zip(conversations, prefixes, strict=True):
            text, paths, _ = self.render(conv)
            images = [self._load(p) for p in paths]  # an unreadable image raises: the route prior cannot score it
            enc = self.processor(
                text=[text + prefix] * len(cont),
                images=images * len(cont) or None,
                return_tensors="pt",
                add_special_tokens=False,
            )
            n = enc["input_ids"].shape[1]
            inputs = {k: v for k, v in enc.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids")}
            inputs["input_ids"] = torch.cat([enc["input_ids"], tail], 1)
            inputs["attention_mask"] = torch.cat([enc["attention_mask"], real], 1)
            if "mm_token_type_ids" in enc:  # appended tokens are text (type 0)
                inputs["mm_token_type_ids"] = torch.cat([enc["mm_token_type_ids"], torch.zeros_like(tail)], 1)
            self._forget_rope_offsets()  # computed afresh from these rows, not from a previous call's
            with torch.inference_mode():
                logits = self.model(**{k: v.to(self.device) for k, v in inputs.items()}).logits
            self._forget_rope_offsets()
            picked = logits[:, n - 1 : -1].float().log_softmax(-1).gather(-1, tail.to(self.device).unsqueeze(-1))
            out.append([float(picked[i, : len(c), 0].sum()) for i, c in enumerate(cont)])
        return out

    def _forget_rope_offsets(self) -> None:
        """Qwen2-VL / Qwen2.5-VL keep the last call's rope offsets on the model and reuse them whenever a cache is
        non-empty; cleared, the next call computes them from its own images. Other VLMs keep none."""
        inner = getattr(self.model, "model", None)
        if hasattr(inner, "rope_deltas"):
            inner.rope_deltas = None

    def _generate_chunk(self, chunk: list[tuple[int, str, list, int]], params: SamplingParams) -> list[Completion]:
        rows = [i for i, _, _, _ in chunk]
        if all_abandoned(rows):
            return [abandoned_completion() for _ in rows]
        texts = [text for _, text, _, _ in chunk]
        images = [im for _, _, ims, _ in chunk for im in ims]
        enc = self.processor(
            text=texts, images=images or None, padding=True, return_tensors="pt", add_special_tokens=False
        ).to(self.device)
        if self.prefix_cache is not None:
            return self._generate_with_prefix(enc, params, rows)
        return generate_completions(self.model, self.tokenizer, enc, params, rows)

    def _generate_with_prefix(self, enc, params: SamplingParams, rows: list[int]) -> list[Completion]:  # noqa: ANN001
        """Reuse the cache of the text every row starts with, cut before the first image or video token (pixels
        differ between rows even where their placeholder tokens agree)."""
        real = enc["attention_mask"].bool()
        ids = [row[m].tolist() for row, m in zip(enc["input_ids"], real, strict=True)]
        vision = {self.model.config.vision_start_token_id, self.model.config.image_token_id}
        first_vision = min((j for r in ids for j, t in enumerate(r) if t in vision), default=len(ids[0]))
        shared = min(batch_prefix_length(ids), first_vision)
        if shared < self.prefix_cache.min_tokens:
            return generate_completions(self.model, self.tokenizer, enc, params, rows)
        self._forget_rope_offsets()
        prefix = self.prefix_cache.get(self.model, ids[0][:shared])
        self._forget_rope_offsets()
        shape = enc["input_ids"].shape
        new = {
            k: prefixed_layout(
                v, enc["attention_mask"], shared, self.tokenizer.pad_token_id if k == "input_ids" else 0
            )
            if v.shape == shape  # one entry per token (ids, mask, mm_token_type_ids): laid out like the ids
            else v
            for k, v in enc.items()
        }
        return generate_completions(self.model, self.tokenizer, new, params, rows, cache=expanded(prefix, len(ids)))
