"""Images for policies: load by path with a pixel budget, and encode as data URLs for OpenAI-compatible servers."""

from __future__ import annotations

import base64
import io
import os

from retrievers.media import fit_pixels, load_image

__all__ = ["fit_pixels", "image_to_data_url", "load_image"]


def image_to_data_url(
    path: str | os.PathLike, max_pixels: int | None = None, fmt: str = "JPEG", quality: int = 90
) -> str:
    """Encode an image file as a `data:` URL for an OpenAI-compatible `image_url` content part.

    The file is re-encoded (so any format PIL reads works, and EXIF rotation is applied); `max_pixels` shrinks
    large images first to keep requests small. The file itself is never modified.

    Args:
        path: image file.
        max_pixels: optional upper bound on width * height (aspect ratio kept).
        fmt: `JPEG` (small, no alpha) or `PNG` (lossless).
        quality: JPEG quality.

    Returns:
        `data:image/jpeg;base64,...` (or `image/png`).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is not a readable image (the message names the path).

    Example:
        >>> part = {"type": "image_url", "image_url": {"url": image_to_data_url("cat.jpg", max_pixels=1024 * 1024)}}
    """
    fmt = fmt.upper()
    if fmt not in ("JPEG", "PNG"):
        raise ValueError(f"fmt must be JPEG or PNG, got {fmt!r}")
    image = load_image(path)
    if max_pixels:
        image = fit_pixels(image, max_pixels=max_pixels)
    buf = io.BytesIO()
    image.save(buf, format=fmt, **({"quality": quality} if fmt == "JPEG" else {}))
    mime = "image/jpeg" if fmt == "JPEG" else "image/png"
    return f"data:{mime};base64,{base64.b64encode(buf.getvalue()).decode('ascii')}"
