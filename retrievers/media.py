"""Reading media: images by path, video frames (PyAV), and SRT/VTT subtitles cut to a time span.

Video decoding uses PyAV (FFmpeg): on the shared test videos it decodes H.264 (MP4), HEVC (MKV), VP8 (WebM) and
MPEG-4 Part 2, like OpenCV, but 1.1-3x faster, with exact presentation timestamps, and it can skip decoding
non-reference frames. Frames for scene detection are scaled down with OpenCV's bilinear resize, exactly as
PySceneDetect does (FFmpeg's own scaler leaves noise in black frames that the content detector reads as cuts).

Every reader raises `MediaError` (a `ValueError`) naming the file when the file is missing, unreadable, truncated
or holds no video stream, so an index build can skip that file and report why.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

SUBTITLE_SUFFIXES = (".srt", ".vtt")


class MediaError(ValueError):
    """A media file is missing, unreadable, truncated or empty; the message names the path and the cause."""


class ImageTooLarge(MediaError):
    """An image declares more pixels than `MAX_IMAGE_PIXELS` (a decompression bomb, or just too big to decode)."""


def _av():
    try:
        import av
    except ImportError as e:
        raise ImportError("video decoding needs PyAV: pip install 'kbrouter[video]' (or pip install av)") from e
    return av


# -- images -------------------------------------------------------------------------------------------------------

# Decoding is refused above this many pixels: a 12 KB PNG can declare 10000x10000 (300 MB decoded), and every
# consumer here shrinks images to at most a few megapixels anyway. PIL's own bomb check only starts at 89 MP.
MAX_IMAGE_PIXELS = 40_000_000


def check_image_pixels(path: str | os.PathLike, max_pixels: int | None = None) -> tuple[int, int]:
    """The (width, height) an image file declares, read from its header without decoding the pixels.

    Raises:
        MediaError: the image declares more than `max_pixels` (default `MAX_IMAGE_PIXELS`), or is not an image.
        FileNotFoundError: no such file.
    """
    from PIL import Image, UnidentifiedImageError

    limit = MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image file {str(path)!r} does not exist")
    try:
        with warnings.catch_warnings():  # PIL warns on open above 89 MP; the decision is made here instead
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                w, h = im.size
    except (UnidentifiedImageError, OSError, SyntaxError, Image.DecompressionBombError) as e:
        raise MediaError(f"cannot read image {str(path)!r}: {e}") from e
    if w * h > limit:
        raise ImageTooLarge(f"image {str(path)!r} is {w}x{h} = {w * h} pixels; at most {limit} are decoded")
    return w, h


def load_image(path: str | os.PathLike):
    """Load an image file fully into memory as an RGB `PIL.Image` (EXIF orientation applied).

    Raises:
        FileNotFoundError: no such file.
        MediaError: not an image, truncated (PIL reads lazily, so the pixels are decoded here to catch it), or
            over `MAX_IMAGE_PIXELS`.
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    check_image_pixels(path)  # before decoding: a decompression bomb fails here, cheaply
    path = Path(path)
    try:
        with Image.open(path) as im:
            im.load()
            im = ImageOps.exif_transpose(im)
            return im.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, Image.DecompressionBombError) as e:
        raise MediaError(f"cannot read image {str(path)!r}: {e}") from e


def fit_pixels(image, min_pixels: int | None = None, max_pixels: int | None = None):
    """Scale a PIL image (aspect ratio kept) so that width * height lies in [min_pixels, max_pixels]."""
    from PIL import Image

    w, h = image.size
    area = w * h
    scale = 1.0
    if max_pixels and area > max_pixels:
        scale = (max_pixels / area) ** 0.5
    elif min_pixels and area < min_pixels:
        scale = (min_pixels / area) ** 0.5
    if scale == 1.0:
        return image
    size = (max(1, int(w * scale)), max(1, int(h * scale)))
    return image.resize(size, Image.Resampling.BICUBIC)


# -- video --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VideoInfo:
    """What the container says about a video's first video stream."""

    path: str
    duration: float
    fps: float
    frame_count: int
    width: int
    height: int
    codec: str


def _open(path: str | os.PathLike):
    av = _av()
    path = Path(path)
    if not path.is_file():
        raise MediaError(f"video file {str(path)!r} does not exist")
    try:
        container = av.open(str(path))
    except (av.error.FFmpegError, OSError) as e:
        raise MediaError(f"cannot open video {str(path)!r}: {e}") from e
    if not container.streams.video:
        container.close()
        raise MediaError(f"{str(path)!r} has no video stream")
    return container


