"""Building and loading knowledge bases: `build_kb` writes an index folder, `load_kb` reads it back.

`KB_KINDS` is the one place that maps a config `kind` to its builder and loader; a new modality adds one entry here
and one in `retrievers.config.KIND_DEFAULTS` (its granularities and default search).
An index folder is complete only once `manifest.json` exists (it is written last, by rename), and it is reused
only while the manifest matches the config and the corpus bytes, and its files match the sizes, checksums and
document count the manifest records (`retrievers.integrity`): a corrupt index is rebuilt by `build_kb` and refused,
naming the file, by `load_kb`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from retrievers import integrity
from retrievers.config import KBConfig
from retrievers.image import build_image_kb, load_image_kb
from retrievers.integrity import check_index, record_files, remove_leftovers, write_manifest
from retrievers.store import IndexedRetriever
from retrievers.table import build_table_index
from retrievers.text import build_text_index
from retrievers.types import Retriever
from retrievers.video import build_clip_kb, build_video_kb, load_clip_kb, load_video_kb

logger = logging.getLogger(__name__)

MANIFEST = integrity.MANIFEST
# Writes a KB's index files into a folder and returns manifest fields (at least `dim` and `doc_count`).
BuildFn = Callable[[KBConfig, Path, bool], dict]
LoadFn = Callable[[KBConfig], Retriever]


@dataclass(frozen=True)
class KBKind:
    """How one kind of KB is built and loaded (its config defaults are `retrievers.config.KIND_DEFAULTS`)."""

    build: BuildFn
    load: LoadFn


KB_KINDS: dict[str, KBKind] = {
    "text": KBKind(build_text_index, IndexedRetriever.load),
    "table": KBKind(build_table_index, IndexedRetriever.load),
    "image": KBKind(build_image_kb, load_image_kb),
    "clip": KBKind(build_clip_kb, load_clip_kb),
    "video": KBKind(build_video_kb, load_video_kb),
}

# Manifest fields that must match the config for an index to be reused; query-time settings (k, nprobe,
# efSearch, rrf_k, fusion_depth) are left out so changing them needs no rebuild.
MATCHED = ("kind", "granularity", "corpus_sha256", "unit_params")
MATCHED_DENSE = ("encoder", "encoder_backend", "index", "index_params")


def kbrouter_version() -> str:
    """The installed kbrouter version (without importing kbrouter, which sits above this package)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kbrouter")
    except PackageNotFoundError:
        return "0+unknown"


def corpus_files(cfg: KBConfig) -> list[Path]:
    """Files whose bytes define the KB: the corpus (file or folder) and any `*_file` option."""
    corpus = Path(cfg.corpus)
    files = sorted(p for p in corpus.rglob("*") if p.is_file()) if corpus.is_dir() else [corpus]
    files += [Path(v) for k, v in sorted(cfg.options.items()) if k.endswith("_file") and v]
    return files


def corpus_sha256(cfg: KBConfig) -> str:
    """sha256 over the corpus files' relative names and bytes."""
    h = hashlib.sha256()
    base = Path(cfg.corpus)
    for path in corpus_files(cfg):
        h.update(str(path.relative_to(base) if path.is_relative_to(base) else path.name).encode())
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def expected_manifest(cfg: KBConfig) -> dict:
    """The manifest fields a fresh build of `cfg` would have (those compared before reuse)."""
    milvus = cfg.index == "milvus"  # the engine also holds BM25, so it is the index of a bm25-only KB too
    dense = cfg.search != "bm25"
    index_params = {}
    if cfg.index == "hnsw":
        index_params = {"hnsw_m": cfg.hnsw_m, "hnsw_ef_construction": cfg.hnsw_ef_construction}
    elif cfg.index == "ivf":
        index_params = {"ivf_nlist": cfg.ivf_nlist}
    elif cfg.index == "ivfpq":
        index_params = {"ivf_nlist": cfg.ivf_nlist, "pq_m": cfg.pq_m, "pq_bits": cfg.pq_bits, "refine": cfg.refine}
    elif milvus:
        index_params = {"uri": cfg.uri, "collection": cfg.collection}
    if cfg.index in ("ivf", "ivfpq") and cfg.train_sample != KBConfig.train_sample:
        index_params["train_sample"] = cfg.train_sample  # left out at its default: older manifests stay valid
    if cfg.shards != 1 and not milvus:
        index_params["shards"] = cfg.shards
    return {
        "kind": cfg.kind,
        "granularity": cfg.granularity,
        "search": cfg.search,
        "encoder": cfg.encoder if dense else None,
        "encoder_backend": cfg.encoder_backend if dense else None,
        "backend": "milvus" if milvus else "faiss",
        "index": cfg.index if dense or milvus else None,
        "index_params": index_params if dense or milvus else None,
        "corpus_sha256": corpus_sha256(cfg),
        "unit_params": json.loads(
            json.dumps({"chunk_words": cfg.chunk_words, "options": _options_key(cfg)}, default=str)
        ),
    }


