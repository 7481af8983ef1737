"""The retriever shared by image, clip and video KBs, and the index folder it reads.

A media index folder holds `docs.jsonl`, `visual.npy` (one CLIP vector per doc), `text.npy` (one pooled
text-encoder vector per doc: captions or transcript, zero when there is none) and `skipped.jsonl` (inputs the build
left out, with the reason). A query is scored against every doc as

    score = w * visual + (1 - w) * text

where `visual` is the CLIP similarity of the query text to the doc's pixels (averaged with the CLIP similarity of the
query image when the query carries one), `text` the text-encoder similarity of the query text to the doc's text, and
`w = options.visual_weight`. Scores are exact inner products over L2-normalised vectors held in numpy (media KBs are
small next to text KBs), so `index` must be `flat`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from retrievers import store
from retrievers.clip_encoder import ClipEncoder, load_clip
from retrievers.config import KBConfig
from retrievers.encoders import normalize
from retrievers.jsonl import write_jsonl_atomic
from retrievers.media import MediaError, load_image
from retrievers.media_options import ImageOptions, parse_options
from retrievers.types import Doc, Hit, Query, as_queries

logger = logging.getLogger(__name__)

VISUAL_FILE = "visual.npy"
TEXT_FILE = "text.npy"
SKIPPED_FILE = "skipped.jsonl"


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
        index_dir = Path(cfg.index_dir)
        docs = store.read_docs(index_dir, cfg.name)
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
            self._encoder = store.encoder_for(self.cfg)  # looked up at call time: tests swap the encoder
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
    if not docs:
        reasons = "; ".join(f"{s['source']}: {s['reason']}" for s in skipped[:5])
        raise ValueError(f"KB {cfg.name!r}: corpus {str(cfg.corpus)!r} yielded no documents ({reasons})")
    flat = [t for ts in texts for t in ts]
    groups = [i for i, ts in enumerate(texts) for _ in ts]
    encoder = store.encoder_for(cfg)
    text = np.zeros((len(docs), encoder.dim), dtype=np.float32)
    if flat:
        np.add.at(text, np.asarray(groups), encoder.encode(flat))
        text = normalize(text)
    write_jsonl_atomic(out_dir / store.DOCS_FILE, (doc.to_dict() for doc in docs))
    np.save(out_dir / VISUAL_FILE, visual.astype(np.float32))
    np.save(out_dir / TEXT_FILE, text)
    write_jsonl_atomic(out_dir / SKIPPED_FILE, skipped)
    for s in skipped:
        logger.warning("KB %s: skipped %s: %s", cfg.name, s["source"], s["reason"])
    return {"dim": dim, "doc_count": len(docs), "skipped_count": len(skipped), "skipped": skipped[:50]}


def load_media_kb(cfg: KBConfig, options_cls: type[ImageOptions]) -> MediaRetriever:
    """Load a built image, clip or video KB with its CLIP model (`retrievers.kb.load_kb` checks the manifest first)."""
    opts = parse_options(options_cls, cfg)
    clip = load_clip(opts.clip_model, opts.clip_pretrained, cfg.device, opts.clip_batch_size)
    return MediaRetriever.load(cfg, opts.visual_weight, clip)