def probe_video(path: str | os.PathLike) -> VideoInfo:
    """Duration, frame rate and size of a video from its container header (no decoding).

    Raises:
        MediaError: missing, unreadable, no video stream, or no usable duration/frame rate.
    """
    with _open(path) as container:
        s = container.streams.video[0]
        fps = float(s.average_rate or s.guessed_rate or 0)
        if s.duration is not None and s.time_base is not None:
            duration = float(s.duration * s.time_base)
        elif container.duration is not None:
            duration = container.duration / 1_000_000
        else:
            duration = 0.0
        if fps <= 0 or duration <= 0:
            raise MediaError(f"video {str(path)!r} reports no frame rate or duration (fps={fps}, duration={duration})")
        frames = s.frames or round(duration * fps)
        return VideoInfo(str(path), duration, fps, int(frames), s.width, s.height, s.codec_context.name)


def _scaled_size(width: int, height: int, target_width: int | None) -> tuple[int, int]:
    if not target_width or target_width >= width:
        return width, height
    return target_width, max(1, round(height * target_width / width))  # PySceneDetect's rounding


def iter_frames(
    path: str | os.PathLike, width: int | None = None, fmt: str = "bgr24", skip_nonref: bool = False
) -> Iterator[tuple[int, float, np.ndarray]]:
    """Decode every frame in order as `(index, seconds, array)`, scaled to `width` (OpenCV bilinear, as PySceneDetect).

    Args:
        path: video file.
        width: output width (height keeps the aspect ratio); None keeps the native size.
        fmt: `bgr24` (OpenCV / PySceneDetect) or `rgb24`.
        skip_nonref: let FFmpeg skip non-reference frames (about half the frames of HEVC/H.264 with B-frames;
            ~2x faster); `index` then counts decoded frames only, use the seconds for positions.

    Raises:
        MediaError: unreadable file, or a decoding error before the first frame. A decoding error later on
            (a truncated file) ends the iteration with a warning: the frames before it are good.
    """
    import cv2

    av = _av()
    container = _open(path)
    try:
        s = container.streams.video[0]
        s.thread_type = "AUTO"
        if skip_nonref:
            s.codec_context.skip_frame = "NONREF"
        size = _scaled_size(s.width, s.height, width)
        tb = float(s.time_base)
        index = 0
        try:
            for frame in container.decode(s):
                t = float(frame.pts * tb) if frame.pts is not None else index / float(s.average_rate or 25)
                arr = frame.to_ndarray(format=fmt)
                if size != (s.width, s.height):
                    arr = cv2.resize(arr, size, interpolation=cv2.INTER_LINEAR)
                yield index, t, arr
                index += 1
        except av.error.FFmpegError as e:
            if index == 0:
                raise MediaError(f"cannot decode video {str(path)!r}: {e}") from e
            logger.warning(
                "video %s: decoding stopped after %d frames (%s); the file may be truncated", path, index, e
            )
        if index == 0:
            raise MediaError(f"video {str(path)!r} has no decodable frames")
    finally:
        container.close()


