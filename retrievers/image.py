"""Image KB: open_clip image embeddings fused with caption similarity, and the retriever shared by media KBs.

Corpus: a JSONL file, one image per line::

    {"id": "coco-535506", "image": "images/000000535506.jpg", "captions": ["A woman holding a knife ..."]}

(`image_id`/`file` are accepted for `id`/`image`, `caption` for a single caption; image paths are relative to the
JSONL file; an optional `metadata` object is kept on the image's doc.) A query is scored against every image as

    score = w * visual + (1 - w) * caption

where `visual` is the CLIP similarity of the query text to the image (averaged with the CLIP similarity of the query
image to the image when the query carries one), `caption` the text-encoder similarity of the query text to the
captions, and `w = options.visual_weight` (default 0.8, as UniversalRAG). Scores are exact inner products over
L2-normalised vectors held in numpy (media KBs are small next to text KBs), so `index` must be `flat`.

Options (`KBConfig.options`): `clip_model` (open_clip name, e.g. `ViT-L-14`, or a config in
`retrievers/clip_configs/`, e.g. `kbrouter-tiny-clip`), `clip_pretrained` (open_clip tag such as `openai`, a
checkpoint path, or null for random weights), `visual_weight`, `clip_batch_size`, `description`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from retrievers.encoders import normalize
from retrievers.jsonl import iter_jsonl_objects, write_jsonl_atomic
from retrievers.media import MediaError, load_image
from retrievers.types import Doc, Hit, Media, Query, as_queries

if TYPE_CHECKING:  # the config module imports the kinds registry, which imports this module
    from retrievers.config import KBConfig

logger = logging.getLogger(__name__)
T = TypeVar("T")

CLIP_CONFIG_DIR = Path(__file__).parent / "clip_configs"
DOCS_FILE = "docs.jsonl"
VISUAL_FILE = "visual.npy"
TEXT_FILE = "text.npy"
SKIPPED_FILE = "skipped.jsonl"


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


# -- CLIP ---------------------------------------------------------------------------------------------------------


class ClipEncoder:
    """An open_clip model that embeds images (PIL) and texts into one L2-normalised space."""

    def __init__(self, model: str, pretrained: str | None, device: str | None = None, batch_size: int = 32):
        try:
            import open_clip
            import torch
        except ImportError as e:
            raise ImportError("image/video KBs need open_clip: pip install 'kbrouter[image]' (open_clip_torch)") from e
        open_clip.add_model_config(CLIP_CONFIG_DIR)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model, _, self.preprocess = open_clip.create_model_and_transforms(
            model, pretrained=pretrained, device=self.device
        )
        self.model.eval()
        self.tokenizer = open_clip.get_tokenizer(model)
        self.name = f"{model}/{pretrained}"
        self.batch_size = batch_size
        self.dim = int(self.encode_texts(["dimension probe"]).shape[1])

    def encode_images(self, images: list) -> np.ndarray:
        """(n, dim) unit vectors for RGB PIL images."""
        import torch

        if not images:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = []
        with torch.inference_mode():
            for i in range(0, len(images), self.batch_size):
                batch = torch.stack([self.preprocess(im) for im in images[i : i + self.batch_size]]).to(self.device)
                out.append(self.model.encode_image(batch).float().cpu().numpy())
        return normalize(np.concatenate(out))

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        """(n, dim) unit vectors for texts (truncated to the model's context)."""
        import torch

        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), self.batch_size):
                tokens = self.tokenizer(texts[i : i + self.batch_size]).to(self.device)
                out.append(self.model.encode_text(tokens).float().cpu().numpy())
        return normalize(np.concatenate(out)) if out else np.zeros((0, 0), dtype=np.float32)


@functools.lru_cache(maxsize=2)
def load_clip(model: str, pretrained: str | None, device: str | None = None, batch_size: int = 32) -> ClipEncoder:
    """Load (once per process) an open_clip model; `pretrained=None` gives random weights and no download."""
    return ClipEncoder(model, pretrained, device, batch_size)


# -- the retriever shared by image, clip and video KBs ------------------------------------------------------------


