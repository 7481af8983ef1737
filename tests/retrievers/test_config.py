"""KB config loading and validation: unknown keys and kinds, missing corpora, duplicates, path resolution."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from retrievers.config import KIND_DEFAULTS, KBConfig, default_cache_dir, load_kb_configs

ROOT = Path(__file__).resolve().parents[2]


def write_yaml(tmp_path: Path, body: str) -> Path:
    (tmp_path / "corpus.jsonl").write_text('{"id": "1", "text": "hello"}\n')
    path = tmp_path / "kbs.yaml"
    path.write_text(textwrap.dedent(body))
    return path


def test_defaults_and_relative_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("KBROUTER_CACHE", str(tmp_path / "cache"))
    path = write_yaml(
        tmp_path,
        """
        knowledge_bases:
          - {name: wiki, kind: text, corpus: corpus.jsonl}
          - {name: tabs, kind: table, corpus: ., display_name: Table Retriever, search: dense, index_dir: idx}
        """,
    )
    text, table = load_kb_configs(path)
    # kind defaults: paragraph + hybrid for text, table + dense as asked; display name falls back to name
    assert (text.granularity, text.search, text.display_name, text.k, text.chunk_words) == (
        "paragraph",
        "hybrid",
        "wiki",
        5,
        100,
    )
    assert (table.granularity, table.search, table.display_name) == ("table", "dense", "Table Retriever")
    # relative paths resolve against the YAML's folder, not the working directory
    assert text.corpus == tmp_path / "corpus.jsonl"
    assert table.index_dir == tmp_path / "idx"
    assert text.index_dir == tmp_path / "cache" / "indexes" / "wiki"
    assert text.source_file == str(path)


def test_default_cache_dir(monkeypatch):
    monkeypatch.delenv("KBROUTER_CACHE", raising=False)
    assert default_cache_dir() == Path.home() / ".cache" / "kbrouter"


@pytest.mark.parametrize(
    "entry, error, patterns",
    [
        # unknown key: names the file, the KB, the key and lists the valid keys
        (
            "{name: wiki, kind: text, corpus: corpus.jsonl, top_k: 5}",
            ValueError,
            ["kbs.yaml", r"knowledge_bases\[0\] \(wiki\)", "top_k", "valid keys: name, kind, corpus"],
        ),
        # unknown kind: lists the valid kinds
        ("{name: wiki, kind: bm25, corpus: corpus.jsonl}", ValueError, ["kbs.yaml", "wiki", "'bm25'", "table, text"]),
        # missing corpus: FileNotFoundError naming the KB, the key and the path
        ("{name: wiki, kind: text, corpus: nope.jsonl}", FileNotFoundError, ["kbs.yaml", "wiki", "`corpus`", "nope"]),
        # granularity that the kind does not support
        ("{name: wiki, kind: text, corpus: corpus.jsonl, granularity: table}", ValueError, ["paragraph, document"]),
        # invalid enum value lists the choices
        ("{name: wiki, kind: text, corpus: corpus.jsonl, index: annoy}", ValueError, ["`index`", "flat, hnsw, ivf"]),
        # non-positive ints are refused with the key named
        ("{name: wiki, kind: text, corpus: corpus.jsonl, k: 0}", ValueError, ["`k` must be a positive integer"]),
        # required keys
        ("{name: wiki, corpus: corpus.jsonl}", ValueError, [r"missing required key\(s\) \['kind'\]"]),
        # silently wrong before: `k: true` became 1, `mmap: 'no'` turned mmap on, `display_name: 123` crashed the agent
        ("{name: wiki, kind: text, corpus: corpus.jsonl, k: true}", ValueError, ["`k` must be a positive integer"]),
        ("{name: wiki, kind: text, corpus: corpus.jsonl, mmap: 'no'}", ValueError, ["`mmap` must be true or false"]),
        (
            "{name: wiki, kind: text, corpus: corpus.jsonl, display_name: 123}",
            ValueError,
            ["`display_name` must be a"],
        ),
        # large-index settings: an unknown refine store, zero shards, a Milvus URI without `index: milvus`
        ("{name: wiki, kind: text, corpus: corpus.jsonl, refine: pq}", ValueError, ["`refine`", "none, flat, fp16"]),
        ("{name: wiki, kind: text, corpus: corpus.jsonl, shards: 0}", ValueError, ["`shards` must be a positive"]),
        (
            "{name: wiki, kind: text, corpus: corpus.jsonl, uri: 'http://h:19530'}",
            ValueError,
            ["`uri`/`collection` are for `index: milvus`", "'flat'"],
        ),
    ],
)
def test_config_errors(tmp_path, entry, error, patterns):
    path = write_yaml(tmp_path, f"knowledge_bases:\n  - {entry}\n")
    with pytest.raises(error) as info:
        load_kb_configs(path)
    for pattern in patterns:
        assert re.search(pattern, str(info.value)), (pattern, str(info.value))


def test_duplicate_names(tmp_path):
    path = write_yaml(
        tmp_path,
        """
        knowledge_bases:
          - {name: wiki, kind: text, corpus: corpus.jsonl}
          - {name: wiki, kind: text, corpus: corpus.jsonl}
        """,
    )
    with pytest.raises(ValueError, match=r"knowledge_bases\[1\] \(wiki\): duplicate KB `name` 'wiki'"):
        load_kb_configs(path)


@pytest.mark.parametrize(
    "body, message",
    [
        ("kbs: []\n", "top-level `knowledge_bases:` list"),  # wrong top-level key
        ("knowledge_bases: []\nextra: 1\n", r"unknown top-level key\(s\) \['extra'\]"),
        ("knowledge_bases:\n  - just a string\n", "expected a mapping"),
    ],
)
def test_malformed_files(tmp_path, body, message):
    with pytest.raises(ValueError, match=message):
        load_kb_configs(write_yaml(tmp_path, body))


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path):
    path = write_yaml(tmp_path, "knowledge_bases:\n  - {name: wiki, kind: text\n")
    with pytest.raises(ValueError, match=r"kbs.yaml:3:1: YAML syntax error: .*; fix the YAML there"):
        load_kb_configs(path)


def test_a_non_utf8_file_names_the_file_and_line(tmp_path):
    path = tmp_path / "kbs.yaml"
    path.write_bytes(b"knowledge_bases:\n  - {name: caf\xe9, kind: text, corpus: corpus.jsonl}\n")
    with pytest.raises(ValueError, match=r"kbs.yaml:2: not UTF-8 text \(byte 0xe9 at offset \d+\); save the file as"):
        load_kb_configs(path)


def test_mmap_false_is_accepted(tmp_path):
    path = write_yaml(tmp_path, "knowledge_bases:\n  - {name: wiki, kind: text, corpus: corpus.jsonl, mmap: false}\n")
    assert load_kb_configs(path)[0].mmap is False


def test_missing_yaml(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        load_kb_configs(tmp_path / "missing.yaml")


def test_direct_construction_validates(tmp_path):
    with pytest.raises(ValueError, match="unknown `kind` 'audio'"):
        KBConfig(name="v", kind="audio", corpus=tmp_path)


def test_every_kind_the_config_accepts_has_a_builder_and_loader(tmp_path):
    from retrievers.kb import KB_KINDS

    # a kind added to one table only would pass validation and fail at build time, or be refused by the config
    assert sorted(KIND_DEFAULTS) == sorted(KB_KINDS)
    for kind, defaults in KIND_DEFAULTS.items():
        cfg = KBConfig(name=kind, kind=kind, corpus=tmp_path)
        assert (cfg.granularity, cfg.search) == (defaults.granularities[0], defaults.search)


def test_a_granularity_of_another_kind_is_refused(tmp_path):
    with pytest.raises(ValueError, match="`granularity` 'table' is not valid for kind 'text'; use one of paragraph"):
        KBConfig(name="t", kind="text", corpus=tmp_path, granularity="table")


@pytest.mark.parametrize("name", ["demo.yaml", "shared_text.yaml", "shared_tables.yaml"])
def test_shipped_configs_parse(name):
    path = ROOT / "configs" / "kb" / name
    try:
        configs = load_kb_configs(path)
    except FileNotFoundError as e:
        if "shared" in name:
            pytest.skip(f"shared data absent: {e}")
        raise
    assert configs and all(c.display_name for c in configs)
    if name == "demo.yaml":  # media KBs may be added beside these two
        declared = {(c.name, c.display_name, c.kind) for c in configs}
        assert {("text", "Text Retriever", "text"), ("table", "WikiTable Retriever", "table")} <= declared


def test_milvus_uri_resolves_like_corpus(tmp_path):
    # a Milvus Lite path is relative to the YAML; a server URI is kept; the default sits beside the index folder
    path = write_yaml(
        tmp_path,
        """
        knowledge_bases:
          - {name: a, kind: text, corpus: corpus.jsonl, index: milvus, uri: dbs/a.db}
          - {name: b, kind: text, corpus: corpus.jsonl, index: milvus, uri: 'http://127.0.0.1:19530', collection: bee}
          - {name: c, kind: text, corpus: corpus.jsonl, index: milvus, index_dir: idx/c}
        """,
    )
    a, b, c = load_kb_configs(path)
    assert a.uri == str(tmp_path / "dbs" / "a.db") and a.collection == "a"
    assert (b.uri, b.collection) == ("http://127.0.0.1:19530", "bee")
    assert c.uri == str(tmp_path / "idx" / "c.db")
