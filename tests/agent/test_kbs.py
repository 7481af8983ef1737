"""`agent.kbs`: the one KB loader (files pooled, names checked, built, loaded, described)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.kbs import DESCRIPTIONS, kb_configs, load_knowledge_bases


def _kb_file(path: Path, *kbs: dict) -> Path:
    corpus = path.parent / f"{path.stem}.jsonl"
    corpus.write_text('{"id": "p1", "contents": "Paris is the capital of France"}\n'
                      '{"id": "p2", "contents": "Berlin is the capital of Germany"}\n')  # fmt: skip
    entries = [{"kind": "text", "search": "bm25", "corpus": str(corpus),
                "index_dir": str(path.parent / f"idx-{kb['name']}"), **kb} for kb in kbs]  # fmt: skip
    path.write_text(yaml.safe_dump({"knowledge_bases": entries}))
    return path


def test_two_files_are_pooled_in_order_and_only_keeps_the_named_kbs(tmp_path):
    a = _kb_file(tmp_path / "a.yaml", {"name": "wiki", "display_name": "Text KB"})
    b = _kb_file(tmp_path / "b.yaml", {"name": "notes", "display_name": "Notes KB"}, {"name": "more"})
    assert [c.name for c in kb_configs([a, b])] == ["wiki", "notes", "more"]
    assert [c.name for c in kb_configs([a, b], only=["more", "wiki"])] == ["wiki", "more"]  # file order, not `only`'s
    with pytest.raises(ValueError, match=r"unknown KB name\(s\) \['nope'\].*a.yaml, .*b.yaml declares"):
        kb_configs([a, b], only=["nope"])


@pytest.mark.parametrize(
    ("second", "key"),
    [
        ({"name": "wiki", "display_name": "Other"}, "names"),  # the id in hits repeats
        ({"name": "w2", "display_name": "text kb"}, "display_names"),  # the policy could not tell them apart
    ],
)
def test_a_kb_two_files_share_is_rejected_naming_the_files(tmp_path, second, key):
    a = _kb_file(tmp_path / "a.yaml", {"name": "wiki", "display_name": "Text KB"})
    b = _kb_file(tmp_path / "b.yaml", second)
    with pytest.raises(ValueError, match=rf"KB {key} repeat across .*a.yaml.*b.yaml"):
        kb_configs([a, b])
    if key == "display_names":  # selecting one of them resolves it
        assert [c.name for c in kb_configs([a, b], only=["w2"])] == ["w2"]


def test_no_file_is_an_error_not_an_empty_kb_set(tmp_path):
    with pytest.raises(ValueError, match="no KB config file given"):
        kb_configs([])
    with pytest.raises(ValueError, match="no KB config file given"):
        kb_configs("")


def test_load_builds_then_searches_and_describes_by_kind(tmp_path):
    path = _kb_file(tmp_path / "kb.yaml", {"name": "wiki", "display_name": "Text KB", "k": 2},
                    {"name": "notes", "description": "my own notes"})  # fmt: skip
    with pytest.raises(FileNotFoundError, match="no built index"):  # build=False never builds
        load_knowledge_bases(path, build=False)
    kbs = load_knowledge_bases(path)
    assert list(kbs) == ["Text KB", "notes"]  # keyed by display name, which defaults to the name
    wiki = kbs["Text KB"]
    assert (wiki.name, wiki.k, wiki.description) == ("wiki", 2, DESCRIPTIONS[("text", "paragraph")])
    assert wiki.retriever.search(["capital of Germany"], 1)[0][0].doc.id == "p2"
    assert kbs["notes"].description == "my own notes"
    assert load_knowledge_bases(path, build=False).keys() == kbs.keys()  # built once, loadable without building
