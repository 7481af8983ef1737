"""Clip KB (videos cut into scenes) and Video KB (whole videos): averaged CLIP frame embeddings fused with transcripts.

Corpus: a folder of videos (`.mp4 .mkv .webm .avi .mov .m4v`; subtitles `<stem>[.<lang>].srt|.vtt` next to them or
in a sibling `subtitles/` folder), or a JSONL file, one video per line::

    {"id": "popeye_p1", "video": "videos/popeye_sinbad_p1.mkv", "subtitles": "subtitles/popeye_sinbad_p1.eng.srt",
     "title": "Popeye meets Sinbad (part 1)", "description": "optional text indexed with the transcript"}

(an optional `metadata` object is kept on the video's docs; a `provenance` in it gets each clip's time span).

Clips: PySceneDetect's `ContentDetector` runs on frames decoded by PyAV and scaled to `detect_width` inside FFmpeg
(`skip_nonref` also skips decoding non-reference frames, ~2x faster on HEVC, cuts then land on reference frames).
Scenes shorter than `min_clip_s` are merged into their neighbour, scenes longer than `max_clip_s` are split into equal
parts, so no clip exceeds `max_clip_s` (default 180 s: clips average <= 3 min). A video without any detected cut is
one clip (split when long): a documented fallback, not an error. A clip's text is its transcript (the subtitle cues
overlapping its span); a clip without speech is searched by its frames alone.

Bad input never stops the build: an unreadable/truncated/empty video is skipped, a missing or unparsable subtitle
file means "indexed without transcript", a zero-length clip is dropped; each case is listed in the manifest
(`skipped`, `notes`) and in `skipped.jsonl`. The build fails only when no video at all is usable.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retrievers.clip_encoder import load_clip
from retrievers.config import KBConfig
from retrievers.encoders import normalize
from retrievers.jsonl import iter_jsonl_objects
from retrievers.media import (
    Cue,
    MediaError,
    cues_text,
    cut_cues,
    find_subtitles,
    frames_at,
    iter_frames,
    parse_subtitles,
    probe_video,
    uniform_times,
)
from retrievers.media_options import ImageOptions, check_flat, parse_options
from retrievers.media_retriever import MediaRetriever, load_media_kb, write_media_index
from retrievers.types import Doc, Media

logger = logging.getLogger(__name__)

VIDEO_SUFFIXES = (".mp4", ".mkv", ".webm", ".avi", ".mov", ".m4v")


@dataclass(frozen=True)
class ClipOptions(ImageOptions):
    """Options of a clip KB (`KBConfig.options`): the image KB's CLIP options and these."""

    threshold: float = 27.0  # ContentDetector threshold (PySceneDetect default)
    min_scene_frames: int = 15  # ContentDetector min_scene_len, in frames
    detect_width: int = 256  # detection resolution (PySceneDetect's own default downscale target)
    skip_nonref: bool = False
    min_clip_s: float = 2.0
    max_clip_s: float = 180.0
    frames_per_clip: int = 8
    frame_side: int = 336
    subtitles: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.min_clip_s * 2 <= self.max_clip_s:
            raise ValueError(
                f"`options.max_clip_s` ({self.max_clip_s}) must be >= 2 * `min_clip_s` ({self.min_clip_s}) > 0, "
                "so a long scene can be split without creating clips below the minimum; e.g. min 2, max 180"
            )
        if self.frames_per_clip < 1 or self.detect_width < 16:
            raise ValueError("`options.frames_per_clip` must be >= 1 and `options.detect_width` >= 16")


@dataclass(frozen=True)
class VideoOptions(ImageOptions):
    """Options of a video KB (`KBConfig.options`): the image KB's CLIP options and these."""

    frames_per_video: int = 32
    frame_side: int = 336
    subtitles: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.frames_per_video < 1:
            raise ValueError(f"`options.frames_per_video` must be >= 1, got {self.frames_per_video}")


# -- scene detection ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SceneCuts:
    """Cuts found in one video: frame numbers and seconds, and the decoded span."""

    frames: list[int]
    seconds: list[float]
    duration: float
    fps: float
    decoded_frames: int


