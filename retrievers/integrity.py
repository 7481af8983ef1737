"""Index integrity: the manifest's record of each index file (size, checksums) and of the document count, checked
before an index is reused or loaded.

`manifest["files"]` maps each file's path inside the index folder to `{"size", "sha256", "sample_sha256"}`:

- the fast check (every load and reuse) compares each file's size and `sample_sha256` (a hash of its size and its
  first and last MiB, so a small file is hashed whole) and the counts: `docs.jsonl` lines, BM25 `num_docs` and
  the rows of the media vector files against `doc_count`. A truncated FAISS file, missing `docs.jsonl` lines or a
  file swapped for another one fails it;
- the full check (`kbrouter index --verify`) also hashes every file whole (`sha256`).

A manifest written before files were recorded is upgraded in place: its counts are checked (the FAISS file's
`ntotal` too), then the checksums are computed once and written into it. Nothing else in it changes, so the
index keeps its identity (`created`, `corpus_sha256`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
SAMPLE_BYTES = 1 << 20  # the fast check hashes this much from each end of a file
DOCS_FILE = "docs.jsonl"
FAISS_FILE = "dense.faiss"
BM25_PARAMS = "bm25/params.index.json"
VECTOR_FILES = ("visual.npy", "text.npy")  # image / clip / video KBs: one row per doc


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sample_sha256(path: Path) -> str:
    """Hash of a file's size and its first and last `SAMPLE_BYTES` (the whole file when it is smaller)."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        if size <= 2 * SAMPLE_BYTES:
            h.update(f.read())
        else:
            h.update(f.read(SAMPLE_BYTES))
            f.seek(size - SAMPLE_BYTES)
            h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def record_files(index_dir: Path) -> dict[str, dict]:
    """`{relative path: {size, sha256, sample_sha256}}` of every file in an index folder but the manifest."""
    index_dir = Path(index_dir)
    out = {}
    for p in sorted(index_dir.rglob("*")):
        if p.is_file() and p.name != MANIFEST and not p.name.startswith(f"{MANIFEST}."):
            rel = p.relative_to(index_dir).as_posix()
            out[rel] = {"size": p.stat().st_size, "sha256": sha256_file(p), "sample_sha256": sample_sha256(p)}
    return out


def count_problems(index_dir: Path, manifest: dict, faiss_rows: bool = False) -> list[str]:
    """`<file>: <problem>` for every index file whose count of documents differs from `doc_count`.

    Args:
        index_dir: the index folder.
        manifest: its manifest.
        faiss_rows: also read the FAISS file's `ntotal` (an old manifest has no sizes to catch a truncated one).
    """
    index_dir = Path(index_dir)
    n = manifest.get("doc_count")
    if not isinstance(n, int):
        return [f"{index_dir / MANIFEST}: no `doc_count`"]
    problems = []
    docs = index_dir / DOCS_FILE
    if docs.is_file():
        data = docs.read_bytes()
        lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
        if lines != n:
            problems.append(f"{docs}: {lines} lines, the manifest says {n} documents")
    else:
        problems.append(f"{docs}: missing")
    params = index_dir / BM25_PARAMS
    if params.is_file():
        try:
            num = json.loads(params.read_text()).get("num_docs")
        except (ValueError, UnicodeDecodeError):
            num = "unreadable"
        if num != n:
            problems.append(f"{params}: num_docs {num}, the manifest says {n} documents")
    for name in VECTOR_FILES:
        path = index_dir / name
        if path.is_file():
            import numpy as np

            try:
                rows = np.load(path, mmap_mode="r").shape[0]
            except (ValueError, OSError) as e:
                problems.append(f"{path}: unreadable ({e})")
                continue
            if rows != n:
                problems.append(f"{path}: {rows} vectors, the manifest says {n} documents")
    faiss_path = index_dir / FAISS_FILE
    if faiss_rows and faiss_path.is_file():
        try:
            import faiss

            try:
                ntotal = faiss.read_index(str(faiss_path), faiss.IO_FLAG_MMAP).ntotal
            except RuntimeError:  # some index types cannot be mapped: read it whole
                ntotal = faiss.read_index(str(faiss_path)).ntotal
        except ImportError:
            ntotal = n  # no FAISS here: the dense index cannot be loaded anyway, and says so then
        except RuntimeError as e:
            problems.append(f"{faiss_path}: unreadable ({str(e).strip().splitlines()[-1]})")
            ntotal = n
        if ntotal != n:
            problems.append(f"{faiss_path}: {ntotal} vectors, the manifest says {n} documents")
    return problems


def file_problems(index_dir: Path, manifest: dict, full: bool = False) -> list[str]:
    """`<file>: <problem>` for every recorded file that is missing, has another size or other bytes.

    Args:
        index_dir: the index folder.
        manifest: its manifest, with `files`.
        full: hash every file whole (slow on large indexes); else compare sizes and the sampled hashes.
    """
    index_dir = Path(index_dir)
    problems = []
    for rel, rec in sorted(manifest["files"].items()):
        path = index_dir / rel
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif (size := path.stat().st_size) != rec["size"]:
            problems.append(f"{path}: {size} bytes, the manifest says {rec['size']} (truncated or replaced)")
        elif sample_sha256(path) != rec["sample_sha256"] or (full and sha256_file(path) != rec["sha256"]):
            problems.append(f"{path}: its bytes differ from the manifest's checksum (replaced or modified)")
    return problems


def check_index(index_dir: Path, manifest: dict, full: bool = False) -> tuple[list[str], dict]:
    """Check an index folder against its manifest; upgrade an old manifest (no `files`) in place.

    Returns:
        `(problems, manifest)`: the problems (empty when the index is intact), and the manifest (with `files` after
        an upgrade).
    """
    index_dir = Path(index_dir)
    if "remote" in manifest:
        return [], manifest
    if manifest.get("index") == "milvus":  # the units live in the engine: it is checked there
        from retrievers.milvus import collection_problems

        return collection_problems(manifest), manifest
    if "files" not in manifest:
        problems = count_problems(index_dir, manifest, faiss_rows=True)
        if problems:
            return problems, manifest
        manifest = {**manifest, "files": record_files(index_dir)}
        try:
            write_manifest(index_dir, manifest)
            logger.info(
                "index %s: recorded its files' sizes and checksums in %s (an older manifest)", index_dir, MANIFEST
            )
        except OSError as e:  # a read-only cache: the counts were checked, the checksums are kept in memory
            logger.warning("index %s: could not add checksums to its manifest (%s); counts checked only", index_dir, e)
        return [], manifest
    return file_problems(index_dir, manifest, full) + count_problems(index_dir, manifest), manifest


def write_manifest(index_dir: Path, manifest: dict) -> None:
    """Write `manifest.json` through a temporary file and a rename (never half-written)."""
    tmp = Path(index_dir) / f"{MANIFEST}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False))
    os.replace(tmp, Path(index_dir) / MANIFEST)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_leftovers(index_dir: Path) -> list[Path]:
    """Delete `<name>.building-<pid>` and `<name>.old-<pid>` folders left by builds whose process is gone.

    Returns:
        The folders removed.
    """
    index_dir = Path(index_dir)
    removed = []
    if not index_dir.parent.is_dir():
        return removed
    for tag in ("building", "old"):
        for p in index_dir.parent.glob(f"{index_dir.name}.{tag}-*"):
            pid = p.name.rsplit("-", 1)[-1]
            if p.is_dir() and pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                shutil.rmtree(p, ignore_errors=True)
                logger.info("removed %s (left by an interrupted build)", p)
                removed.append(p)
    return removed
