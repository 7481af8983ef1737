"""Image and video files: an image's caption from a sidecar file or its EXIF description; a video with its subtitles.

Image caption, first found: `photo.jpg.txt` or `photo.txt` beside it (a sidecar), the EXIF `ImageDescription`
(or `XPComment`/`UserComment`), else the file name. A video keeps its path (the clip and video KBs cut and sample
it when indexed) and its sidecar subtitles: `talk.srt`/`talk.vtt` (or `talk.en.srt`, ...) beside it or in a
`subtitles/` folder next to it, and a `talk.txt` sidecar as its description.
"""

from __future__ import annotations

from pathlib import Path

from ingest.units import FigureUnit, Parsed, Skip, VideoUnit, clean

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp")
VIDEO_SUFFIXES = (".mp4", ".mkv", ".webm", ".mov", ".avi", ".m4v")
SUBTITLE_SUFFIXES = (".srt", ".vtt")
SIDECAR_CHARS = 2000


def sidecar_text(path: Path) -> str:
    """The text of `name.ext.txt` or `name.txt` beside `path`, or ""."""
    for side in (path.with_name(path.name + ".txt"), path.with_suffix(".txt")):
        if side.is_file():
            return clean(side.read_text(encoding="utf-8", errors="replace"))[:SIDECAR_CHARS]
    return ""


def exif_description(image) -> str:  # noqa: ANN001 - a PIL image
    """The EXIF image description (tag 270), else the Windows XP comment or the user comment, or ""."""
    exif = image.getexif()
    text = exif.get(270) or ""
    if not text:
        ifd = exif.get_ifd(0x8769)  # the Exif sub-IFD holds UserComment
        raw = exif.get(0x9C9C) or ifd.get(0x9286) or b""
        if isinstance(raw, bytes):
            raw = raw.decode("utf-16-le" if raw[1:2] == b"\x00" else "utf-8", errors="ignore")
            raw = raw.removeprefix("ASCII\x00\x00\x00").removeprefix("UNICODE\x00")
        text = str(raw)
    return clean(str(text).replace("\x00", " "))


def parse_image(path: Path, file: str, corpus_dir: Path) -> Parsed:
    """One image as one figure (referenced in place, not copied), captioned by its sidecar or EXIF text."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:
            caption = sidecar_text(path) or exif_description(image)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise Skip("malformed", f"not a readable image ({type(e).__name__}: {str(e)[:120]})") from None
    title = path.stem.replace("_", " ")
    parsed = Parsed(file=file, title=title, kind="image")
    relative = Path(_relpath(path, corpus_dir))
    parsed.figures.append(FigureUnit(str(relative), caption or title, {"file": file, "figure": 1}))
    return parsed


def find_subtitles(video: Path) -> Path | None:
    """`name.srt`/`name.vtt` (or `name.<lang>.srt`) beside the video or in a `subtitles/` folder next to it."""
    for folder in (video.parent, video.parent / "subtitles"):
        for suffix in SUBTITLE_SUFFIXES:
            exact = folder / f"{video.stem}{suffix}"
            if exact.is_file():
                return exact
            tagged = sorted(folder.glob(f"{video.stem}.*{suffix}")) if folder.is_dir() else []
            if tagged:
                return tagged[0]
    return None


def parse_video(path: Path, file: str) -> Parsed:
    """A video for the clip and video KBs, with its sidecar subtitles and description (decoded when indexed)."""
    subs = find_subtitles(path)
    parsed = Parsed(file=file, title=path.stem.replace("_", " "), kind="video")
    parsed.videos.append(
        VideoUnit(str(path.resolve()), str(subs.resolve()) if subs else None, sidecar_text(path), {"file": file})
    )
    return parsed


def _relpath(path: Path, start: Path) -> str:
    import os

    return os.path.relpath(path.resolve(), start.resolve())