def detect_cuts(
    path: str | Path, threshold: float = 27.0, min_scene_frames: int = 15, width: int = 256, skip_nonref: bool = False
) -> SceneCuts:
    """Run PySceneDetect's ContentDetector over PyAV-decoded frames scaled to `width`.

    Raises:
        MediaError: the video cannot be opened or decoded.
    """
    try:
        from scenedetect import ContentDetector, FrameTimecode
    except ImportError as e:
        raise ImportError("clip KBs need PySceneDetect: pip install 'kbrouter[video]' (scenedetect)") from e
    info = probe_video(path)
    detector = ContentDetector(threshold=threshold, min_scene_len=min_scene_frames)
    cuts: list[int] = []
    last_t, n, frame_num = 0.0, 0, 0
    for index, t, frame in iter_frames(path, width=width, skip_nonref=skip_nonref):
        # Skipped non-reference frames leave gaps: number frames by timestamp so cuts stay in video frames.
        frame_num = round(t * info.fps) if skip_nonref else index
        cuts += [c.frame_num for c in detector.process_frame(FrameTimecode(frame_num, info.fps), frame)]
        last_t, n = t, n + 1
    cuts += [c.frame_num for c in detector.post_process(FrameTimecode(frame_num, info.fps))]
    cuts = sorted(set(c for c in cuts if c > 0))
    duration = last_t + 1.0 / info.fps  # the decoded end beats the header, which can overstate it
    return SceneCuts(cuts, [c / info.fps for c in cuts], duration, info.fps, n)