def _options_key(cfg: KBConfig) -> dict:
    """The options as a manifest compares them: a `_file` option by its file name, since its bytes are already in
    `corpus_sha256`; its absolute path would make another checkout (a clone, a git worktree) of the same files
    rebuild every such index."""
    return {k: Path(v).name if k.endswith("_file") and isinstance(v, str) else v for k, v in cfg.options.items()}


def read_manifest(index_dir: Path) -> dict | None:
    """The manifest of an index folder, or None when there is none (never built, or interrupted) or it is not a
    readable JSON mapping (a corrupt manifest is an unfinished build: it is rebuilt)."""
    path = Path(index_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        logger.warning("%s is not valid JSON: the index counts as unbuilt", path)
        return None
    return manifest if isinstance(manifest, dict) else None


def manifest_mismatches(cfg: KBConfig, manifest: dict) -> list[str]:
    """Human-readable `field: expected X, found Y` lines for every compared field that differs.

    A hybrid index holds both rankers, so it also serves a dense-only or BM25-only config of the same KB.
    """
    expected = expected_manifest(cfg)
    keys = MATCHED + (MATCHED_DENSE if cfg.search != "bm25" else ())
    if cfg.search == "bm25" and cfg.index == "milvus":  # a Milvus KB holds its BM25 in the engine
        keys += ("index", "index_params")
    problems = [f"{key}: expected {expected[key]!r}, found {manifest.get(key)!r}" for key in keys
                if manifest.get(key) != expected[key]]  # fmt: skip
    if manifest.get("search") not in (cfg.search, "hybrid"):
        also = " (or 'hybrid')" if cfg.search != "hybrid" else ""
        problems.append(f"search: expected {cfg.search!r}{also}, found {manifest.get('search')!r}")
    return problems


def build_kb(cfg: KBConfig, force: bool = False, progress: bool = True, verify: bool = False) -> Path:
    """Build the index of one KB into `cfg.index_dir`, or reuse it when its manifest is up to date and its files
    are intact.

    Args:
        cfg: the KB.
        force: rebuild even when the manifest matches.
        progress: show progress bars while encoding.
        verify: hash every index file whole before reusing it (else sizes, sampled hashes and counts are checked).

    Returns:
        The index folder (`build_kb_status` also says whether it was reused).
    """
    return build_kb_status(cfg, force=force, progress=progress, verify=verify)[0]


def build_kb_status(
    cfg: KBConfig, force: bool = False, progress: bool = True, verify: bool = False
) -> tuple[Path, dict, bool]:
    """Like `build_kb`, also returning the manifest and whether the index was reused (True) or built."""
    index_dir = Path(cfg.index_dir)
    if "remote" in cfg.options:  # served by `kbrouter serve-retrieval`: nothing to build here
        return index_dir, {"doc_count": 0, "dim": 0, "remote": cfg.options["remote"]}, True
    remove_leftovers(index_dir)
    manifest = read_manifest(index_dir)
    if manifest is not None and not force:
        mismatches = manifest_mismatches(cfg, manifest)
        if not mismatches:
            problems, manifest = check_index(index_dir, manifest, full=verify)
            if not problems:
                logger.info("KB %s: index %s is up to date%s", cfg.name, index_dir, " (verified)" if verify else "")
                return index_dir, manifest, True
            mismatches = [f"corrupt: {p}" for p in problems]
            logger.warning("KB %s: the index is corrupt (%s); rebuilding it", cfg.name, "; ".join(problems))
        logger.info("KB %s: rebuilding %s (%s)", cfg.name, index_dir, "; ".join(mismatches))
    start = time.perf_counter()
    # Build into a private folder and swap it in at the end: a crash or a concurrent build (another process using
    # the same cache) never sees, or deletes, a half-built index.
    final_dir, index_dir = index_dir, index_dir.with_name(f"{index_dir.name}.building-{os.getpid()}")
    shutil.rmtree(index_dir, ignore_errors=True)
    index_dir.mkdir(parents=True)
    info = KB_KINDS[cfg.kind].build(cfg, index_dir, progress)
    manifest = {
        "name": cfg.name,
        **expected_manifest(cfg),
        **info,
        "corpus": str(cfg.corpus),
        "kbrouter_version": kbrouter_version(),
        "build_seconds": round(time.perf_counter() - start, 2),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    manifest["files"] = record_files(index_dir)
    write_manifest(index_dir, manifest)
    old = final_dir.with_name(f"{final_dir.name}.old-{os.getpid()}")
    if final_dir.exists():
        final_dir.rename(old)
    index_dir.rename(final_dir)
    shutil.rmtree(old, ignore_errors=True)
    index_dir = final_dir
    logger.info(
        "KB %s: built %s (%d docs) in %.1fs", cfg.name, index_dir, info["doc_count"], manifest["build_seconds"]
    )
    return index_dir, manifest, False


def load_kb(cfg: KBConfig) -> Retriever:
    """Load a built KB, after checking that its manifest matches the config and the corpus.

    Raises:
        FileNotFoundError: no complete index in `cfg.index_dir`.
        ValueError: the index was built from another encoder, corpus or settings, or one of its files is corrupt
            (truncated, missing lines, replaced); the message names the differences or files and the rebuild command.
    """
    if "remote" in cfg.options:  # one line of YAML switches a KB to the shared retrieval service
        from retrievers.remote import remote_kb_from_config

        return remote_kb_from_config(cfg)
    index_dir = Path(cfg.index_dir)
    manifest = read_manifest(index_dir)
    if manifest is None:
        raise FileNotFoundError(
            f"KB {cfg.name!r}: no built index in {str(index_dir)!r} (no {MANIFEST}); build it with: {cfg.fix_command}"
        )
    mismatches = manifest_mismatches(cfg, manifest)
    if mismatches:
        raise ValueError(
            f"KB {cfg.name!r}: the index in {str(index_dir)!r} does not match the config:\n  "
            + "\n  ".join(mismatches)
            + f"\nRebuild it with: {cfg.fix_command}"
        )
    problems, _ = check_index(index_dir, manifest)
    if problems:
        raise ValueError(
            f"KB {cfg.name!r}: the index in {str(index_dir)!r} is corrupt:\n  "
            + "\n  ".join(problems)
            + f"\nRebuild it with: {cfg.fix_command}"
        )
    if cfg.index == "milvus":
        from retrievers.milvus import MilvusRetriever
        from retrievers.store import encoder_for  # looked up at call time: tests swap the encoder

        return MilvusRetriever.load(cfg, encoder_for(cfg) if cfg.search != "bm25" else None)
    return KB_KINDS[cfg.kind].load(cfg)


def load_kbs(configs: list[KBConfig], build: bool = False) -> dict[str, Retriever]:
    """Load several KBs into a dict keyed by `cfg.name`, building each one first when `build` is set.

    `agent.kbs.load_knowledge_bases` wraps this with the display names and descriptions the policy sees.
    """
    kbs = {}
    for cfg in configs:
        if build:  # a no-op for an up-to-date index
            build_kb(cfg, progress=False)
        kbs[cfg.name] = load_kb(cfg)
    return kbs
