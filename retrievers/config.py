"""Knowledge-base configuration: one `KBConfig` per KB, read from YAML by `load_kb_configs`.

A KB file looks like::

    knowledge_bases:
      - name: text
        display_name: Text Retriever
        kind: text
        corpus: ../../data/demo/passages.jsonl

The file is read by `retrievers.config_file` (the one YAML dialect of every config); relative paths resolve
against the YAML file's directory. Loading a config has no side effects: nothing is
created, downloaded or encoded; `retrievers.kb.build_kb` does the work.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from retrievers.config_file import load_yaml, resolve_path
from retrievers.types import GRANULARITIES

SEARCH_MODES = ("dense", "bm25", "hybrid")
# FAISS kinds (embedded, the default) and `milvus`: a Milvus collection, embedded (Milvus Lite file) or by URI.
INDEX_TYPES = ("flat", "hnsw", "ivf", "ivfpq", "milvus")
REFINE_TYPES = ("none", "flat", "fp16", "sq8")
ENCODER_BACKENDS = ("sentence-transformers", "flagembedding")
FIX_INDEX = "kbrouter index --kb {file} --force"


@dataclass(frozen=True)
class KindDefaults:
    """What a config of one KB kind may say and leaves out: its granularities (the first is the default) and its
    default search mode."""

    granularities: tuple[str, ...]
    search: str


# One entry per key of `retrievers.kb.KB_KINDS` (which maps a kind to its builder and loader); kept here so that
# validating a config needs no builder, and this module imports nothing that imports it back.
KIND_DEFAULTS: dict[str, KindDefaults] = {
    "text": KindDefaults(("paragraph", "document"), "hybrid"),
    "table": KindDefaults(("table",), "hybrid"),
    "image": KindDefaults(("image",), "dense"),
    "clip": KindDefaults(("clip",), "dense"),
    "video": KindDefaults(("video",), "dense"),
}


_SCALARS = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def check_field_types(obj: object, where: str = "") -> None:
    """Check the plain scalar fields (`int`, `float`, `bool`, `str`, optionally `| None`) of a dataclass instance:
    `k: true` is not an int, `m: abc` is not a number, `mmap: no` (a string) is not a bool.

    Raises:
        ValueError: a field holds a value of another type; the message names the key and what it needs.
    """
    for f in fields(obj):  # type: ignore[arg-type]
        kind = str(f.type).replace(" ", "")
        optional = kind.endswith("|None")
        kind = kind.removesuffix("|None")
        if kind not in _SCALARS:
            continue
        value = getattr(obj, f.name)
        if value is None and optional:
            continue
        ok = isinstance(value, _SCALARS[kind]) and (kind == "bool" or not isinstance(value, bool))
        if not ok:
            need = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}[kind]
            hint = " (quoted in the YAML?)" if isinstance(value, str) and kind != "str" else ""
            raise ValueError(f"{where}`{f.name}` must be {need}{' or null' if optional else ''}, got {value!r}{hint}")


def default_cache_dir() -> Path:
    """Return `$KBROUTER_CACHE` or `~/.cache/kbrouter`."""
    return Path(os.environ.get("KBROUTER_CACHE") or Path.home() / ".cache" / "kbrouter").expanduser()


@dataclass
class KBConfig:
    """One knowledge base: what it holds, how it is embedded and indexed, and where the index lives.

    Kind-specific defaults (`granularity`, `search`) are resolved from `KIND_DEFAULTS`.
    """

    name: str = field(metadata={"help": "Identifier used in code, in `Hit.kb` and in `Doc.kb`."})
    kind: str = field(metadata={"help": "KB kind, a key of `KIND_DEFAULTS` (e.g. `text`, `table`)."})
    corpus: str | Path = field(metadata={"help": "Corpus file or folder (JSONL passages, table folder/JSONL)."})
    display_name: str = field(default="", metadata={"help": "What the policy writes in `<ret>`; default: name."})
    description: str = field(default="", metadata={"help": "One line for the policy's system prompt."})
    describe_titles: int = field(
        default=0,
        metadata={
            "help": "The policy's description of this KB ends with up to N of its most frequent distinct document "
            'titles, "Holds: A; B; C."; for KBs of a few sources, like videos or a report\'s tables; 0 = off. '
            "Read from the loaded docs (`agent.kbs.knowledge_bases`): a remote or Milvus KB, whose docs are not "
            "held locally, keeps its description."
        },
    )
    granularity: str | None = field(default=None, metadata={"help": "paragraph|document|table|...; kind default."})
    encoder: str = field(default="minilm", metadata={"help": "`minilm`, a sentence-transformers name, or a path."})
    encoder_backend: str = field(
        default="sentence-transformers", metadata={"help": "sentence-transformers|flagembedding"}
    )
    device: str | None = field(default=None, metadata={"help": "Encoder device (cpu, cuda); None lets it choose."})
    batch_size: int = field(default=64, metadata={"help": "Encoder batch size."})
    search: str | None = field(default=None, metadata={"help": "dense|bm25|hybrid; kind default (hybrid for text)."})
    index: str = field(
        default="flat", metadata={"help": "flat (exact) | hnsw | ivf | ivfpq (FAISS, embedded) | milvus (a database)."}
    )
    hnsw_m: int = field(default=32, metadata={"help": "HNSW graph degree (build time)."})
    hnsw_ef_construction: int = field(default=40, metadata={"help": "HNSW efConstruction (build time)."})
    hnsw_ef_search: int = field(default=64, metadata={"help": "HNSW efSearch (query time, no rebuild needed)."})
    ivf_nlist: int = field(default=1024, metadata={"help": "IVF lists (build time; capped by corpus size)."})
    nprobe: int = field(default=16, metadata={"help": "IVF lists probed per query (query time)."})
    pq_m: int = field(default=48, metadata={"help": "IVF-PQ sub-quantizers (build time; must divide the dim)."})
    pq_bits: int = field(default=8, metadata={"help": "IVF-PQ bits per sub-quantizer code (build time)."})
    refine: str = field(
        default="none", metadata={"help": "IVF-PQ re-ranking store: none | flat | fp16 | sq8 (build time)."}
    )
    refine_k_factor: int = field(default=4, metadata={"help": "IVF-PQ candidates re-ranked per hit (query time)."})
    shards: int = field(default=1, metadata={"help": "FAISS shard files searched together (faiss.IndexShards)."})
    train_sample: int = field(default=100_000, metadata={"help": "Vectors IVF/IVF-PQ is trained on (build time)."})
    build_chunk: int = field(
        default=20_000, metadata={"help": "Texts encoded per resumable chunk (an interrupted build resumes)."}
    )
    encode_workers: int = field(
        default=1, metadata={"help": "Encoder processes (sentence-transformers pool; `kbrouter index --workers`)."}
    )
    uri: str = field(
        default="",
        metadata={"help": "index: milvus: a Milvus Lite file path or http(s)://host:port; default <index_dir>.db."},
    )
    collection: str = field(default="", metadata={"help": "index: milvus: collection name; default the KB name."})
    mmap: bool = field(default=False, metadata={"help": "Memory-map the FAISS index on load."})
    rrf_k: int = field(default=60, metadata={"help": "Reciprocal-rank-fusion constant for hybrid search."})
    fusion_depth: int = field(default=50, metadata={"help": "Candidates taken from each ranker before fusion."})
    index_dir: str | Path | None = field(default=None, metadata={"help": "Default $KBROUTER_CACHE/indexes/<name>."})
    k: int = field(default=5, metadata={"help": "Default number of hits."})
    chunk_words: int = field(default=100, metadata={"help": "Max words per passage (text) or row chunk (table)."})
    options: dict = field(
        default_factory=dict,
        metadata={"help": "Kind-specific settings (see the kind module); keys ending in `_file` are paths."},
    )
    source_file: str = field(default="", compare=False, metadata={"help": "YAML file it came from (set by loader)."})

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"`name` must be a non-empty string, got {self.name!r}")
        if self.kind not in KIND_DEFAULTS:
            raise ValueError(
                f"KB {self.name!r}: unknown `kind` {self.kind!r}; valid kinds: {', '.join(sorted(KIND_DEFAULTS))}"
            )
        spec = KIND_DEFAULTS[self.kind]
        self.display_name = self.display_name or self.name
        self.granularity = self.granularity or spec.granularities[0]
        if self.granularity not in spec.granularities:
            raise ValueError(
                f"KB {self.name!r}: `granularity` {self.granularity!r} is not valid for kind {self.kind!r}; "
                f"use one of {', '.join(spec.granularities)}"
            )
        assert self.granularity in GRANULARITIES, self.granularity
        self.search = self.search or spec.search
        for key, value, valid in (
            ("search", self.search, SEARCH_MODES),
            ("index", self.index, INDEX_TYPES),
            ("encoder_backend", self.encoder_backend, ENCODER_BACKENDS),
            ("refine", self.refine, REFINE_TYPES),
        ):
            if value not in valid:
                raise ValueError(f"KB {self.name!r}: `{key}` is {value!r}; use one of {', '.join(valid)}")
        for key in ("display_name", "encoder", "description", "uri", "collection"):
            value = getattr(self, key, "")
            if value is not None and not isinstance(value, str):
                raise ValueError(f"KB {self.name!r}: `{key}` must be a string, got {value!r}; quote it in the YAML")
        int_keys = ("k", "chunk_words", "batch_size", "hnsw_m", "hnsw_ef_construction", "hnsw_ef_search")
        large_keys = ("pq_m", "pq_bits", "refine_k_factor", "shards", "train_sample", "build_chunk", "encode_workers")
        for key in (*int_keys, "ivf_nlist", "nprobe", "rrf_k", "fusion_depth", *large_keys):
            value = getattr(self, key)
            # a bool is an int to Python: `k: true` would silently become 1
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"KB {self.name!r}: `{key}` must be a positive integer, got {value!r}")
        if self.description and self.description.splitlines() != [self.description]:
            raise ValueError(
                f"KB {self.name!r}: `description` must be one line (the plan prompt lists one KB per line), got "
                f"{self.description!r}; write it on one line (a YAML `>` block ends with a line break, `>-` does not)"
            )
        # a bool is an int to Python: `describe_titles: true` would silently become 1
        titles = self.describe_titles
        if isinstance(titles, bool) or not isinstance(titles, int) or titles < 0:
            raise ValueError(
                f"KB {self.name!r}: `describe_titles` must be an integer >= 0 (how many document titles the "
                f"description lists; 0 = off), got {titles!r}; set e.g. `describe_titles: 6`"
            )
        if not isinstance(self.mmap, bool):  # `mmap: no` is the string "no" (retrievers.config_file's dialect)
            raise ValueError(
                f"KB {self.name!r}: `mmap` must be true or false (unquoted; `yes`/`no` are strings), got {self.mmap!r}"
            )
        if not isinstance(self.options, dict):
            raise ValueError(f"KB {self.name!r}: `options` must be a mapping, got {type(self.options).__name__}")
        self.corpus = Path(self.corpus)
        if not self.corpus.exists():
            raise FileNotFoundError(
                f"KB {self.name!r}: `corpus` {str(self.corpus)!r} does not exist; fix the path "
                "(relative paths resolve against the YAML file's directory)"
            )
        self.index_dir = Path(self.index_dir) if self.index_dir else default_cache_dir() / "indexes" / self.name
        if self.index == "milvus" and self.kind not in ("text", "table"):
            raise ValueError(f"KB {self.name!r}: `index: milvus` is for text and table KBs, not kind {self.kind!r}")
        if self.index == "milvus":
            self.uri = self.uri or str(Path(self.index_dir).with_name(f"{Path(self.index_dir).name}.db"))
            self.collection = self.collection or self.name
        elif self.uri or self.collection:
            raise ValueError(
                f"KB {self.name!r}: `uri`/`collection` are for `index: milvus`, but `index` is {self.index!r}; "
                "set `index: milvus` or drop them"
            )

    @property
    def fix_command(self) -> str:
        """The command that rebuilds this KB's index."""
        return FIX_INDEX.format(file=self.source_file or "<your KB yaml>")


