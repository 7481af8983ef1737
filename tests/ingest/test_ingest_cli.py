"""`kbrouter ingest` end to end on a copy of real shared documents: summary, skips by reason, the KB YAML, incremental
re-runs (only a changed file is re-parsed, a deleted file's records go), settings changes, bad paths; then the real
KBs built from what it wrote, searched, with provenance in the evidence lines."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from ingest.cli import main
from ingest.job import PARSED_DIR, file_key

SUBSET = (
    "fbi_nics_background_checks_2015-11.pdf",
    "faa_amt_handbook_p7-45.pdf",
    "docling_word_sample.docx",
    "fdic_failed_bank_list.html",
    "encrypted_pandas_text_analysis_graph.pdf",
    "qa.jsonl",
)


@pytest.fixture
def folder(docs, tmp_path) -> Path:
    src = tmp_path / "in"
    src.mkdir()
    for name in SUBSET:
        shutil.copyfile(docs / name, src / name)
    (src / "empty.pdf").write_bytes(b"")
    with (src / "huge.pdf").open("wb") as f:  # a sparse 2 GiB file: over the size limit, never read
        f.truncate(2 * 2**30)
    return src


def _run(folder: Path, tmp_path: Path, *extra: str) -> dict:
    rc = main([str(folder), "--name", "t", "--corpus-dir", str(tmp_path / "c"), "--out", str(tmp_path / "t.yaml"),
               "--quiet", *extra])  # fmt: skip
    assert rc == 0
    return json.loads((tmp_path / "c" / "summary.json").read_text())


def _parse_mtimes(corpus: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (corpus / PARSED_DIR).glob("*.json")}


def test_first_run_summary_and_kb_yaml(folder, tmp_path):
    from retrievers.config import load_kb_configs

    s = _run(folder, tmp_path)
    assert s["files"] == 8 and s["parsed"] == 4 and s["skipped"] == 4
    assert s["skips_by_reason"] == {"empty": 1, "encrypted": 1, "over size limit": 1, "unsupported type": 1}
    assert s["pages"] == 2 and s["tables"] == 3 and s["figures"] == 3  # NICS + AMT pages; AMT 2 figures, DOCX 1
    assert s["table_records"] > 3  # long tables are cut into parts
    configs = {c.name: c for c in load_kb_configs(tmp_path / "t.yaml")}
    assert set(configs) == {"text", "document", "table", "image"}  # no videos: no clip or video KB
    assert configs["table"].display_name == "Table Retriever"
    # the KBs of a few documents' tables and figures list their titles; the text KBs' generic lines do not
    assert {n: c.describe_titles for n, c in configs.items()} == {"text": 0, "document": 0, "table": 8, "image": 8}
    assert (tmp_path / "t.yaml").read_text().splitlines()[0] == f"# Build:    kbrouter index --kb {tmp_path}/t.yaml"
    tables = [json.loads(line) for line in (tmp_path / "c" / "tables.jsonl").read_text().splitlines()]
    nics = [t for t in tables if t["id"].startswith("fbi_nics")]
    spans = [t["metadata"]["provenance"]["rows"] for t in nics]
    assert spans[0][0] == 1 and spans[-1][1] == 56  # 55 states and territories + totals, in consecutive parts
    assert all(a[1] + 1 == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert all(len(t["rows"]) == b - a + 1 <= 25 for t, (a, b) in zip(nics, spans, strict=True))
    assert all(t["header"][0] == "State / Territory" for t in nics)  # every part repeats the header
    assert all(len(" | ".join(" | ".join(r) for r in t["rows"])) < 1000 for t in nics)  # wide rows: small parts
    assert [t for t in tables if t["id"].startswith("docling")][0]["id"] == "docling_word_sample.docx#t1"  # one part
    assert nics[0]["metadata"]["source_id"] == "fbi_nics_background_checks_2015-11.pdf#p1"


def test_rerun_reparses_only_the_changed_file(folder, tmp_path):
    _run(folder, tmp_path)
    corpus = tmp_path / "c"
    before, passages = _parse_mtimes(corpus), (corpus / "passages.jsonl").read_bytes()

    s = _run(folder, tmp_path)  # nothing changed
    assert (s["parsed"], s["reused"]) == (0, 4) and _parse_mtimes(corpus) == before

    os.utime(folder / "fdic_failed_bank_list.html")  # a touch alone: same bytes, nothing to re-parse
    assert _run(folder, tmp_path)["parsed"] == 0

    html = folder / "fdic_failed_bank_list.html"
    html.write_text(html.read_text(encoding="latin-1").replace("IndyMac Bank", "IndyMac Bank FSB"), encoding="latin-1")
    s = _run(folder, tmp_path)
    assert (s["parsed"], s["reused"]) == (1, 3)
    after = _parse_mtimes(corpus)
    changed = {name for name in after if after[name] != before[name]}
    assert changed == {f"{file_key('fdic_failed_bank_list.html')}.json"}
    assert (corpus / "passages.jsonl").read_bytes() == passages  # only the table changed, the text corpus did not
    assert "IndyMac Bank FSB" in (corpus / "tables.jsonl").read_text()


def test_deleted_file_loses_its_records(folder, tmp_path):
    _run(folder, tmp_path)
    figures = tmp_path / "c" / "figures" / file_key("docling_word_sample.docx")
    assert figures.is_dir()
    (folder / "docling_word_sample.docx").unlink()
    s = _run(folder, tmp_path)
    assert s["removed"] == ["docling_word_sample.docx"]
    for corpus in ("passages", "tables", "images", "documents"):
        assert "docling_word_sample" not in (tmp_path / "c" / f"{corpus}.jsonl").read_text()
    assert not figures.exists()


def test_other_settings_need_force(folder, tmp_path):
    _run(folder, tmp_path)
    with pytest.raises(ValueError, match=r"other settings \(limits: .*--force"):
        _run(folder, tmp_path, "--max-pages", "5")
    s = _run(folder, tmp_path, "--max-pages", "5", "--force")
    assert s["parsed"] == 4  # --force re-parses everything with the new settings


def test_encrypted_pdf_with_password(folder, tmp_path):
    s = _run(folder, tmp_path, "--password", "user")
    assert s["skipped_files"]["encrypted_pandas_text_analysis_graph.pdf"].startswith("no text layer")


def test_missing_path_is_one_clear_error(tmp_path, capsys):
    from kbrouter.cli import main as kbrouter_main

    assert kbrouter_main(["ingest", str(tmp_path / "nope"), "--name", "x", "--corpus-dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "no such file or folder" in err and "nope" in err and "Traceback" not in err
    assert not (tmp_path / "c").exists()


def test_refuses_to_overwrite_a_hand_written_yaml(folder, tmp_path):
    (tmp_path / "t.yaml").write_text("knowledge_bases: []\n")
    with pytest.raises(ValueError, match="not written by kbrouter ingest"):
        _run(folder, tmp_path)


def test_nothing_usable_exits_1(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "notes.xyz").write_text("?")
    assert main([str(tmp_path / "in"), "--name", "t", "--corpus-dir", str(tmp_path / "c"), "--quiet",
                 "--out", str(tmp_path / "t.yaml")]) == 1  # fmt: skip
    assert not (tmp_path / "t.yaml").exists()


def test_built_kbs_answer_with_provenance(docs, tmp_path):
    """The written YAML builds real KBs (MiniLM, FAISS, BM25, tiny CLIP) whose hits render with their source."""
    from agent.kbs import knowledge_bases
    from agent.protocol.prompts import render_hits
    from retrievers.config import load_kb_configs
    from retrievers.kb import build_kb, load_kb

    src = tmp_path / "in"
    src.mkdir()
    for name in SUBSET[:3]:
        shutil.copyfile(docs / name, src / name)
    _run(src, tmp_path)
    configs = {c.name: c for c in load_kb_configs(tmp_path / "t.yaml")}
    for name in ("table", "image"):
        build_kb(configs[name], progress=False)
    tables = load_kb(configs["table"])
    ((hit, *_),) = tables.search(["NICS firearm background checks Kentucky permit"], 3)
    assert hit.doc.id.startswith("fbi_nics_background_checks_2015-11.pdf#t1.")
    assert "| Kentucky | 264,140 |" in hit.doc.text  # the part holding the row asked about ranks first
    first, last = hit.doc.metadata["provenance"]["rows"]
    line = render_hits([hit]).splitlines()[-1]
    assert line.endswith(f"[source: fbi_nics_background_checks_2015-11.pdf p. 1, table 1, rows {first}–{last}]")
    images = load_kb(configs["image"])
    ((fig, *_),) = images.search(["stainless steel self-locking nut"], 3)
    assert fig.doc.text == "Figure 7-27. Stainless steel self-locking nut."
    assert render_hits([fig]).endswith("[source: faa_amt_handbook_p7-45.pdf p. 1, figure 2]")
    assert Path(fig.doc.media.path).is_file()
    described = knowledge_bases([configs["table"], configs["image"]], build=False)  # issue 16: which report's tables
    assert described["Table Retriever"].description.startswith(
        "Tables from the t documents (PDF, web pages, office files), header and rows. Holds: fbi nics background "
        "checks 2015 11; "  # the NICS table's many parts make it the most frequent title
    )


def test_video_with_subtitles_becomes_clip_and_video_kbs(tmp_path):
    """The demo's real cartoon minute (PySceneDetect + PyAV + tiny CLIP): the video KB's doc carries its source."""
    from agent.protocol.prompts import render_hits
    from retrievers.config import load_kb_configs
    from retrievers.kb import build_kb, load_kb

    videos = Path(__file__).resolve().parents[2] / "data" / "demo" / "videos"
    s = _run(videos, tmp_path)
    assert s["videos"] == 1 and s["passages"] == 0
    configs = {c.name: c for c in load_kb_configs(tmp_path / "t.yaml")}
    assert set(configs) == {"clip", "video"}
    (line,) = (tmp_path / "c" / "videos.jsonl").read_text().splitlines()
    row = json.loads(line)
    assert (tmp_path / "c" / row["subtitles"]).resolve() == (videos / "popeye_sinbad_p1.eng.srt").resolve()
    build_kb(configs["video"], progress=False)
    ((hit,),) = load_kb(configs["video"]).search(["Popeye sailor"], 1)
    assert hit.doc.metadata["provenance"] == {"file": "popeye_sinbad_p1.mkv"}
    assert render_hits([hit]).endswith("[source: popeye_sinbad_p1.mkv]")


def test_a_new_parser_version_reparses_everything(folder, tmp_path):
    _run(folder, tmp_path)
    state_file = tmp_path / "c" / "ingest.json"
    state = json.loads(state_file.read_text())
    state["parser_version"] -= 1  # as left by an older kbrouter
    state_file.write_text(json.dumps(state))
    assert _run(folder, tmp_path)["parsed"] == 4
    assert _run(folder, tmp_path)["parsed"] == 0
