"""Constrained decoding for the transformers backends: xgrammar's logits processor over a compiled EBNF grammar.

Grammars are compiled once per (tokenizer, grammar) and cached; xgrammar's processor keeps per-sequence state, so a
fresh one wraps the cached compiled grammar for every `generate` call.
"""

from __future__ import annotations

import threading

_LOCK = threading.Lock()
_COMPILERS: dict[int, tuple[object, object, dict[str, object]]] = {}  # id(tokenizer) -> (tokenizer, compiler, cache)


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
            entry = (tokenizer, xgr.GrammarCompiler(info), {})
            _COMPILERS[id(tokenizer)] = entry
        _, compiler, cache = entry
        if ebnf not in cache:
            try:
                cache[ebnf] = compiler.compile_grammar(ebnf)
            except Exception as e:
                raise ValueError(f"the grammar does not compile ({e}); grammar:\n{ebnf[:2000]}") from e
        return cache[ebnf]


def grammar_processor(model, tokenizer, ebnf: str | list[str]):  # noqa: ANN001, ANN201
    """A single-use logits processor that masks every token the grammar does not allow next.

    A list gives one grammar per batch row (rows of one `generate` call may have different KB sets or step types).
    """
    if isinstance(ebnf, list):
        return _xgrammar().contrib.hf.LogitsProcessor([compiled_grammar(model, tokenizer, g) for g in ebnf])
    return _xgrammar().contrib.hf.LogitsProcessor(compiled_grammar(model, tokenizer, ebnf))