KB_KEYS = tuple(f.name for f in fields(KBConfig) if f.name != "source_file")


def load_kb_configs(path: str | os.PathLike) -> list[KBConfig]:
    """Read `knowledge_bases: [...]` from a YAML file into validated `KBConfig`s.

    Args:
        path: YAML file.

    Returns:
        The configs, in file order.

    Raises:
        FileNotFoundError: the YAML file or a KB's corpus is missing.
        ValueError: malformed YAML, an unknown key or kind, a duplicate name or an invalid value.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"KB config file {str(path)!r} does not exist")
    data = load_yaml(path) or {}
    if not isinstance(data, dict) or not isinstance(data.get("knowledge_bases"), list):
        raise ValueError(f"{path}: expected a top-level `knowledge_bases:` list of KB mappings")
    unknown_top = set(data) - {"knowledge_bases"}
    if unknown_top:
        raise ValueError(f"{path}: unknown top-level key(s) {sorted(unknown_top)}; only `knowledge_bases` is read")
    base = path.resolve().parent
    configs: list[KBConfig] = []
    for i, entry in enumerate(data["knowledge_bases"]):
        where = f"{path}: knowledge_bases[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected a mapping of KB settings, got {type(entry).__name__}")
        where += f" ({entry.get('name', '?')})"
        unknown = sorted(set(entry) - set(KB_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; valid keys: {', '.join(KB_KEYS)}")
        missing = [k for k in ("name", "kind", "corpus") if k not in entry]
        if missing:
            raise ValueError(f"{where}: missing required key(s) {missing}")
        entry = dict(entry)
        entry["corpus"] = resolve_path(entry["corpus"], base)
        if entry.get("index_dir"):
            entry["index_dir"] = resolve_path(entry["index_dir"], base)
        if isinstance(entry.get("uri"), str) and entry["uri"] and "://" not in entry["uri"]:
            entry["uri"] = str(resolve_path(entry["uri"], base))  # a Milvus Lite file, relative like `corpus`
        if isinstance(entry.get("options"), dict):  # option keys ending in `_file` are paths, like `corpus`
            entry["options"] = {
                k: str(resolve_path(v, base)) if k.endswith("_file") and isinstance(v, str) else v
                for k, v in entry["options"].items()
            }
        try:
            cfg = KBConfig(**entry, source_file=str(path))
        except (ValueError, FileNotFoundError) as e:
            raise type(e)(f"{where}: {e}") from e
        if any(c.name == cfg.name for c in configs):
            raise ValueError(f"{where}: duplicate KB `name` {cfg.name!r}; every KB needs a unique name")
        if any(c.display_name.lower() == cfg.display_name.lower() for c in configs):
            raise ValueError(
                f"{where}: duplicate `display_name` {cfg.display_name!r} (compared case-insensitively); the policy "
                "names KBs by display name, so each KB needs its own"
            )
        configs.append(cfg)
    return configs


def select_kbs(configs: list[KBConfig], names: list[str] | None, kb_file: str | os.PathLike) -> list[KBConfig]:
    """The configs whose `name` is in `names`, in file order (all of them when `names` is empty).

    Raises:
        ValueError: a name that `kb_file` does not declare; the message lists the declared ones.
    """
    if not names:
        return configs
    unknown = sorted(set(names) - {c.name for c in configs})
    if unknown:
        raise ValueError(f"unknown KB name(s) {unknown}; {kb_file} declares {[c.name for c in configs]}")
    return [c for c in configs if c.name in names]
