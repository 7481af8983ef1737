"""The `kbrouter index` entry point (`retrievers.build.main`)."""

from __future__ import annotations

import pytest

from retrievers.build import main


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "--force" in capsys.readouterr().out


def test_build_then_reuse(tmp_path, capsys):
    (tmp_path / "c.jsonl").write_text('{"id": "a", "text": "red apples"}\n{"id": "b", "text": "green pears"}\n')
    kb_yaml = tmp_path / "kb.yaml"
    kb_yaml.write_text(
        "knowledge_bases:\n"
        "  - {name: fruit, kind: text, corpus: c.jsonl, search: bm25, index_dir: idx}\n"
        "  - {name: other, display_name: Other, kind: text, corpus: c.jsonl, search: bm25, index_dir: idx2}\n"
    )
    assert main(["--kb", str(kb_yaml), "--only", "fruit", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "fruit" in out and "built" in out and "other" not in out
    assert not (tmp_path / "idx2").exists()
    assert main(["--kb", str(kb_yaml), "--only", "fruit", "--quiet"]) == 0
    assert "reused (up to date)" in capsys.readouterr().out
    assert main(["--kb", str(kb_yaml), "--only", "fruit", "--force", "--quiet"]) == 0
    assert "built" in capsys.readouterr().out


def test_unknown_only_name(tmp_path, capsys):
    (tmp_path / "c.jsonl").write_text('{"id": "a", "text": "x"}\n')
    (tmp_path / "kb.yaml").write_text("knowledge_bases:\n  - {name: fruit, kind: text, corpus: c.jsonl}\n")
    with pytest.raises(SystemExit):
        main(["--kb", str(tmp_path / "kb.yaml"), "--only", "veg"])
    assert "unknown KB name(s) ['veg']" in capsys.readouterr().err


def test_ctrl_c_says_how_many_indexes_are_ready(tmp_path, monkeypatch):
    import retrievers.build

    (tmp_path / "c.jsonl").write_text('{"id": "a", "text": "red apples"}\n')
    kb_yaml = tmp_path / "kb.yaml"
    kb_yaml.write_text(
        "knowledge_bases:\n"
        "  - {name: fruit, kind: text, corpus: c.jsonl, search: bm25, index_dir: idx}\n"
        "  - {name: other, display_name: Other, kind: text, corpus: c.jsonl, search: bm25, index_dir: idx2}\n"
    )
    real = retrievers.build.build_kb_status

    def interrupted(cfg, **kw):
        if cfg.name == "other":
            raise KeyboardInterrupt
        return real(cfg, **kw)

    monkeypatch.setattr(retrievers.build, "build_kb_status", interrupted)
    with pytest.raises(KeyboardInterrupt, match=r"^1 of 2 KB indexes ready; other's unfinished build is never used"):
        main(["--kb", str(kb_yaml), "--quiet"])