class MediaRetriever:
    """Scores queries against media docs: `w * CLIP(query, pixels) + (1 - w) * text(query, caption/transcript)`.

    A doc without text (a clip without transcript) has a zero text vector, so it ranks on `w * visual` alone.
    Satisfies `Retriever`.
    """

    def __init__(
        self, cfg: KBConfig, docs: list[Doc], visual: np.ndarray, text: np.ndarray, clip: ClipEncoder, weight: float
    ):
        self.cfg = cfg
        self.name = cfg.name
        self.docs = docs
        self.visual = visual
        self.text = text
        self.clip = clip
        self.weight = float(weight)
        self._encoder = None

    @classmethod
    def load(cls, cfg: KBConfig, weight: float, clip: ClipEncoder) -> MediaRetriever:
        from retrievers.store import read_docs

        index_dir = Path(cfg.index_dir)
        docs = read_docs(index_dir, cfg.name)
        visual = np.load(index_dir / VISUAL_FILE)
        text = np.load(index_dir / TEXT_FILE)
        if not len(docs) == len(visual) == len(text):
            raise ValueError(
                f"KB {cfg.name!r}: index {str(index_dir)!r} is inconsistent ({len(docs)} docs, {len(visual)} visual "
                f"and {len(text)} text vectors); rebuild it with: {cfg.fix_command}"
            )
        return cls(cfg, docs, visual, text, clip, weight)

    def __len__(self) -> int:
        return len(self.docs)

    def _text_encoder(self):
        if self._encoder is None:
            from retrievers.store import encoder_for

            self._encoder = encoder_for(self.cfg)
        return self._encoder

    def scores(self, queries: list[str | Query]) -> np.ndarray:
        """(n_queries, n_docs) fused scores; rows of queries with neither text nor image are all -inf."""
        qs = as_queries(queries)
        texts = [q.text.strip() for q in qs]
        out = np.full((len(qs), len(self.docs)), -np.inf, dtype=np.float32)
        live = [i for i, q in enumerate(qs) if texts[i] or q.image]
        if not live:
            return out
        w = self.weight
        visual = np.zeros((len(live), len(self.docs)), dtype=np.float32)
        text = np.zeros_like(visual)
        with_text = [j for j, i in enumerate(live) if texts[i]]
        if with_text and w > 0:
            visual[with_text] = self.clip.encode_texts([texts[live[j]] for j in with_text]) @ self.visual.T
        if with_text and w < 1:
            text[with_text] = self._text_encoder().encode([texts[live[j]] for j in with_text]) @ self.text.T
        with_image = [j for j, i in enumerate(live) if qs[i].image]
        if with_image and w > 0:
            images = []
            for j in with_image:
                try:
                    images.append(load_image(qs[live[j]].image))
                except (FileNotFoundError, MediaError) as e:  # a bad query image degrades to text-only search
                    logger.warning("KB %s: query image ignored: %s", self.name, e)
                    images.append(None)
            ok = [j for j, im in zip(with_image, images, strict=True) if im is not None]
            if ok:
                sims = self.clip.encode_images([im for im in images if im is not None]) @ self.visual.T
                for j, row in zip(ok, sims, strict=True):
                    visual[j] = (visual[j] + row) / 2 if j in with_text else row
        fused = w * visual + (1 - w) * text
        out[live] = fused
        return out

    def search(self, queries: list[str | Query], k: int | None = None) -> list[list[Hit]]:
        """Top-k hits per query, best first; an empty query (no text, no image) gets an empty list."""
        k = k or self.cfg.k
        scores = self.scores(queries)
        results = []
        for row in scores:
            if not np.isfinite(row).any():
                results.append([])
                continue
            top = np.argsort(-row, kind="stable")[:k]
            results.append(
                [Hit(doc=self.docs[d], score=float(row[d]), rank=r, kb=self.name) for r, d in enumerate(top)]
            )
        return results


def write_media_index(
    cfg: KBConfig,
    out_dir: Path,
    docs: list[Doc],
    visual: np.ndarray,
    texts: list[list[str]],
    skipped: list[dict],
    dim: int,
) -> dict:
    """Write docs, visual vectors and pooled text vectors (zero for docs without text) into `out_dir`."""
    from retrievers.store import encoder_for

    if not docs:
        reasons = "; ".join(f"{s['source']}: {s['reason']}" for s in skipped[:5])
        raise ValueError(f"KB {cfg.name!r}: corpus {str(cfg.corpus)!r} yielded no documents ({reasons})")
    flat = [t for ts in texts for t in ts]
    groups = [i for i, ts in enumerate(texts) for _ in ts]
    encoder = encoder_for(cfg)
    text = np.zeros((len(docs), encoder.dim), dtype=np.float32)
    if flat:
        np.add.at(text, np.asarray(groups), encoder.encode(flat))
        text = normalize(text)
    write_jsonl_atomic(out_dir / DOCS_FILE, (doc.to_dict() for doc in docs))
    np.save(out_dir / VISUAL_FILE, visual.astype(np.float32))
    np.save(out_dir / TEXT_FILE, text)
    write_jsonl_atomic(out_dir / SKIPPED_FILE, skipped)
    for s in skipped:
        logger.warning("KB %s: skipped %s: %s", cfg.name, s["source"], s["reason"])
    return {"dim": dim, "doc_count": len(docs), "skipped_count": len(skipped), "skipped": skipped[:50]}


# -- image KB -----------------------------------------------------------------------------------------------------


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


def load_media_kb(cfg: KBConfig, options_cls: type[ImageOptions]) -> MediaRetriever:
    """Load a built image, clip or video KB with its CLIP model (`retrievers.kb.load_kb` checks the manifest first)."""
    opts = parse_options(options_cls, cfg)
    clip = load_clip(opts.clip_model, opts.clip_pretrained, cfg.device, opts.clip_batch_size)
    return MediaRetriever.load(cfg, opts.visual_weight, clip)


def load_image_kb(cfg: KBConfig) -> MediaRetriever:
    """Load a built image KB."""
    return load_media_kb(cfg, ImageOptions)
