"""Transformers backend: any causal chat LM from a local folder, a hub name, or a GGUF file."""

from __future__ import annotations

import logging
from pathlib import Path

from agent.backends.base import (
    BackendError,
    Completion,
    Message,
    SamplingParams,
    check_grammar_rows,
    row_params,
    text_only,
)
from agent.backends.models import load_merged, resolve_model, resolve_policy_model, warn_if_slow_bf16
from agent.backends.prefix_cache import PrefixCache, batch_prefix_length, expanded, prefixed_batch
from retrievers.batching import abandoned_items

logger = logging.getLogger(__name__)

CONTINUOUS_BATCH_TOKENS = 2048  # tokens per continuous-batching forward (prefill chunks plus one per decoding row)


def truncate_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """Cut `text` right after the first stop string (kept, so `</answer>` survives)."""
    cut = len(text)
    for s in stop:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i + len(s))
    return text[:cut]


def continuation_ids(tokenizer, continuations: list[str]) -> list[list[int]]:  # noqa: ANN001
    """The continuations' token ids; an empty list or an empty continuation is refused."""
    cont = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in continuations]
    if not cont or any(not ids for ids in cont):
        raise ValueError(f"continuation_logprobs needs non-empty continuations, got {continuations!r}")
    return cont


def padded_continuations(tokenizer, continuations: list[str]):  # noqa: ANN001, ANN201 - (ids, batch, mask)
    """The continuations' token ids, and them as one right-padded batch with its mask (a row's scores then read only
    its own positions), for `continuation_logprobs`."""
    return padded_continuations_ids(continuation_ids(tokenizer, continuations), tokenizer.pad_token_id)


