"""Derived corpora for the shared image and video sets, so they can be searched by the existing text KB kind.

Until image/clip KB kinds land, the COCO photographs are searched through their five human captions and object
list (one document per image, id `coco-<id>`, the same id the COCO questions carry), and the shared videos through
clip documents (one per annotated shot: the shot note plus the subtitles spoken during it; id
`<video_id>@<start>-<end>`), so retrieval recall@k against the questions' gold image / time span is measurable.

Run (writes `outputs/eval_corpora/*.jsonl`; `kbrouter eval` does this itself before loading KBs):

    python -m eval.corpora --shared ../shared/data --out outputs/eval_corpora
"""

from __future__ import annotations

import argparse
import logging
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from retrievers.jsonl import dumps_line, iter_jsonl_objects, write_jsonl_atomic

logger = logging.getLogger(__name__)

_SRT_TIME = re.compile(r"(\d+):(\d+):(\d+)[,.](\d+)\s*-->\s*(\d+):(\d+):(\d+)[,.](\d+)")


def coco_caption_rows(shared: Path) -> list[dict]:
    """One document per COCO image: its captions and object counts; `id` is the image id (`coco-<id>`)."""
    src = shared / "image" / "coco" / "images.jsonl"
    rows = []
    for _, img in iter_jsonl_objects(src):
        counts = Counter(o["category"] for o in img.get("objects", []) if not o.get("iscrowd"))
        objects = ", ".join(f"{n} {c}" for c, n in sorted(counts.items()))
        text = " ".join(img["captions"]) + (f" Objects: {objects}." if objects else "")
        rows.append(
            {
                "id": img["image_id"],
                "title": f"photo {img['image_id']}",
                "text": text,
                "image": str(shared / "image" / "coco" / img["file"]),
            }
        )
    return rows


def parse_srt(path: Path) -> list[tuple[float, float, str]]:
    """`(start_s, end_s, text)` cues of an SRT file, tags such as `<i>` removed."""
    cues = []
    for block in re.split(r"\n\s*\n", path.read_text(encoding="utf-8-sig")):
        lines = [ln.strip() for ln in block.strip().splitlines()]
        for i, ln in enumerate(lines):
            m = _SRT_TIME.search(ln)
            if m:
                g = [int(x) for x in m.groups()]
                start = g[0] * 3600 + g[1] * 60 + g[2] + g[3] / 1000
                end = g[4] * 3600 + g[5] * 60 + g[6] + g[7] / 1000
                text = re.sub(r"<[^>]+>", "", " ".join(lines[i + 1 :])).strip()
                if text:
                    cues.append((start, end, text))
                break
    return cues


def video_clip_rows(shared: Path) -> list[dict]:
    """One document per annotated shot: the shot note and the subtitles overlapping it."""
    root = shared / "video"
    rows = []
    for _, video in iter_jsonl_objects(root / "videos.jsonl"):
        cues = parse_srt(root / video["subtitle_file"]) if video.get("subtitle_file") else []
        shots = video.get("shots_manual") or [[0.0, video["duration_s"], video.get("summary", "")]]
        for start, end, note in shots:
            said = " ".join(t for s, e, t in cues if s < end and e > start)
            text = note + (f" Dialogue: {said}" if said else "")
            rows.append(
                {
                    "id": f"{video['video_id']}@{start:g}-{end:g}",
                    "title": video["source_title"],
                    "text": text,
                    "video_id": video["video_id"],
                    "start": start,
                    "end": end,
                    "video": str(root / video["file"]),
                }
            )
    return rows


CORPORA: dict[str, Callable[[Path], list[dict]]] = {
    "coco_captions": coco_caption_rows,
    "video_clips": video_clip_rows,
}


def prepare_corpora(names: list[str], shared: str | Path, out_dir: str | Path) -> dict[str, Path]:
    """Write the named derived corpora (see `CORPORA`) into `out_dir`; existing identical files are kept.

    Raises:
        ValueError: an unknown corpus name (the message lists the valid ones).
        FileNotFoundError: the shared data folder is missing.
    """
    unknown = sorted(set(names) - set(CORPORA))
    if unknown:
        raise ValueError(f"unknown derived corpus {unknown}; valid: {sorted(CORPORA)}")
    # resolved, so the media paths written into the corpora (and so the index fingerprints) do not depend on how the
    # shared folder was spelled (`../shared/data` from the CLI, `configs/eval/../../../shared/data` from an eval YAML)
    shared, out_dir = Path(shared).resolve(), Path(out_dir)
    if names and not shared.is_dir():
        raise FileNotFoundError(f"shared data folder {str(shared)!r} does not exist; set `shared_data` in the config")
    out = {}
    for name in names:
        path = out_dir / f"{name}.jsonl"
        rows = CORPORA[name](shared)
        new = "".join(dumps_line(r) for r in rows)
        if not path.exists() or path.read_text(encoding="utf-8") != new:  # same bytes keep the index up to date
            path.parent.mkdir(parents=True, exist_ok=True)
            write_jsonl_atomic(path, rows)
            logger.info("wrote %d documents to %s", len(rows), path)
        out[name] = path
    return out


def main(argv: list[str] | None = None) -> int:
    """Write the derived corpora; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m eval.corpora", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", default="../shared/data", help="the shared data folder")
    parser.add_argument("--out", default="outputs/eval_corpora", help="output folder")
    parser.add_argument("--only", nargs="+", default=sorted(CORPORA), help=f"corpora to write, of {sorted(CORPORA)}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    for name, path in prepare_corpora(args.only, args.shared, args.out).items():
        print(f"{name}: {path}")  # noqa: T201 (CLI output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
