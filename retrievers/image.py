"""Image KB: open_clip image embeddings fused with caption similarity (`retrievers.media_retriever` searches it).

Corpus: a JSONL file, one image per line::

    {"id": "coco-535506", "image": "images/000000535506.jpg", "captions": ["A woman holding a knife ..."]}

(`image_id`/`file` are accepted for `id`/`image`, `caption` for a single caption; image paths are relative to the
JSONL file; an optional `metadata` object is kept on the image's doc.) A query is scored against every image as

    score = w * visual + (1 - w) * caption

where `visual` is the CLIP similarity of the query to the image, `caption` the text-encoder similarity of the query
text to the captions, and `w = options.visual_weight` (default 0.8, as UniversalRAG); `index` must be `flat`.

Options (`KBConfig.options`, `retrievers.media_options.ImageOptions`): `clip_model` (open_clip name, e.g.
`ViT-L-14`, or a config in `retrievers/clip_configs/`, e.g. `kbrouter-tiny-clip`), `clip_pretrained` (open_clip tag
such as `openai`, a checkpoint path, or null for random weights), `visual_weight`, `clip_batch_size`, `description`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from retrievers.clip_encoder import load_clip
from retrievers.config import KBConfig
from retrievers.jsonl import iter_jsonl_objects
from retrievers.media import MediaError, load_image
from retrievers.media_options import ImageOptions, check_flat, parse_options
from retrievers.media_retriever import MediaRetriever, load_media_kb, write_media_index
from retrievers.types import Doc, Media


def read_image_corpus(path: Path) -> list[dict]:
    """Rows `{id, image (absolute), captions, title}` of an image corpus JSONL, with clear errors."""
    rows = []
    for n, row in iter_jsonl_objects(path):
        doc_id = row.get("id", row.get("image_id"))
        image = row.get("image", row.get("file"))
        if doc_id is None or image is None:
            raise ValueError(f"{path}:{n}: each line needs `id` (or `image_id`) and `image` (or `file`)")
        captions = row.get("captions") or ([row["caption"]] if row.get("caption") else [])
        rows.append(
            {
                "id": str(doc_id),
                "image": str((Path(path).parent / image).resolve()),
                "captions": [str(c) for c in captions],
                "title": row.get("title", ""),
                "metadata": dict(row.get("metadata") or {}),  # e.g. provenance written by `kbrouter ingest`
            }
        )
    return rows


def build_image_kb(cfg: KBConfig, out_dir: Path, progress: bool = True) -> dict:
    """Embed every readable image of the corpus with CLIP and its captions with the text encoder.

    Unreadable, truncated or missing images are skipped and listed in the manifest (`skipped`) and
    `skipped.jsonl`; the build fails only when nothing is left.
    """
    check_flat(cfg)
    opts = parse_options(ImageOptions, cfg)
    clip = load_clip(opts.clip_model, opts.clip_pretrained, cfg.device, opts.clip_batch_size)
    rows = read_image_corpus(Path(cfg.corpus))
    docs, vectors, texts, skipped = [], [], [], []
    batch: list[tuple[dict, object]] = []

    def flush() -> None:
        if batch:
            vectors.append(clip.encode_images([im for _, im in batch]))
            batch.clear()

    for row in rows:
        try:
            image = load_image(row["image"])
        except (FileNotFoundError, MediaError) as e:
            skipped.append({"source": row["image"], "id": row["id"], "reason": str(e)})
            continue
        caption = " ".join(row["captions"])
        docs.append(
            Doc(
                id=row["id"],
                text=caption or Path(row["image"]).stem,
                title=row["title"],
                kb=cfg.name,
                modality="image",
                media=Media(row["image"]),
                metadata={**row["metadata"], "captions": row["captions"], "size": list(image.size)},
            )
        )
        texts.append(row["captions"])
        batch.append((row, image))
        if len(batch) >= opts.clip_batch_size:
            flush()
    flush()
    visual = np.concatenate(vectors) if vectors else np.zeros((0, clip.dim), dtype=np.float32)
    return write_media_index(cfg, out_dir, docs, visual, texts, skipped, clip.dim)


def load_image_kb(cfg: KBConfig) -> MediaRetriever:
    """Load a built image KB."""
    return load_media_kb(cfg, ImageOptions)
