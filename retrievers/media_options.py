"""Options of the media KB kinds (`KBConfig.options` of image, clip and video KBs) and their checks.

`ImageOptions` holds the CLIP settings every media kind shares (`retrievers.video` extends it for clips and videos):
`clip_model`, `clip_pretrained` (see `retrievers.clip_encoder`), `visual_weight` (the weight of CLIP similarity
against caption/transcript similarity), `clip_batch_size` and `description`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

from retrievers.config import KBConfig

T = TypeVar("T")


@dataclass(frozen=True)
class ImageOptions:
    """Options of an image KB (`KBConfig.options`)."""

    clip_model: str = "ViT-L-14"
    clip_pretrained: str | None = "openai"
    visual_weight: float = 0.8
    clip_batch_size: int = 32
    description: str = ""

    def __post_init__(self) -> None:
        check_weight(self.visual_weight)


def check_weight(w: float) -> None:
    if not 0.0 <= float(w) <= 1.0:
        raise ValueError(f"`options.visual_weight` must be in [0, 1] (1 = CLIP only, 0 = text only), got {w!r}")


def parse_options(cls: type[T], cfg: KBConfig) -> T:
    """Build an options dataclass from `cfg.options`; an unknown key is an error naming the valid ones."""
    valid = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(cfg.options) - valid)
    if unknown:
        raise ValueError(
            f"KB {cfg.name!r}: unknown option(s) {unknown} for kind {cfg.kind!r}; valid options: {sorted(valid)}"
        )
    return cls(**cfg.options)


def check_flat(cfg: KBConfig) -> None:
    if cfg.index != "flat" or cfg.search != "dense":
        raise ValueError(
            f"KB {cfg.name!r}: kind {cfg.kind!r} scores exactly in numpy; set `index: flat` and `search: dense` "
            f"(got index={cfg.index!r}, search={cfg.search!r})"
        )