def uniform_times(start: float, end: float, n: int) -> list[float]:
    """`n` timestamps spread evenly over [start, end): the midpoints of `n` equal slices."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if end <= start:
        return [start]
    step = (end - start) / n
    return [start + step * (i + 0.5) for i in range(n)]


def frames_at(
    path: str | os.PathLike, times: list[float], max_side: int | None = 448, skip_nonref: bool = False
) -> list:
    """The frames shown at the given timestamps (seconds) as RGB `PIL.Image`s, in the order of `times`.

    Seeks to the key frame before each distant timestamp and decodes forward, so sparse timestamps in a long
    video stay cheap. A timestamp past the last frame gets the last frame.

    Args:
        path: video file.
        times: timestamps in seconds (any order; duplicates allowed).
        max_side: downscale frames so the longer side is at most this (None keeps the native size).
        skip_nonref: skip decoding non-reference frames (~2x faster); a timestamp then gets the nearest
            reference frame at or after it, fine for embedding, not for frame-exact work.

    Raises:
        MediaError: the file is unreadable or yields no frame.
    """
    from PIL import Image

    av = _av()
    if not times:
        return []
    order = sorted(range(len(times)), key=lambda i: times[i])
    out: list = [None] * len(times)
    container = _open(path)
    try:
        s = container.streams.video[0]
        s.thread_type = "AUTO"
        if skip_nonref:
            s.codec_context.skip_frame = "NONREF"
        tb = float(s.time_base)
        size = (s.width, s.height)
        if max_side and max(size) > max_side:
            f = max_side / max(size)
            size = (max(1, round(s.width * f)), max(1, round(s.height * f)))
        last = None
        t = 0.0
        j = 0
        seek_gap = 5.0  # seconds: farther ahead than this, seeking beats decoding forward
        seek = True
        while j < len(order):
            if seek:
                target = times[order[j]]
                container.seek(max(0, int(target / tb)), stream=s, backward=True, any_frame=False)
            assigned_since_seek = False
            seek = False
            try:
                for frame in container.decode(s):
                    t = float(frame.pts * tb) if frame.pts is not None else 0.0
                    last = frame
                    dur = float(frame.duration * tb) if frame.duration else 0.0
                    while j < len(order) and times[order[j]] < t + max(dur, 1e-3):
                        out[order[j]] = Image.fromarray(
                            frame.to_ndarray(width=size[0], height=size[1], format="rgb24")
                        )
                        j += 1
                        assigned_since_seek = True
                    if j >= len(order):
                        break
                    # Seek only after reaching the previous target, so a sparse key-frame grid cannot loop forever.
                    if assigned_since_seek and times[order[j]] - t > seek_gap:
                        seek = True
                        break
            except av.error.FFmpegError as e:
                logger.warning("video %s: decoding stopped near %.2fs (%s); the file may be truncated", path, t, e)
            if not seek:
                break  # end of stream: remaining timestamps get the last frame
        if last is None:
            raise MediaError(f"video {str(path)!r} yields no frame")
        tail = Image.fromarray(last.to_ndarray(width=size[0], height=size[1], format="rgb24"))
        return [im if im is not None else tail for im in out]
    except av.error.FFmpegError as e:
        raise MediaError(f"cannot decode video {str(path)!r}: {e}") from e
    finally:
        container.close()


def sample_frames(
    path: str | os.PathLike, n: int, start: float = 0.0, end: float | None = None, max_side: int | None = 448
) -> list:
    """`n` frames spread uniformly over [start, end] (default: the whole video), as RGB `PIL.Image`s."""
    if end is None:
        end = probe_video(path).duration
    return frames_at(path, uniform_times(start, end, n), max_side=max_side)


# -- subtitles ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cue:
    """One subtitle cue: shown from `start` to `end` seconds."""

    start: float
    end: float
    text: str


_TIME = re.compile(r"(?:(\d+):)?(\d{1,2}):(\d{2})[,.](\d{1,3})")
_ARROW = re.compile(rf"({_TIME.pattern})\s*-->\s*({_TIME.pattern})")
_TAG = re.compile(r"<[^>]+>|\{\\[^}]*\}")


def _seconds(match: re.Match) -> float:
    h, m, s, ms = match.groups()
    return int(h or 0) * 3600 + int(m) * 60 + int(s) + int(ms.ljust(3, "0")) / 1000


def parse_subtitles(path: str | os.PathLike) -> list[Cue]:
    """Parse an SRT or WebVTT file into cues (sorted by start; markup tags removed).

    Raises:
        FileNotFoundError: no such file.
        MediaError: not UTF-8/latin-1 text, or no cue found.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"subtitle file {str(path)!r} does not exist")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    cues = []
    for block in re.split(r"\r?\n\s*\r?\n", text.replace("\r\n", "\n")):
        lines = [line for line in block.strip().split("\n") if line.strip()]
        for i, line in enumerate(lines):
            m = _ARROW.search(line)
            if m:
                start = _seconds(_TIME.match(m.group(1)))
                end = _seconds(_TIME.match(m.group(6)))
                body = " ".join(_TAG.sub("", x).strip() for x in lines[i + 1 :])
                if body.strip():
                    cues.append(Cue(start, max(end, start), " ".join(body.split())))
                break
    if not cues:
        raise MediaError(f"no subtitle cues found in {str(path)!r} (expected SRT or WebVTT)")
    return sorted(cues, key=lambda c: c.start)


def cut_cues(cues: list[Cue], start: float, end: float) -> list[Cue]:
    """The cues overlapping [start, end) (a cue straddling a border goes with both neighbours)."""
    return [c for c in cues if c.end > start and c.start < end]


def cues_text(cues: list[Cue]) -> str:
    """Cue texts joined into one transcript line."""
    return " ".join(c.text for c in cues)


def find_subtitles(video: str | os.PathLike, folders: list[Path] | None = None) -> Path | None:
    """A subtitle file for a video: `<stem>.srt|.vtt` or `<stem>.<lang>.srt|.vtt` next to it or in `folders`."""
    video = Path(video)
    for folder in [video.parent, *(folders or [])]:
        for suffix in SUBTITLE_SUFFIXES:
            exact = folder / f"{video.stem}{suffix}"
            if exact.is_file():
                return exact
            tagged = sorted(folder.glob(f"{video.stem}.*{suffix}"))
            if tagged:
                return tagged[0]
    return None