def padded_continuations_ids(cont: list[list[int]], tok_pad: int):  # noqa: ANN201 - (ids, batch, mask)
    """Token id lists as one right-padded batch with its mask."""
    import torch

    width = max(len(ids) for ids in cont)
    batch = torch.full((len(cont), width), tok_pad, dtype=torch.long)
    real = torch.zeros((len(cont), width), dtype=torch.long)
    for i, ids in enumerate(cont):
        batch[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        real[i, : len(ids)] = 1
    return cont, batch, real


class TransformersPolicy:
    """Batched generation with a Hugging Face causal LM and its chat template.

    Args:
        model: a local folder, a hub name, the alias `smollm2` (the packaged SmolLM2-135M-Instruct), or a folder
            holding a `.gguf` file together with `gguf_file`.
        gguf_file: name of a GGUF file inside `model` (loaded through transformers' GGUF support).
        dtype: `float32` (fast on CPU), `bfloat16` or `float16` (GPU), or `auto`.
        device: `cpu`, `cuda`, ... ; default picks CUDA when available.
        max_batch_size: conversations per `generate` call; larger batches are split.
        adapter: a peft (LoRA) adapter folder to load onto the model and merge; `model: smollm2-kbrouter` brings
            the shipped router adapter by itself.
        plan_adapter: a second adapter for the plan steps alone (sub-question and KB choice): its merge is kept as
            a second copy of the model, and a generate call whose `SamplingParams.step` is `plan` runs on it, every
            other call (answer and final steps, baselines) on `adapter`. A router and a reader trained apart then
            serve as one policy.
        prefix_cache_mb: keep the KV cache of the prompt prefix a batch shares (system prompt, KB list, few-shot
            turns) up to this many MB and reuse it across rows, steps and batches (`agent.backends.prefix_cache`);
            0 turns it off.
        continuous_batching: run unconstrained steps through transformers' continuous batching (`generate_batch`,
            paged attention: a finished row frees its slot at once). It has no grammar support, so constrained
            steps keep `generate`; stop strings are applied after generation (the text is the same, the tokens
            after the stop are spent).
    """

    supports_grammar = True  # `SamplingParams.grammar` through xgrammar's logits processor

    def __init__(
        self,
        model: str,
        gguf_file: str | None = None,
        dtype: str = "float32",
        device: str | None = None,
        max_batch_size: int = 16,
        adapter: str | None = None,
        prefix_cache_mb: int = 0,
        continuous_batching: bool = False,
        plan_adapter: str | None = None,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        alias = model
        model, adapter = resolve_policy_model(model, adapter)
        from agent.backends.models import adapter_base_name, adapter_kb_names

        for folder in (adapter, plan_adapter):
            if folder:
                adapter_base_name(folder)  # a missing adapter fails before the base model loads
        # the KB names the plan steps' weights were trained to write (None: not known), for `agent.route_prior: auto`
        router = plan_adapter or adapter
        self.trained_kb_names = adapter_kb_names(router) if router else None
        path = resolve_model(model)
        kwargs = {"gguf_file": gguf_file} if gguf_file else {}
        self.name = Path(path).name if Path(path).exists() else path
        if adapter:
            self.name = alias if alias != model else f"{self.name}+{Path(adapter).name}"
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        self.tokenizer.padding_side = "left"  # decoder-only batching pads on the left
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
        warn_if_slow_bf16(dtype == "bfloat16", self.device)
        if adapter:
            self.model = load_merged(path, adapter, torch_dtype, kwargs)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, **kwargs)
        self.model = self.model.to(self.device)
        self.model.eval()
        self.plan_model = None
        if plan_adapter:
            self.plan_model = load_merged(path, plan_adapter, torch_dtype, kwargs).to(self.device).eval()
            self.name += f"+plan:{Path(plan_adapter).name}"
        self.max_batch_size = max_batch_size
        if prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0 (0 = off), got {prefix_cache_mb}")
        self.prefix_cache = PrefixCache(prefix_cache_mb * 2**20) if prefix_cache_mb else None
        # a prefix's keys and values depend on the weights: the plan model keeps its own
        self.plan_prefix_cache = PrefixCache(prefix_cache_mb * 2**20) if prefix_cache_mb and plan_adapter else None
        self.continuous_batching = continuous_batching

    def render(self, conversation: list[Message], continue_final: bool = False) -> str:
        """The prompt string the model sees for one conversation; `continue_final` renders its last (assistant)
        message open, to be continued, instead of opening a new assistant turn."""
        if continue_final:
            return self.tokenizer.apply_chat_template(
                text_only(conversation), tokenize=False, add_generation_prompt=False, continue_final_message=True
            )
        return self.tokenizer.apply_chat_template(text_only(conversation), tokenize=False, add_generation_prompt=True)

    def context_length(self) -> int | None:
        """The most tokens (prompt + completion) the model takes, from its config; None when it does not say."""
        n = getattr(self.model.config, "max_position_embeddings", None)
        return int(n) if isinstance(n, int) and n > 0 else None

    def generate(self, conversations: list[list[Message]], params: SamplingParams) -> list[Completion]:
        """One completion per conversation; long batches are split into `max_batch_size` chunks.

        A conversation whose prompt plus `max_new_tokens` exceeds the model's context is refused before generation:
        its completion has `finish_reason="error"` and says so (the agent records a `backend_error` for that
        question alone); the model is never run on a prompt it would crash on or silently cut.
        """
        check_grammar_rows(params, len(conversations))
        prompts = [self.render(c) for c in conversations]
        out: list[Completion | None] = [None] * len(prompts)
        context = self.context_length()
        if context is not None:
            lengths = [len(ids) for ids in self.tokenizer(prompts, add_special_tokens=False)["input_ids"]]
            for i, n in enumerate(lengths):
                if n + params.max_new_tokens > context:
                    out[i] = Completion(
                        text="",
                        prompt_tokens=0,
                        finish_reason="error",
                        metadata={
                            "error": f"prompt of {n} tokens + {params.max_new_tokens} new ones exceeds the context "
                            f"of {self.name} ({context} tokens); shorten the question (or lower agent.evidence_chars)",
                            "bad_input": True,  # `kbrouter serve` answers 422: the request is too long, not broken
                        },
                    )
        # Sorting by length keeps padding small inside each chunk; results go back in input order.
        order = sorted((i for i in range(len(prompts)) if out[i] is None), key=lambda i: len(prompts[i]))
        if self.continuous_batching and not params.grammar and order:
            for i, c in zip(order, self._generate_continuous([prompts[i] for i in order], params), strict=True):
                out[i] = c
            return out  # type: ignore[return-value]
        for start in range(0, len(order), self.max_batch_size):
            idx = order[start : start + self.max_batch_size]
            for i, c in zip(
                idx, self._generate_chunk([prompts[i] for i in idx], row_params(params, idx), idx), strict=True
            ):
                out[i] = c
        return out  # type: ignore[return-value]

    supports_continuation_scoring = True  # `continuation_logprobs`: what `agent.route_prior` reads

    def continuation_logprobs(
        self,
        conversations: list[list[Message]],
        prefixes: list[str],
        continuations: list[str],
        step: str | None = None,
    ) -> list[list[float]]:
        """Per conversation, the summed log-probability of each continuation after its rendered prompt + prefix.

        One forward pass over each prompt, then all continuations in one batch on a copy of its cache
        (`_scored_rows`, which `prompt_logprobs` shares). `step` picks the weights as `generate` does (`plan` runs on
        the plan adapter's, when there is one).
        """
        model, _ = self._weights(step)
        cont = continuation_ids(self.tokenizer, continuations)
        out = []
        for conv, prefix in zip(conversations, prefixes, strict=True):
            head = self.tokenizer(self.render(conv) + prefix, add_special_tokens=False)["input_ids"]
            rows = self._scored_rows(model, [head + c for c in cont])
            out.append([float(sum(lp[len(head) :])) for lp in rows])  # type: ignore[arg-type] - no None past the head
        return out

    def prompt_logprobs(
        self, conversations: list[list[Message]], step: str | None = None
    ) -> list[tuple[list[int], list[float | None]]]:
        """Per conversation (its last message an assistant reply to continue), the rendered prompt's token ids and
        each token's log-probability given the ones before it (None for the first): what vLLM returns as
        `prompt_logprobs`, and what `kbrouter serve` answers with for a client scoring continuations remotely.

        Conversations that differ only in their last message (a client scores one plan's KB names this way) share
        one forward over their common tokens; each row's own tail then runs in one batch on a copy of its cache.
        """
        import json

        tok = self.tokenizer
        rows, groups = [], {}
        for i, conv in enumerate(conversations):
            if not conv or conv[-1]["role"] != "assistant":
                raise ValueError("prompt_logprobs continues the last message: it must be an assistant message")
            ids = tok(self.render(conv, continue_final=True), add_special_tokens=False)["input_ids"]
            context = self.context_length()
            if context is not None and len(ids) > context:
                raise ValueError(f"a prompt of {len(ids)} tokens exceeds the context of {self.name} ({context})")
            rows.append(ids)
            groups.setdefault(json.dumps(text_only(conv[:-1]), sort_keys=True), []).append(i)
        model, _ = self._weights(step)
        out: list = [None] * len(rows)
        for idx in groups.values():
            for i, logprobs in zip(idx, self._scored_rows(model, [rows[i] for i in idx]), strict=True):
                out[i] = (rows[i], logprobs)
        return out

    def _scored_rows(self, model, rows: list[list[int]]) -> list[list[float | None]]:  # noqa: ANN001
        """Each row's per-token log-probabilities: one forward over the tokens all rows start with, then every
        row's remaining tokens in one right-padded batch on a copy of that cache."""
        import torch

        shared = batch_prefix_length(rows)  # leaves each row at least one token
        if shared == 0:  # no token in common (or a one-token row): each row alone
            return [[None] if len(r) < 2 else self._scored_rows(model, [r])[0] for r in rows]
        with torch.inference_mode():
            head = model(input_ids=torch.tensor([rows[0][:shared]], device=self.device), use_cache=True)
            head_lp = head.logits[0].float().log_softmax(-1)
            tails = [r[shared:] for r in rows]
            _, batch, real = padded_continuations_ids(tails, tok_pad=self.tokenizer.pad_token_id)
            mask = torch.cat([torch.ones((len(rows), shared), dtype=torch.long), real], 1).to(self.device)
            rest = model(input_ids=batch.to(self.device), attention_mask=mask, cache=expanded(head.cache, len(rows)))
            rest_lp = rest.logits.float().log_softmax(-1)
        out = []
        for k, r in enumerate(rows):
            lp: list[float | None] = [None]
            lp += [float(head_lp[j - 1, r[j]]) for j in range(1, shared)]
            lp.append(float(head_lp[shared - 1, r[shared]]))
            lp += [float(rest_lp[k, j - shared - 1, r[j]]) for j in range(shared + 1, len(r))]
            out.append(lp)
        return out

    def _weights(self, step: str | None):  # noqa: ANN202 - (transformers model, PrefixCache | None)
        """The model a call runs on (the plan adapter's for plan steps, when there is one) and its prefix cache."""
        if step == "plan" and self.plan_model is not None:
            return self.plan_model, self.plan_prefix_cache
        return self.model, self.prefix_cache

    def _generate_chunk(self, prompts: list[str], params: SamplingParams, rows: list[int]) -> list[Completion]:
        if all_abandoned(rows):
            return [abandoned_completion() for _ in rows]
        model, prefix_cache = self._weights(params.step)
        if prefix_cache is not None:
            ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
            shared = batch_prefix_length(ids)
            if shared >= prefix_cache.min_tokens:
                prefix = prefix_cache.get(model, ids[0][:shared])
                input_ids, mask = prefixed_batch(ids, shared, self.tokenizer.pad_token_id, self.device)
                enc = {"input_ids": input_ids, "attention_mask": mask}
                cache = expanded(prefix, len(ids))
                return generate_completions(model, self.tokenizer, enc, params, rows, cache=cache)
        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        return generate_completions(model, self.tokenizer, enc, params, rows)

    def _generate_continuous(self, prompts: list[str], params: SamplingParams) -> list[Completion]:
        """All prompts through `generate_batch`: the scheduler refills a finished row's slot with waiting work."""
        import torch
        from transformers import ContinuousBatchingConfig, GenerationConfig

        model, _ = self._weights(params.step)
        rows = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        sample = params.temperature > 0
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=sample,
            temperature=params.temperature if sample else None,
            top_p=params.top_p if sample else None,
            top_k=(params.top_k or None) if sample else None,
            eos_token_id=model.generation_config.eos_token_id or self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        if params.seed is not None:
            torch.manual_seed(params.seed)
        # Sized from the work itself: left to infer them, the paged cache takes most of free RAM on CPU (13 GB).
        page = 64
        cb_config = ContinuousBatchingConfig(
            page_size=page,
            num_blocks=sum(-(-(len(r) + params.max_new_tokens) // page) for r in rows) + len(rows),
            max_batch_tokens=CONTINUOUS_BATCH_TOKENS,
        )
        results = model.generate_batch(
            rows, generation_config=config, continuous_batching_config=cb_config, warmup=False
        )
        results = list(results.values())
        if len(results) != len(rows) or any(r.error is not None for r in results):
            errors = [str(r.error) for r in results if r.error is not None]
            raise BackendError(
                f"continuous batching returned {len(results)} of {len(rows)} completions; errors: {errors[:3]} "
                "(set policy.continuous_batching: false to use generate)"
            )
        completions = []
        for row, r in zip(rows, results, strict=True):
            tokens = list(r.generated_tokens)
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            completions.append(Completion(
                text=truncate_at_stop(text, params.stop),
                prompt_tokens=len(row),
                completion_tokens=len(tokens),
                finish_reason="length" if len(tokens) >= params.max_new_tokens else "stop",
            ))  # fmt: skip
        return completions


def abandoned_completion(completion_tokens: int = 0) -> Completion:
    """The reply for a conversation nobody waits for any more (`retrievers.batching.abandoned_items`), after the
    tokens it got before its row was stopped; nobody reads it."""
    return Completion(text="", completion_tokens=completion_tokens, finish_reason="abandoned")


def all_abandoned(rows: list[int]) -> bool:
    """Whether every one of these conversations (positions in the running batcher call) was abandoned."""
    flags = abandoned_items()
    return flags is not None and all(flags[r] for r in rows)


def abandoned_rows_criteria(rows: list[int]) -> list:
    """A stopping criterion ending the rows of a batch whose client left or whose server is stopping, one token
    later (`transformers` stops a row whose flag is True and the whole call when all are); none outside a batcher."""
    if abandoned_items() is None:
        return []
    import torch
    from transformers import StoppingCriteria

    class _Abandoned(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs) -> torch.BoolTensor:  # noqa: ANN001
            flags = abandoned_items() or [False] * (max(rows) + 1)
            return torch.tensor([flags[r] for r in rows], dtype=torch.bool, device=input_ids.device)

    return [_Abandoned()]


def generate_completions(
    model,  # noqa: ANN001
    tokenizer,  # noqa: ANN001
    enc,  # noqa: ANN001
    params: SamplingParams,
    rows: list[int] | None = None,
    cache=None,  # noqa: ANN001 - a transformers Cache holding a shared prefix
) -> list[Completion]:
    """`model.generate` on an encoded, left-padded batch, decoded into completions; shared by the text and VL backends.

    `cache`, when given, holds the keys and values of the first tokens of every row (a shared prefix laid out
    `[prefix][padding][suffix]`, see `agent.backends.prefix_cache`); `generate` then runs only the tokens after it.

    `rows` are the batch's positions in the running batcher call: a row whose client leaves stops generating and
    comes back as `abandoned_completion()`."""
    import torch

    sample = params.temperature > 0
    gen_kwargs: dict = {
        "max_new_tokens": params.max_new_tokens,
        "do_sample": sample,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if sample:
        gen_kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k or None)
    else:
        gen_kwargs.update(temperature=None, top_p=None, top_k=None)
    if params.grammar:
        from agent.backends.constrained import grammar_processor

        # the grammar ends every completion with end-of-sequence; stop strings would end it one token early
        gen_kwargs["logits_processor"] = [grammar_processor(model, tokenizer, params.grammar)]
    elif params.stop:
        gen_kwargs.update(stop_strings=list(params.stop), tokenizer=tokenizer)
    rows = list(range(enc["input_ids"].shape[0])) if rows is None else rows
    if criteria := abandoned_rows_criteria(rows):
        from transformers import StoppingCriteriaList

        gen_kwargs["stopping_criteria"] = StoppingCriteriaList(criteria)
    if params.seed is not None:
        torch.manual_seed(params.seed)
    if cache is not None:
        gen_kwargs["cache"] = cache
    with torch.inference_mode():
        output = model.generate(**enc, **gen_kwargs)
    new = output[:, enc["input_ids"].shape[1] :]
    gone = abandoned_items()
    completions = []
    for r, row, mask in zip(rows, new, enc["attention_mask"], strict=True):
        n_tokens = int((row != tokenizer.pad_token_id).sum())
        if gone is not None and gone[r]:
            completions.append(abandoned_completion(n_tokens))
            continue
        text = tokenizer.decode(row, skip_special_tokens=True)
        completions.append(Completion(
            text=truncate_at_stop(text, params.stop),
            prompt_tokens=int(mask.sum()),
            completion_tokens=n_tokens,
            finish_reason="length" if n_tokens >= params.max_new_tokens else "stop",
        ))  # fmt: skip
    return completions
