"""Shared-prefix KV reuse for the transformers backends: the key/value cache of a batch's common prompt prefix
(system prompt, KB list, few-shot turns) is computed once, kept, and handed to `generate` for every row.

Every step prompt of a batch starts with the same few hundred tokens, and so do the prompts of the next step and the
next batch. `PrefixCache` keeps the `DynamicCache` of such prefixes, keyed by their token ids, least recently used
first out once they hold more than `max_bytes`. A new prefix that shares a start with a kept one is built from a
cropped copy of it, so only the new tokens are run.

A batch is laid out as `[prefix][left padding][suffix]`: the prefix sits at the same positions in every row (so one
cache serves all), the padding is masked, and `generate` derives position ids from the attention mask, so every
real token keeps the position it has in today's left-padded layout. The token ids fed to the model are the same;
only the order of floating-point work differs (greedy outputs match in float32; see benchmarks/agent_throughput.py).
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Sequence

MIN_PREFIX_TOKENS = 32  # below this the copy and bookkeeping cost more than the prefill they save


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids `a` and `b` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def batch_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """Tokens every row starts with, leaving at least one token per row for `generate` to run."""
    first = rows[0]
    n = min(len(r) for r in rows) - 1
    for r in rows[1:]:
        n = min(n, common_prefix_length(first[:n], r))
    return max(n, 0)


def cache_bytes(cache) -> int:  # noqa: ANN001 - a transformers Cache
    """Bytes held by the key and value tensors of a cache."""
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


class PrefixCache:
    """KV caches of prompt prefixes (batch size 1), keyed by token ids, bounded by `max_bytes`.

    Args:
        max_bytes: the most bytes of keys and values kept; the least recently used prefixes go first.
        min_tokens: shorter prefixes are not cached (the caller runs plain `generate`).
    """

    def __init__(self, max_bytes: int, min_tokens: int = MIN_PREFIX_TOKENS) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self._lock = threading.Lock()  # `kbrouter serve` may call generate from several threads
        self.clear()

    def clear(self) -> None:
        """Drop every kept prefix and zero the counters."""
        self._entries: OrderedDict[tuple[int, ...], object] = OrderedDict()
        self._bytes: dict[tuple[int, ...], int] = {}
        self.hits = self.misses = self.tokens_run = self.tokens_reused = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(self._bytes.values())

    def get(self, model, prefix: Sequence[int]):  # noqa: ANN001, ANN201 - transformers model and Cache
        """The cache of `prefix` (batch size 1, length `len(prefix)`); callers copy it before generating on it."""
        import torch
        from transformers import DynamicCache

        key = tuple(prefix)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.hits += 1
                self.tokens_reused += len(key)
                return self._entries[key]
            best, shared = None, 0
            for k in self._entries:
                # at most len(key) - 1: a prefix of a kept one still runs a token (an empty input is no forward)
                n = min(common_prefix_length(k, key), len(key) - 1)
                if n > shared:
                    best, shared = k, n
            if best is not None and shared >= self.min_tokens:
                cache = copy.deepcopy(self._entries[best])
                cache.crop(shared - len(best))  # negative: drop the tail the new prefix does not share
            else:
                cache, shared = DynamicCache(config=model.config), 0
            self.misses += 1
            self.tokens_reused += shared
            self.tokens_run += len(key) - shared
            with torch.inference_mode():
                ids = torch.tensor([key[shared:]], dtype=torch.long, device=model.device)
                cache = model(input_ids=ids, cache=cache, use_cache=True).cache
            self._entries[key] = cache
            self._bytes[key] = cache_bytes(cache)
            while len(self._entries) > 1 and self.nbytes > self.max_bytes:
                old, _ = self._entries.popitem(last=False)
                del self._bytes[old]
            return cache

    def stats(self) -> dict[str, int]:
        """Counters for logs and benchmarks: lookups that hit, prefixes built, prefix tokens run and reused."""
        return {
            "hits": self.hits,
            "misses": self.misses,
            "tokens_run": self.tokens_run,
            "tokens_reused": self.tokens_reused,
            "entries": len(self._entries),
            "bytes": self.nbytes,
        }


def prefixed_batch(rows: Sequence[Sequence[int]], prefix_len: int, pad_id: int, device: str):  # noqa: ANN201
    """(input_ids, attention_mask) laid out `[prefix][padding][suffix]` for rows sharing `prefix_len` tokens."""
    import torch

    width = max(len(r) for r in rows) - prefix_len
    ids, mask = [], []
    for r in rows:
        pad = width - (len(r) - prefix_len)
        ids.append([*r[:prefix_len], *([pad_id] * pad), *r[prefix_len:]])
        mask.append([1] * prefix_len + [0] * pad + [1] * (len(r) - prefix_len))
    return torch.tensor(ids, device=device), torch.tensor(mask, device=device)


def expanded(cache, batch_size: int):  # noqa: ANN001, ANN201 - transformers Cache
    """A copy of a batch-size-1 cache repeated `batch_size` times (generate writes into it; the kept one stays)."""
    out = copy.deepcopy(cache)
    if batch_size > 1:
        out.batch_repeat_interleave(batch_size)
    return out


def prefixed_layout(tensor, attention_mask, prefix_len: int, fill: int):  # noqa: ANN001, ANN201 - torch tensors
    """A left-padded `[batch, length]` tensor re-laid `[prefix][padding][suffix]` at the same width (`fill` pads)."""
    import torch

    out = torch.full_like(tensor, fill)
    width = tensor.shape[1]
    for i, (row, real) in enumerate(zip(tensor, attention_mask.bool(), strict=True)):
        kept = row[real]
        out[i, :prefix_len] = kept[:prefix_len]
        out[i, width - (kept.shape[0] - prefix_len) :] = kept[prefix_len:]
    return out
