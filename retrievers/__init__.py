"""Knowledge bases for kbrouter: config, index build/load, and the text and table retrievers.

Typical use::

    from retrievers import build_kb, load_kb_configs, load_kbs

    configs = load_kb_configs("configs/kb/demo.yaml")
    for cfg in configs:
        build_kb(cfg)  # or: kbrouter index --kb configs/kb/demo.yaml
    kbs = load_kbs(configs)  # {"text": Retriever, "table": Retriever}
    hits = kbs["text"].search(["Who formed the boy group behind 2014 S/S?"], k=5)[0]
"""

from retrievers.config import KBConfig, load_kb_configs
from retrievers.fusion import reciprocal_rank_fusion
from retrievers.kb import KB_KINDS, build_kb, build_kb_status, load_kb, load_kbs
from retrievers.types import Doc, Hit, Media, Query, Retriever, as_queries

__all__ = [
    "KB_KINDS",
    "Doc",
    "Hit",
    "KBConfig",
    "Media",
    "Query",
    "Retriever",
    "as_queries",
    "build_kb",
    "build_kb_status",
    "load_kb",
    "load_kb_configs",
    "load_kbs",
    "reciprocal_rank_fusion",
]