def scenes_to_clips(cut_seconds: list[float], duration: float, min_clip_s: float, max_clip_s: float):
    """Turn cuts into `(start, end)` clips: merge scenes under `min_clip_s`, split scenes over `max_clip_s`.

    No cut gives one clip over the whole video (split when longer than `max_clip_s`).

    Example:
        >>> scenes_to_clips([1.0, 10.0], 20.0, min_clip_s=2.0, max_clip_s=8.0)
        [(0.0, 5.0), (5.0, 10.0), (10.0, 15.0), (15.0, 20.0)]
    """
    bounds = [0.0, *(c for c in cut_seconds if 0.0 < c < duration), duration]
    scenes = [[a, b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    merged: list[list[float]] = []
    for s in scenes:
        if merged and (s[1] - s[0] < min_clip_s or merged[-1][1] - merged[-1][0] < min_clip_s):
            merged[-1][1] = s[1]  # a short scene joins the previous one (or absorbs a short first scene)
        else:
            merged.append(list(s))
    clips = []
    for a, b in merged:
        parts = max(1, int(np.ceil((b - a) / max_clip_s - 1e-9)))
        step = (b - a) / parts
        clips += [(round(a + i * step, 3), round(a + (i + 1) * step, 3)) for i in range(parts)]
    return [(a, b) for a, b in clips if b > a]


# -- corpus -------------------------------------------------------------------------------------------------------


def read_video_corpus(corpus: Path) -> list[dict]:
    """Rows `{id, video, subtitles (path or None), title, description}` from a folder or a JSONL file."""
    corpus = Path(corpus).resolve()
    rows = []
    if corpus.is_dir():
        for p in sorted(corpus.rglob("*")):
            if p.suffix.lower() in VIDEO_SUFFIXES and p.is_file():
                subs = find_subtitles(p, [p.parent / "subtitles", p.parent.parent / "subtitles"])
                rows.append(
                    {
                        "id": p.stem,
                        "video": str(p),
                        "subtitles": str(subs) if subs else None,
                        "title": p.stem.replace("_", " "),
                        "description": "",
                        "metadata": {},
                    }
                )
        if not rows:
            raise ValueError(f"no video files ({', '.join(VIDEO_SUFFIXES)}) under {str(corpus)!r}")
        return rows
    for n, row in iter_jsonl_objects(corpus):
        if "video" not in row:
            raise ValueError(f"{corpus}:{n}: each line needs `video` (a path relative to the JSONL file)")
        video = (corpus.parent / row["video"]).resolve()
        subs = row.get("subtitles")
        rows.append(
            {
                "id": str(row.get("id", video.stem)),
                "video": str(video),
                "subtitles": str((corpus.parent / subs).resolve()) if subs else None,
                "title": row.get("title", video.stem.replace("_", " ")),
                "description": row.get("description", ""),
                "metadata": dict(row.get("metadata") or {}),  # e.g. provenance written by `kbrouter ingest`
            }
        )
    return rows


def _cues(row: dict, enabled: bool, notes: list[dict]) -> list[Cue]:
    if not enabled or not row["subtitles"]:
        return []
    try:
        return parse_subtitles(row["subtitles"])
    except (FileNotFoundError, MediaError) as e:
        notes.append(
            {"source": row["subtitles"], "id": row["id"], "reason": str(e), "action": "indexed without transcript"}
        )
        return []


def _with_span(metadata: dict, start: float, end: float) -> dict:
    """A clip's copy of its video's metadata, its provenance (if any) narrowed to the clip's time span."""
    prov = metadata.get("provenance")
    return {**metadata, "provenance": {**prov, "start": start, "end": end}} if isinstance(prov, dict) else metadata


def _mean_vector(clip, frames: list) -> np.ndarray:
    return normalize(clip.encode_images(frames).mean(axis=0, keepdims=True))[0]


# -- clip KB ------------------------------------------------------------------------------------------------------


def build_clip_kb(cfg: KBConfig, out_dir: Path, progress: bool = True) -> dict:
    """Cut every video into clips and index each clip's averaged frame embedding and transcript."""
    check_flat(cfg)
    opts = parse_options(ClipOptions, cfg)
    clip = load_clip(opts.clip_model, opts.clip_pretrained, cfg.device, opts.clip_batch_size)
    docs, vectors, texts, skipped, notes = [], [], [], [], []
    for row in read_video_corpus(Path(cfg.corpus)):
        try:
            cuts = detect_cuts(
                row["video"], opts.threshold, opts.min_scene_frames, opts.detect_width, opts.skip_nonref
            )
            spans = scenes_to_clips(cuts.seconds, cuts.duration, opts.min_clip_s, opts.max_clip_s)
            if not spans:
                raise MediaError(f"video {row['video']!r} has zero length")
            times = [t for a, b in spans for t in uniform_times(a, b, opts.frames_per_clip)]
            frames = frames_at(row["video"], times, max_side=opts.frame_side, skip_nonref=opts.skip_nonref)
        except MediaError as e:
            skipped.append({"source": row["video"], "id": row["id"], "reason": str(e), "action": "skipped"})
            continue
        if not cuts.frames:
            notes.append(
                {
                    "source": row["video"],
                    "id": row["id"],
                    "action": f"{len(spans)} clip(s)",
                    "reason": "no scene change detected; indexed as one scene",
                }
            )
        cues = _cues(row, opts.subtitles, notes)
        for i, (a, b) in enumerate(spans):
            transcript = cues_text(cut_cues(cues, a, b))
            body = " ".join(x for x in (row["description"], transcript) if x)
            docs.append(
                Doc(
                    id=f"{row['id']}#{i:03d}",
                    text=body or "(no transcript)",
                    title=row["title"],
                    kb=cfg.name,
                    modality="video",
                    media=Media(row["video"], a, b),
                    metadata={
                        **_with_span(row["metadata"], a, b),
                        "video_id": row["id"],
                        "clip": i,
                        "transcript": bool(transcript),
                    },
                )
            )
            texts.append([body] if body else [])
            vectors.append(_mean_vector(clip, frames[i * opts.frames_per_clip : (i + 1) * opts.frames_per_clip]))
        logger.info("KB %s: %s -> %d clip(s), %d cut(s)", cfg.name, row["id"], len(spans), len(cuts.frames))
    visual = np.stack(vectors) if vectors else np.zeros((0, clip.dim), dtype=np.float32)
    info = write_media_index(cfg, out_dir, docs, visual, texts, skipped + notes, clip.dim)
    info.update(skipped_count=len(skipped), notes_count=len(notes))
    return info


def load_clip_kb(cfg: KBConfig) -> MediaRetriever:
    """Load a built clip KB."""
    return load_media_kb(cfg, ClipOptions)


# -- video KB -----------------------------------------------------------------------------------------------------


def build_video_kb(cfg: KBConfig, out_dir: Path, progress: bool = True) -> dict:
    """Index whole videos: `frames_per_video` uniformly sampled frames averaged, fused with the full transcript."""
    check_flat(cfg)
    opts = parse_options(VideoOptions, cfg)
    clip = load_clip(opts.clip_model, opts.clip_pretrained, cfg.device, opts.clip_batch_size)
    docs, vectors, texts, skipped, notes = [], [], [], [], []
    for row in read_video_corpus(Path(cfg.corpus)):
        try:
            info = probe_video(row["video"])
            frames = frames_at(
                row["video"], uniform_times(0.0, info.duration, opts.frames_per_video), max_side=opts.frame_side
            )
        except MediaError as e:
            skipped.append({"source": row["video"], "id": row["id"], "reason": str(e), "action": "skipped"})
            continue
        transcript = cues_text(_cues(row, opts.subtitles, notes))
        body = " ".join(x for x in (row["description"], transcript) if x)
        docs.append(
            Doc(
                id=row["id"],
                text=body or "(no transcript)",
                title=row["title"],
                kb=cfg.name,
                modality="video",
                media=Media(row["video"]),
                metadata={**row["metadata"], "duration": round(info.duration, 3), "transcript": bool(transcript)},
            )
        )
        texts.append([body] if body else [])
        vectors.append(_mean_vector(clip, frames))
    visual = np.stack(vectors) if vectors else np.zeros((0, clip.dim), dtype=np.float32)
    out = write_media_index(cfg, out_dir, docs, visual, texts, skipped + notes, clip.dim)
    out.update(skipped_count=len(skipped), notes_count=len(notes))
    return out


def load_video_kb(cfg: KBConfig) -> MediaRetriever:
    """Load a built video KB."""
    return load_media_kb(cfg, VideoOptions)
