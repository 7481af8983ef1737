"""vLLM offline engine backend (GPU; `pip install 'kbrouter[vllm]'`): the fast path for eval, synthesis, rollouts."""

from __future__ import annotations

from agent.backends.base import Completion, Message, SamplingParams, per_row_params, scores_past_prefix


class VLLMPolicy:
    """Batched chat generation with `vllm.LLM.chat`; images are passed as `image_url` parts by the chat template.

    Args:
        model: hub name or local folder.
        tensor_parallel_size: GPUs per model replica.
        gpu_memory_utilization: fraction of GPU memory vLLM may take.
        max_model_len: context length; keep it above prompt + completion of the longest step.
        limit_mm_per_prompt: e.g. {"image": 4} for a VLM.
    """

    supports_grammar = True  # vLLM structured outputs (xgrammar / guidance backends)
    supports_continuation_scoring = (
        True  # `continuation_logprobs` from prompt_logprobs: what `agent.route_prior` reads
    )

    def __init__(
        self,
        model: str,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.85,
        max_model_len: int = 8192,
        limit_mm_per_prompt: dict | None = None,
        dtype: str = "auto",
    ) -> None:
        try:
            import vllm
        except ImportError as e:
            raise ImportError("the vLLM backend needs vllm and a GPU: pip install 'kbrouter[vllm]'") from e
        kwargs = {"limit_mm_per_prompt": limit_mm_per_prompt} if limit_mm_per_prompt else {}
        self.name = model
        self._vllm = vllm
        self.llm = vllm.LLM(
            model=model,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            dtype=dtype,
            **kwargs,
        )

    def _sampling(self, params: SamplingParams):  # noqa: ANN202 - vllm.SamplingParams
        extra: dict = {"stop": list(params.stop) or None}
        if params.grammar:  # vLLM's structured outputs (the `guided_*` fields were removed in v0.12)
            from vllm.sampling_params import StructuredOutputsParams

            extra = {"structured_outputs": StructuredOutputsParams(grammar=params.grammar)}
        return self._vllm.SamplingParams(
            max_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k else -1,
            seed=params.seed,
            include_stop_str_in_output=True,  # keep closing tags for the parser
            **extra,
        )

    def generate(self, conversations: list[list[Message]], params: SamplingParams) -> list[Completion]:
        from agent.backends.openai_compat import to_openai_messages

        if isinstance(params.grammar, tuple):  # each conversation its own grammar (`agent.answer_words: shown`)
            sp = [self._sampling(p) for p in per_row_params(params, len(conversations))]
        else:
            sp = self._sampling(params)
        outputs = self.llm.chat([to_openai_messages(c) for c in conversations], sp, use_tqdm=False)
        return [
            Completion(
                text=o.outputs[0].text,
                prompt_tokens=len(o.prompt_token_ids or []),
                completion_tokens=len(o.outputs[0].token_ids),
                finish_reason=o.outputs[0].finish_reason or "stop",
            )
            for o in outputs
        ]

    def continuation_logprobs(
        self,
        conversations: list[list[Message]],
        prefixes: list[str],
        continuations: list[str],
        step: str | None = None,  # noqa: ARG002 - one set of weights here
    ) -> list[list[float]]:
        """Per conversation, each continuation's summed log-probability after its prompt + prefix: every prompt +
        prefix (+ continuation) is scored in one `LLM.chat` call, its last assistant message left open
        (`continue_final_message`), with `prompt_logprobs=0` (each prompt token's own log-probability)."""
        from agent.backends.openai_compat import to_openai_messages

        if not continuations or any(not c for c in continuations):
            raise ValueError(f"continuation_logprobs needs non-empty continuations, got {continuations!r}")
        texts = ("", *continuations)
        batch = [
            to_openai_messages([*conv, {"role": "assistant", "content": prefix + text}])
            for conv, prefix in zip(conversations, prefixes, strict=True)
            for text in texts
        ]
        sp = self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        outputs = self.llm.chat(batch, sp, use_tqdm=False, add_generation_prompt=False, continue_final_message=True)
        scored = [
            (
                o.prompt_token_ids,
                [
                    None if d is None else d[t].logprob
                    for d, t in zip(o.prompt_logprobs, o.prompt_token_ids, strict=True)
                ],
            )
            for o in outputs
        ]
        width = len(texts)
        return [
            scores_past_prefix(scored[c * width][0], scored[c * width + 1 : (c + 1) * width])
            for c in range(len(conversations))
        ]
