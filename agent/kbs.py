"""The knowledge bases as the agent sees them: display name, description and retriever."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.protocol.grammar import check_display_name
from retrievers.types import Retriever

if TYPE_CHECKING:
    from retrievers.config import KBConfig

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


KBFiles = str | os.PathLike | Sequence[str | os.PathLike]  # one KB YAML file or several


def kb_configs(kb_files: KBFiles, only: list[str] | None = None) -> list[KBConfig]:
    """The checked configs of one or more KB YAML files, without building or loading anything.

    Args:
        kb_files: one `configs/kb/*.yaml` file or several (their KBs are pooled, in file order).
        only: optional KB names to keep.

    Raises:
        ValueError: no file; a display name the step grammar cannot express; a name in `only` no file declares; a
            `name` or `display_name` (case-insensitive) that two files share.
    """
    from retrievers.config import load_kb_configs, select_kbs

    files = [kb_files] if isinstance(kb_files, str | os.PathLike) else list(kb_files)
    if not files or not all(str(f) for f in files):
        raise ValueError(f"no KB config file given ({kb_files!r}); point it at a KB YAML, e.g. configs/kb/demo.yaml")
    configs = [c for f in files for c in load_kb_configs(f)]
    for cfg in configs:  # before any index is built: a name the step grammar cannot express fails now
        check_display_name(cfg.display_name, where=f"{cfg.source_file}: knowledge base {cfg.name!r}")
    configs = select_kbs(configs, only, ", ".join(str(f) for f in files))
    for key in ("name", "display_name"):  # each file checks its own; two files can still collide
        values = [getattr(c, key).lower() if key == "display_name" else getattr(c, key) for c in configs]
        if len(set(values)) != len(values):
            raise ValueError(
                f"KB {key}s repeat across {[str(f) for f in files]}: {[getattr(c, key) for c in configs]}; keep one "
                f"KB per {key} (select some with `only`/`kbs`)"
            )
    return configs


def knowledge_bases(configs: Sequence[KBConfig], build: bool = True) -> dict[str, KnowledgeBase]:
    """Build (if asked) and load the KBs of `configs`, keyed by display name, with their policy-facing descriptions."""
    from retrievers.kb import load_kbs

    retrievers = load_kbs(list(configs), build=build)
    return {
        cfg.display_name: KnowledgeBase(
            name=cfg.name,
            display_name=cfg.display_name,
            retriever=retrievers[cfg.name],
            k=cfg.k,
            description=cfg.description or describe(cfg.kind, cfg.granularity, cfg.options or {}),
        )
        for cfg in configs
    }


def load_knowledge_bases(
    kb_files: KBFiles, only: list[str] | None = None, build: bool = True
) -> dict[str, KnowledgeBase]:
    """Build (if needed) and load the KBs of one or more YAML files, keyed by display name.

    The one KB loader of run/ask/serve, eval, synthesis and training.

    Args:
        kb_files: one `configs/kb/*.yaml` file or several.
        only: optional KB names to keep.
        build: build missing or stale indexes first (a no-op when they are up to date).
    """
    return knowledge_bases(kb_configs(kb_files, only), build=build)
