"""The knowledge bases as the agent sees them: display name, description and retriever."""

from __future__ import annotations

from dataclasses import dataclass

from agent.protocol.grammar import check_display_name
from retrievers.types import Retriever

DESCRIPTIONS = {  # default one-line descriptions shown to the policy, by (kind, granularity)
    ("text", "paragraph"): "short encyclopedia passages; good for facts about people, places, events and things",
    ("text", "document"): "whole articles; good for broad questions needing much context",
    ("table", "table"): "tables from web pages; good for numbers, rankings, lists and comparisons",
    ("image", "image"): "captioned images; good for what things look like",
    ("clip", "clip"): "short video clips with transcripts; good for a specific moment or action",
    ("video", "video"): "whole videos with transcripts; good for what a video is about overall",
}


@dataclass(frozen=True)
class KnowledgeBase:
    """A configured KB: `name` is its id in hits, `display_name` is what the policy writes in `<ret>`."""

    name: str
    display_name: str
    retriever: Retriever
    k: int = 5
    description: str = ""


def describe(kind: str, granularity: str, options: dict) -> str:
    return options.get("description") or DESCRIPTIONS.get((kind, granularity), f"{kind} ({granularity})")


def load_knowledge_bases(kb_file: str, only: list[str] | None = None, build: bool = True) -> dict[str, KnowledgeBase]:
    """Build (if needed) and load the KBs of a YAML file, keyed by display name.

    Args:
        kb_file: a `configs/kb/*.yaml` file.
        only: optional KB names to keep.
        build: build missing or stale indexes first (a no-op when they are up to date).
    """
    from retrievers.config import load_kb_configs
    from retrievers.kb import build_kb, load_kb

    configs = load_kb_configs(kb_file)
    for cfg in configs:  # before any index is built: a name the step grammar cannot express fails now
        check_display_name(cfg.display_name, where=f"{kb_file}: knowledge base {cfg.name!r}")
    if only:
        unknown = set(only) - {c.name for c in configs}
        if unknown:
            raise ValueError(f"unknown KB name(s) {sorted(unknown)} in {kb_file}; valid: {[c.name for c in configs]}")
        configs = [c for c in configs if c.name in only]
    kbs = {}
    for cfg in configs:
        if build:
            build_kb(cfg, progress=False)
        kbs[cfg.display_name] = KnowledgeBase(
            name=cfg.name,
            display_name=cfg.display_name,
            retriever=load_kb(cfg),
            k=cfg.k,
            description=cfg.description or describe(cfg.kind, cfg.granularity, cfg.options or {}),
        )
    return kbs
