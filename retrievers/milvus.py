"""Milvus as the index of a text or table KB: embedded for laptops and tests, a cluster in production, one client.

`index: milvus` in the KB YAML stores the KB in a Milvus collection instead of FAISS files. `uri:` says which
Milvus: a local path is a Milvus Lite database (embedded, a folder on disk; the default is `<index_dir>.db`), and
`http://host:19530` is a Milvus standalone or distributed cluster (or `milvus-lite server`). The same
`pymilvus.MilvusClient` calls serve both, so a KB moves from a laptop to a cluster by changing that one line.

The engine does the searching: dense search on `vector`, BM25 on `text` through Milvus's own BM25 function
(`sparse`), and hybrid search as the engine's `hybrid_search` with its `RRFRanker(rrf_k)`. Filters on `modality`,
`source`, `source_file` and `doc_id` pass through as Milvus expressions (`search(..., where={"source": "musique"})`).

Builds are incremental: every unit is stored with a hash of its content (doc, embedded texts, BM25 text); a build
encodes and upserts only new or changed units, by id, and deletes units that left the corpus. Upserts are committed
`build_chunk` units at a time, so a killed build resumes where it stopped. The collection records the encoder and the
dimension it holds (collection property `kbrouter`): a KB with another encoder or dimension is refused, never mixed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from retrievers.config import KBConfig
from retrievers.encoders import Encoder, normalize
from retrievers.types import Doc, Hit, Query, text_queries

logger = logging.getLogger(__name__)

FILTER_FIELDS = ("modality", "source", "source_file", "doc_id")
META_KEY = "kbrouter"
CONNECT_TRIES = 3
REQUEST_TIMEOUT_S = 60.0  # every engine call is bounded
MAX_VARCHAR = 65_535  # Milvus's VARCHAR limit, in bytes
TOKEN_ENV = "KBROUTER_MILVUS_TOKEN"  # user:password or an API key, for clusters with authentication


def _pymilvus():
    try:
        import pymilvus
    except ImportError as e:
        raise ImportError(
            "`index: milvus` needs pymilvus (and milvus-lite for a local file): pip install 'kbrouter[milvus]'"
        ) from e
    return pymilvus


def is_server(uri: str) -> bool:
    """True for a server address (`http://host:19530`), False for a Milvus Lite path."""
    return "://" in uri


_CLIENTS: dict[str, object] = {}  # one MilvusClient per URI and process: Milvus Lite lets one process open a database


def connect(uri: str, tries: int = CONNECT_TRIES):  # noqa: ANN201 - a pymilvus.MilvusClient
    """The process's `MilvusClient` for `uri`, opened on first use with bounded retries.

    Raises:
        ConnectionError: the server cannot be reached after `tries` attempts; the message names the URI.
    """
    if uri in _CLIENTS:
        return _CLIENTS[uri]
    pymilvus = _pymilvus()
    if not is_server(uri):
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
    last: Exception | None = None
    for attempt in range(tries):
        try:
            client = pymilvus.MilvusClient(uri=uri, token=os.environ.get(TOKEN_ENV, ""), timeout=REQUEST_TIMEOUT_S)
        except pymilvus.MilvusException as e:
            last = e
            if attempt + 1 < tries:
                time.sleep(0.5 * 2**attempt)
            continue
        _CLIENTS[uri] = client
        return client
    if not is_server(uri):
        raise ConnectionError(
            f"Milvus Lite database {uri!r} could not be opened after {tries} tries ({last}); Milvus Lite lets one "
            "process open a database: stop the other one, or share it through `milvus-lite server --data-dir "
            f"{uri}` and `uri: http://127.0.0.1:19530` in the KB YAML"
        )
    raise ConnectionError(
        f"Milvus at {uri!r} cannot be reached after {tries} tries ({last}); start it, or fix `uri:` in the KB YAML"
    )


def close_all() -> None:
    """Close every client this process opened and stop its Milvus Lite servers (releasing their file locks)."""
    while _CLIENTS:
        uri, client = _CLIENTS.popitem()
        client.close()
        if not is_server(uri):
            from milvus_lite.server_manager import server_manager_instance

            server_manager_instance.release_server(uri)


def unit_fields(doc: Doc, cfg: KBConfig) -> dict[str, str]:
    """The filterable scalar fields of a unit: modality, source (dataset), source file and source record id."""
    meta = doc.metadata
    source_file = meta.get("file") or meta.get("path") or str(cfg.corpus)
    return {
        "modality": doc.modality,
        "source": str(meta.get("source", "")),
        "source_file": Path(str(source_file)).name,
        "doc_id": str(meta.get("doc_id", doc.id)),
    }


def where_expr(where: dict[str, str | list[str]] | None) -> str:
    """A Milvus filter expression from `{field: value or [values]}` (values quoted as JSON strings).

    Raises:
        ValueError: a field that is not filterable; the message lists those that are.
    """
    if not where:
        return ""
    parts = []
    for key, value in sorted(where.items()):
        if key not in FILTER_FIELDS:
            raise ValueError(f"filter field {key!r} is not stored; filter on one of {', '.join(FILTER_FIELDS)}")
        if isinstance(value, list | tuple):
            parts.append(f"{key} in [{', '.join(json.dumps(str(v)) for v in value)}]")
        else:
            parts.append(f"{key} == {json.dumps(str(value))}")
    return " and ".join(parts)


def _clip_bytes(text: str, limit: int = MAX_VARCHAR) -> str:
    data = text.encode("utf-8")
    return text if len(data) <= limit else data[:limit].decode("utf-8", "ignore")


def collection_meta(cfg: KBConfig, dim: int) -> dict:
    """What a collection records about its vectors: encoder, backend, dimension and search mode."""
    dense = cfg.search != "bm25"
    return {
        "encoder": cfg.encoder if dense else None,
        "encoder_backend": cfg.encoder_backend if dense else None,
        "dim": dim if dense else 0,
        "search": cfg.search,
        "kind": cfg.kind,
    }


def stored_meta(client, name: str) -> dict | None:
    """The `kbrouter` property of a collection (None when the collection does not exist)."""
    if not client.has_collection(name, timeout=REQUEST_TIMEOUT_S):
        return None
    desc = client.describe_collection(name, timeout=REQUEST_TIMEOUT_S)
    meta = json.loads(desc.get("properties", {}).get(META_KEY, "{}"))
    for f in desc["fields"]:  # the engine's own word on the dimension beats the property
        if f["name"] == "vector":
            meta["dim"] = int(f["params"]["dim"])
    return meta


def meta_problems(stored: dict, wanted: dict, where: str) -> list[str]:
    """`key: the collection holds X, this KB needs Y` for encoder/dimension/search differences."""
    keys = ("encoder", "encoder_backend", "dim") if wanted["search"] != "bm25" else ()
    problems = [f"{where}: {k}: the collection holds {stored.get(k)!r}, this KB needs {wanted[k]!r}" for k in keys
                if stored.get(k) != wanted[k]]  # fmt: skip
    if wanted["search"] != "bm25" and stored.get("search") == "bm25":
        problems.append(f"{where}: the collection has no dense vectors (built for search: bm25)")
    return problems


def _create(client, name: str, cfg: KBConfig, dim: int) -> None:
    pymilvus = _pymilvus()
    DataType = pymilvus.DataType
    schema = pymilvus.MilvusClient.create_schema(auto_id=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=2048)
    if cfg.search != "bm25":
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_field("text", DataType.VARCHAR, max_length=MAX_VARCHAR, enable_analyzer=True)
    schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
    for key in FILTER_FIELDS:
        schema.add_field(key, DataType.VARCHAR, max_length=2048)
    schema.add_field("content_sha", DataType.VARCHAR, max_length=64)
    schema.add_field("doc", DataType.JSON)
    schema.add_function(
        pymilvus.Function(
            name="bm25",
            function_type=pymilvus.FunctionType.BM25,
            input_field_names=["text"],
            output_field_names=["sparse"],
        )
    )
    indexes = client.prepare_index_params()
    if cfg.search != "bm25":
        kind = cfg.options.get("milvus_index", "FLAT")
        params = {"M": cfg.hnsw_m, "efConstruction": cfg.hnsw_ef_construction} if kind == "HNSW" else {}
        indexes.add_index(field_name="vector", index_type=kind, metric_type="IP", params=params)
    indexes.add_index(field_name="sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
    for key in FILTER_FIELDS[:3]:
        indexes.add_index(field_name=key, index_type="INVERTED")
    client.create_collection(
        name,
        schema=schema,
        index_params=indexes,
        properties={META_KEY: json.dumps(collection_meta(cfg, dim))},
        timeout=REQUEST_TIMEOUT_S,
    )


def _existing_hashes(client, name: str) -> dict[str, str]:
    it = client.query_iterator(name, batch_size=10_000, output_fields=["id", "content_sha"], timeout=REQUEST_TIMEOUT_S)
    out: dict[str, str] = {}
    try:
        while batch := it.next():
            out.update((row["id"], row["content_sha"]) for row in batch)
    finally:
        it.close()
    return out


def content_sha(doc: Doc, texts: list[str], bm25_text: str) -> str:
    """Hash of everything a unit's row is made from, to skip unchanged units on the next build."""
    payload = json.dumps([doc.to_dict(), texts, bm25_text], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()


def sync_collection(
    cfg: KBConfig,
    docs: list[Doc],
    embed_texts: list[str],
    bm25_texts: list[str],
    groups: list[int] | None,
    encoder=None,  # noqa: ANN001 - a retrievers.encoders.Encoder, or None for search: bm25
    encode=None,  # noqa: ANN001 - texts -> unit vectors (the encoder, or its multi-process pool)
    progress: bool = True,
) -> dict:
    """Make the KB's collection hold exactly `docs`: upsert new and changed units by id, delete the rest.

    Returns:
        Manifest fields: `dim`, `doc_count`, `embedded_texts` and `milvus` {uri, collection, upserted, deleted,
        unchanged}.

    Raises:
        ValueError: two units share an id, or the collection holds another encoder or dimension.
        ConnectionError: the engine cannot be reached.
    """
    from retrievers.faiss_index import progress_bar

    seen: set[str] = set()
    for doc in docs:
        if doc.id in seen:
            raise ValueError(f"KB {cfg.name!r}: two units have the id {doc.id!r}; ids are the collection's keys")
        seen.add(doc.id)
    dense = cfg.search != "bm25"
    dim = encoder.dim if dense else 0
    texts_of: list[list[int]] = [[] for _ in docs]
    for t, d in enumerate(groups if groups is not None else range(len(docs))):
        texts_of[d].append(t)
    client = connect(cfg.uri)
    name = cfg.collection
    stored = stored_meta(client, name)
    if stored is None:
        _create(client, name, cfg, dim)
        existing: dict[str, str] = {}
    else:
        problems = meta_problems(stored, collection_meta(cfg, dim), f"collection {name!r} at {cfg.uri!r}")
        if problems:
            raise ValueError(
                "\n  ".join([f"KB {cfg.name!r}: refusing to mix vectors:", *problems])
                + "\nUse another `collection:` name, or drop that collection first"
            )
        existing = _existing_hashes(client, name)
    hashes = [content_sha(d, [embed_texts[t] for t in texts_of[i]], bm25_texts[i]) for i, d in enumerate(docs)]
    gone = sorted(set(existing) - seen)
    for start in range(0, len(gone), 10_000):
        client.delete(name, ids=gone[start : start + 10_000], timeout=REQUEST_TIMEOUT_S)
    todo = [i for i, d in enumerate(docs) if existing.get(d.id) != hashes[i]]
    logger.info("KB %s: %d units to upsert, %d to delete, %d unchanged", cfg.name, len(todo), len(gone),
                len(docs) - len(todo))  # fmt: skip
    with progress_bar(progress, f"upsert {name}", len(todo)) as advance:
        for start in range(0, len(todo), cfg.build_chunk):
            batch = todo[start : start + cfg.build_chunk]
            vectors = _unit_vectors(batch, texts_of, embed_texts, encode) if dense else None
            rows = []
            for j, i in enumerate(batch):
                doc = docs[i]
                row = {
                    "id": doc.id,
                    "text": _clip_bytes(bm25_texts[i]),
                    "content_sha": hashes[i],
                    "doc": doc.to_dict(),
                    **unit_fields(doc, cfg),
                }
                if vectors is not None:
                    row["vector"] = vectors[j].tolist()
                rows.append(row)
            client.upsert(name, rows, timeout=REQUEST_TIMEOUT_S)
            advance(len(rows))
    client.flush(name, timeout=REQUEST_TIMEOUT_S)
    stats = {"uri": cfg.uri, "collection": name, "upserted": len(todo), "deleted": len(gone)}
    return {"dim": dim, "doc_count": len(docs), "embedded_texts": len(embed_texts), "milvus": stats}


def _unit_vectors(batch: list[int], texts_of: list[list[int]], embed_texts: list[str], encode) -> np.ndarray:  # noqa: ANN001
    """One unit vector per doc of `batch`: its text's vector, or the renormalised mean of its texts' vectors."""
    flat = [t for i in batch for t in texts_of[i]]
    vectors = np.asarray(encode([embed_texts[t] for t in flat]), dtype=np.float32)
    owner = np.repeat(np.arange(len(batch)), [len(texts_of[i]) for i in batch])
    out = np.zeros((len(batch), vectors.shape[1]), dtype=np.float32)
    np.add.at(out, owner, vectors)
    return normalize(out)


def collection_problems(manifest: dict) -> list[str]:
    """Problems of a built Milvus KB against its manifest: collection gone, other encoder/dimension, other count."""
    info = manifest.get("milvus") or {}
    uri, name = info.get("uri"), info.get("collection")
    if not uri or not name:
        return ["manifest.json: no `milvus` {uri, collection}"]
    if not is_server(uri) and not Path(uri).exists():
        return [f"{uri}: the Milvus Lite database is missing"]
    client = connect(uri)
    stored = stored_meta(client, name)
    where = f"collection {name!r} at {uri!r}"
    if stored is None:
        return [f"{where}: missing"]
    wanted = {"encoder": manifest.get("encoder"), "encoder_backend": manifest.get("encoder_backend"),
              "dim": manifest.get("dim"), "search": manifest.get("search")}  # fmt: skip
    problems = meta_problems(stored, wanted, where)
    rows = client.get_collection_stats(name, timeout=REQUEST_TIMEOUT_S)["row_count"]
    if rows != manifest.get("doc_count"):
        problems.append(f"{where}: {rows} units, the manifest says {manifest.get('doc_count')}")
    return problems


class MilvusRetriever:
    """Searches one KB's Milvus collection: dense, BM25 or the engine's hybrid (RRF). Satisfies `Retriever`."""

    def __init__(self, cfg: KBConfig, client, encoder) -> None:  # noqa: ANN001 - MilvusClient, Encoder | None
        self.cfg = cfg
        self.name = cfg.name
        self._client = client
        self._encoder = encoder

    @classmethod
    def load(cls, cfg: KBConfig, encoder: Encoder | None) -> MilvusRetriever:
        """Open the KB's collection (the caller checked it against the manifest first).

        Args:
            cfg: the KB.
            encoder: embeds the queries (`retrievers.store.encoder_for(cfg)`); None for a BM25-only KB.
        """
        client = connect(cfg.uri)
        client.load_collection(cfg.collection, timeout=REQUEST_TIMEOUT_S)
        return cls(cfg, client, encoder)

    def __len__(self) -> int:
        return self._client.get_collection_stats(self.cfg.collection, timeout=REQUEST_TIMEOUT_S)["row_count"]

    def search(
        self, queries: list[str | Query], k: int | None = None, where: dict[str, str | list[str]] | None = None
    ) -> list[list[Hit]]:
        """Top-k hits per query, best first; an empty query gets an empty list.

        Args:
            queries: query strings or `Query`s (a query image is ignored).
            k: hits per query; defaults to the KB's `k`.
            where: metadata filter `{field: value or [values]}` on `modality`, `source`, `source_file`, `doc_id`.
        """
        k = k or self.cfg.k
        live, live_texts = text_queries(queries)
        results: list[list[Hit]] = [[] for _ in queries]
        if not live:
            return results
        expr = where_expr(where)
        name, mode = self.cfg.collection, self.cfg.search
        common = {"limit": k, "output_fields": ["doc"], "timeout": REQUEST_TIMEOUT_S}
        if mode == "bm25":
            raw = self._client.search(name, data=live_texts, anns_field="sparse", filter=expr, **common)
        else:
            vectors = self._encoder.encode(live_texts).tolist()
            dense_params = {"metric_type": "IP", "params": {"ef": self.cfg.hnsw_ef_search}}
            if mode == "dense":
                raw = self._client.search(
                    name, data=vectors, anns_field="vector", filter=expr, search_params=dense_params, **common
                )
            else:
                pymilvus = _pymilvus()
                depth = max(k, self.cfg.fusion_depth)
                requests = [
                    pymilvus.AnnSearchRequest(vectors, "vector", dense_params, limit=depth, expr=expr or None),
                    pymilvus.AnnSearchRequest(live_texts, "sparse", {}, limit=depth, expr=expr or None),
                ]
                raw = self._client.hybrid_search(name, requests, pymilvus.RRFRanker(self.cfg.rrf_k), **common)
        for i, hits in zip(live, raw, strict=True):
            # BM25: Milvus Lite reports the score negated (a distance); a server reports it positive
            results[i] = [
                Hit(
                    doc=Doc.from_dict({**h["entity"]["doc"], "kb": self.name}),
                    score=abs(float(h["distance"])) if mode == "bm25" else float(h["distance"]),
                    rank=r,
                    kb=self.name,
                )
                for r, h in enumerate(hits)
            ]
        return results
