"""Constrained decoding for the transformers backends: xgrammar's logits processor over a compiled EBNF grammar.

Grammars are compiled once per (tokenizer, grammar) and cached; xgrammar's processor keeps per-sequence state, so a
fresh one wraps the cached compiled grammar for every `generate` call. The caches are bounded: answer grammars built
from each prompt's words (`agent.answer_words: shown`) are new at every step, and a server runs for days.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

_LOCK = threading.Lock()
_COMPILERS: dict[int, tuple[object, object, OrderedDict]] = {}  # id(tokenizer) -> (tokenizer, compiler, cache)
CACHED_GRAMMARS = 512  # compiled grammars kept per tokenizer, least recently used dropped first
COMPILER_CACHE_BYTES = 256 * 2**20  # xgrammar's own cache of compiled grammars, per tokenizer


def _xgrammar():  # noqa: ANN202 - module
    try:
        import xgrammar
    except ImportError as e:  # pragma: no cover - xgrammar is a core dependency
        raise ImportError(
            "constrained decoding needs xgrammar: pip install xgrammar (or set agent.constrained: off)"
        ) from e
    return xgrammar


def vocab_size(model) -> int:  # noqa: ANN001 - any transformers model
    """Rows of the model's logits (may exceed the tokenizer's vocabulary: padded embeddings)."""
    return int(model.get_output_embeddings().weight.shape[0])


def compiled_grammar(model, tokenizer, ebnf: str):  # noqa: ANN001, ANN201
    """The xgrammar CompiledGrammar of `ebnf` for this tokenizer, compiled on first use."""
    xgr = _xgrammar()
    with _LOCK:
        entry = _COMPILERS.get(id(tokenizer))
        if entry is None or entry[0] is not tokenizer:
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size(model))
            entry = (tokenizer, xgr.GrammarCompiler(info, cache_limit_bytes=COMPILER_CACHE_BYTES), OrderedDict())
            _COMPILERS[id(tokenizer)] = entry
        _, compiler, cache = entry
        if ebnf in cache:
            cache.move_to_end(ebnf)
            return cache[ebnf]
        try:
            compiled = compiler.compile_grammar(ebnf)
        except Exception as e:
            raise ValueError(f"the grammar does not compile ({e}); grammar:\n{ebnf[:2000]}") from e
        cache[ebnf] = compiled
        if len(cache) > CACHED_GRAMMARS:
            cache.popitem(last=False)
        return compiled


def grammar_processor(model, tokenizer, ebnf: str | list[str] | tuple[str, ...]):  # noqa: ANN001, ANN201
    """A single-use logits processor that masks every token the grammar does not allow next.

    A list (or tuple) gives one grammar per batch row (rows of one `generate` call may have different KB sets or step types).
    """
    if isinstance(ebnf, (list, tuple)):
        return _xgrammar().contrib.hf.LogitsProcessor([compiled_grammar(model, tokenizer, g) for g in ebnf])
    return _xgrammar().contrib.hf.LogitsProcessor(compiled_grammar(model, tokenizer, ebnf))
