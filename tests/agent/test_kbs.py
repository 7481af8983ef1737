"""`agent.kbs`: the one KB loader (files pooled, names checked, built, loaded, described)."""

from __future__ import annotations

import json
import logging
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


def _titled_kb(tmp_path: Path, titles: list[str], **kb) -> Path:
    """A one-KB YAML over a real BM25 text KB whose docs carry `titles`, in this order."""
    corpus = tmp_path / "titled.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "contents": f"passage {i} about things", "title": t}) + "\n"
                              for i, t in enumerate(titles)))  # fmt: skip
    entry = {"name": "clips", "display_name": "Clip KB", "kind": "text", "search": "bm25", "corpus": str(corpus),
             "index_dir": str(tmp_path / "idx-clips"), **kb}  # fmt: skip
    path = tmp_path / "titled.yaml"
    path.write_text(yaml.safe_dump({"knowledge_bases": [entry]}))
    return path


def _description(path: Path) -> str:
    return load_knowledge_bases(path)["Clip KB"].description


TITLES = ["Beta", "Alpha", "Gamma  ray", "Alpha", "", "Delta", "Gamma\tray", "Alpha", "Delta", "Epsilon"]


@pytest.mark.parametrize(
    ("n", "description", "expected"),
    [
        # Alpha 3; Gamma ray 2 (its two spellings one title) ties Delta 2 and appeared first; Beta 1 before Epsilon 1
        (9, "", f"{DESCRIPTIONS[('text', 'paragraph')]}. Holds: Alpha; Gamma ray; Delta; Beta; Epsilon."),
        (2, "My clips.", "My clips. Holds: Alpha; Gamma ray."),  # N caps the count; "." ends it already
        (1, "My clips", "My clips. Holds: Alpha."),  # a description without a full stop gets one
    ],
)
def test_describe_titles_lists_the_most_frequent_titles_first(tmp_path, n, description, expected):
    assert _description(_titled_kb(tmp_path, TITLES, describe_titles=n, description=description)) == expected


def test_describe_titles_zero_or_no_titles_leaves_the_description_unchanged(tmp_path):
    assert _description(_titled_kb(tmp_path, TITLES, description="My clips")) == "My clips"  # 0 is the default
    assert _description(_titled_kb(tmp_path, TITLES, describe_titles=0)) == DESCRIPTIONS[("text", "paragraph")]
    assert _description(_titled_kb(tmp_path, ["", "  "], describe_titles=5, description="My clips")) == "My clips"


def test_describe_titles_adds_at_most_400_characters_of_cut_titles(tmp_path):
    long = "A very long title " * 8  # 144 characters: cut at a word boundary to at most 80, marked as cut
    titles = [long, long] + [f"Report number {i:02d} " + "x" * 50 for i in range(30)]  # 67 characters each
    base = "My tables."
    description = _description(_titled_kb(tmp_path, titles, describe_titles=100, description=base))
    added = description.removeprefix(base)
    shown = added.removeprefix(" Holds: ").removesuffix(".").split("; ")
    assert len(added) <= 400
    assert shown[0] == "A very long title A very long title A very long title A very long title A very…"
    assert all(len(t) <= 80 for t in shown)
    assert shown[1:] == [f"Report number {i:02d} " + "x" * 50 for i in range(len(shown) - 1)]  # first-appearance ties
    assert len(added) + len("; ") + 67 > 400  # it stopped because the next title would pass 400, not before


def test_description_with_titles_round_trips_through_the_plan_prompt(tmp_path):
    from agent.protocol.prompts import plan_kb_list, plan_messages, with_kb_list

    titles = ["FDIC: Failed Bank List", "NICS\nfirearm checks\r\n2015", "Popeye\u2028Sinbad", "Popeye\u2028Sinbad"]
    kbs = load_knowledge_bases(_titled_kb(tmp_path, titles, describe_titles=8, description="Tables: a report's."))
    assert kbs["Clip KB"].description == (
        "Tables: a report's. Holds: Popeye Sinbad; FDIC: Failed Bank List; NICS firearm checks 2015."
    )  # line breaks inside titles become spaces
    menu = [("Text KB", "Wikipedia paragraphs."), *((kb.display_name, kb.description) for kb in kbs.values())]
    messages = plan_messages("Which bank failed?", [], menu)
    assert plan_kb_list(messages) == menu
    assert plan_kb_list(with_kb_list(messages, menu[::-1])) == menu[::-1]


def test_describe_titles_skips_a_kb_whose_docs_are_not_held_here(tmp_path, caplog):
    path = _titled_kb(tmp_path, TITLES, describe_titles=5, description="Served clips.",
                      options={"remote": "http://127.0.0.1:9"})  # fmt: skip
    with caplog.at_level(logging.DEBUG, logger="agent.kbs"):
        kbs = load_knowledge_bases(path, build=False)  # a remote KB: nothing is built or searched here
    assert kbs["Clip KB"].description == "Served clips."
    assert "KB clips: describe_titles skipped, its docs are not held locally" in caplog.text


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (-1, "got -1"),  # negative
        ("6", "got '6'"),  # quoted in the YAML
        (True, "got True"),  # a bool is an int to Python
        (2.5, "got 2.5"),  # not whole
    ],
)
def test_a_bad_describe_titles_fails_at_config_load_naming_the_kb_and_file(tmp_path, value, why):
    path = _titled_kb(tmp_path, TITLES, describe_titles=value)
    with pytest.raises(ValueError, match=rf"titled\.yaml: knowledge_bases\[0\] \(clips\): .*`describe_titles` must be "
                                         rf"an integer >= 0.*{why}; set e\.g\. `describe_titles: 6`"):  # fmt: skip
        kb_configs(path)


def test_a_description_on_two_lines_fails_at_config_load(tmp_path):
    path = _titled_kb(tmp_path, TITLES, description="My clips\n")  # what a YAML `>` block gives
    with pytest.raises(ValueError, match=r"titled\.yaml: .*\(clips\): .*`description` must be one line.*`>-`"):
        kb_configs(path)
