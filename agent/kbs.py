"""The knowledge bases as the agent sees them: display name, description and retriever."""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.protocol.grammar import check_display_name
from retrievers.types import Doc, Retriever

if TYPE_CHECKING:
    from retrievers.config import KBConfig

logger = logging.getLogger(__name__)

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


TITLE_CHARS = 80  # longest title shown; longer ones are cut
TITLES_CHARS = 400  # longest text the titles add to a description (`with_titles`), separator included


def frequent_titles(docs: Sequence[Doc], n: int, max_chars: int = TITLES_CHARS) -> list[str]:
    """Up to `n` distinct document titles, most frequent first (ties by first appearance), whitespace-normalised
    and cut to `TITLE_CHARS` (an ellipsis included), stopping before their `Holds: A; B.` text would pass `max_chars`.

    Example:
        >>> frequent_titles([Doc("1", "", "B"), Doc("2", "", "A  "), Doc("3", "", "A"), Doc("4", "", "")], 5)
        ['A', 'B']
    """
    counts = Counter(" ".join(doc.title.split()) for doc in docs)  # a Counter keeps first-appearance order
    counts.pop("", None)
    shown: list[str] = []
    used = len("Holds: .")
    for title, _ in counts.most_common():  # a stable sort: equal counts keep their first appearance
        if len(shown) == n:
            break
        cut = title
        if len(title) > TITLE_CHARS:  # at a word boundary where there is one, marked as cut
            head = title[: TITLE_CHARS - 1]
            cut = (head.rsplit(" ", 1)[0] if " " in head else head).rstrip(" ,;:") + "…"
        if cut in shown:  # two long titles that differ only past the cut would read the same: show one
            continue
        used += len(cut) + (len("; ") if shown else 0)
        if used > max_chars:
            break
        shown.append(cut)
    return shown


def with_titles(description: str, docs: Sequence[Doc], n: int) -> str:
    """`description` ending with `Holds: A; B; C.`, the `frequent_titles` of `docs`, adding at most
    `TITLES_CHARS` characters; unchanged when the docs have no titles.

    The titles hold no line break, so the description stays one line of the plan prompt's KB list.
    """
    sep = " " if description.endswith((".", "!", "?")) else ". "
    titles = frequent_titles(docs, n, TITLES_CHARS - len(sep))
    return f"{description}{sep}Holds: {'; '.join(titles)}." if titles else description


def local_docs(retriever: Retriever) -> list[Doc] | None:
    """The docs a loaded KB holds in memory, or None for one that holds none here (a remote KB, a Milvus one)."""
    from retrievers.media_retriever import MediaRetriever
    from retrievers.store import IndexedRetriever

    return retriever.docs if isinstance(retriever, IndexedRetriever | MediaRetriever) else None


def kb_description(cfg: KBConfig, retriever: Retriever) -> str:
    """The one-line description the policy sees: the configured (or kind default) one, plus `describe_titles`
    titles of the KB's docs."""
    description = cfg.description or describe(cfg.kind, cfg.granularity, cfg.options or {})
    if cfg.describe_titles == 0:
        return description
    docs = local_docs(retriever)
    if docs is None:  # its docs live in a service or a database: reading them all back is not worth a prompt line
        logger.debug("KB %s: describe_titles skipped, its docs are not held locally", cfg.name)
        return description
    return with_titles(description, docs, cfg.describe_titles)


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
    """Build (if asked) and load the KBs of `configs`, keyed by display name, with their policy-facing descriptions
    (`kb_description`: with `describe_titles`, computed here once per load from the loaded docs)."""
    from retrievers.kb import load_kbs

    retrievers = load_kbs(list(configs), build=build)
    return {
        cfg.display_name: KnowledgeBase(
            name=cfg.name,
            display_name=cfg.display_name,
            retriever=retrievers[cfg.name],
            k=cfg.k,
            description=kb_description(cfg, retrievers[cfg.name]),
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
