"""COCO caption -> image retrieval with the image KB: caption-only, CLIP-only and fused scores side by side.

Usage (CPU): `python benchmarks/image_retrieval.py [--coco DIR] [--clip-model NAME] [--pretrained TAG] [--folds 5]`

Corpus: the 119 COCO photos of ../shared/data/image/coco with their 5 human captions each. Fold j holds caption j of
every image back as the query and indexes the other four as the image's caption text; the image KB (real MiniLM
caption encoder, open_clip image encoder) is built per fold with the normal KB build. Printed: recall@1 and
recall@5 of the query's own image, averaged over folds, for `visual_weight` 0 (caption only), 1 (CLIP only) and the
fused default 0.8 (and `--weights`). Offline, CLIP defaults to the tiny random `kbrouter-tiny-clip`
(`pretrained=None`): its column is chance level and the output says so. With real weights, e.g.
`--clip-model ViT-L-14 --pretrained openai` (needs the weights in the open_clip cache or a local path).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_COCO = Path(__file__).resolve().parents[2] / "shared" / "data" / "image" / "coco"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coco", type=Path, default=DEFAULT_COCO, help="folder with images.jsonl and images/")
    parser.add_argument("--clip-model", default="kbrouter-tiny-clip")
    parser.add_argument("--pretrained", default=None, help="open_clip pretrained tag or checkpoint; default random")
    parser.add_argument("--encoder", default="minilm", help="caption text encoder")
    parser.add_argument("--folds", type=int, default=5, help="held-back caption positions (1-5)")
    parser.add_argument("--weights", type=float, nargs="+", default=[0.0, 1.0, 0.8, 0.5], help="visual weights")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import numpy as np

    from retrievers.config import KBConfig
    from retrievers.kb import build_kb, load_kb
    from retrievers.media_retriever import MediaRetriever

    rows = [json.loads(line) for line in (args.coco / "images.jsonl").open()]
    rows = [r for r in rows if len(r["captions"]) >= args.folds]
    n = len(rows)
    hits = {w: [0, 0] for w in args.weights}
    queries = 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for fold in range(args.folds):
            corpus = Path(tmp) / f"fold{fold}.jsonl"
            with corpus.open("w") as f:
                for r in rows:
                    kept = [c for i, c in enumerate(r["captions"]) if i != fold]
                    f.write(
                        json.dumps({"id": r["image_id"], "image": str(args.coco / r["file"]), "captions": kept}) + "\n"
                    )
            cfg = KBConfig(
                name=f"coco{fold}",
                kind="image",
                corpus=corpus,
                search="dense",
                encoder=args.encoder,
                index_dir=Path(tmp) / f"index{fold}",
                options={"clip_model": args.clip_model, "clip_pretrained": args.pretrained},
            )
            build_kb(cfg, progress=False)
            kb = load_kb(cfg)
            ids = np.array([d.id for d in kb.docs])
            texts = [r["captions"][fold] for r in rows]
            for w in args.weights:
                scores = MediaRetriever(kb.cfg, kb.docs, kb.visual, kb.text, kb.clip, w).scores(texts)
                order = np.argsort(-scores, axis=1)[:, :5]
                for r, top in zip(rows, order, strict=True):
                    ranked = list(ids[top])
                    hits[w][0] += ranked[0] == r["image_id"]
                    hits[w][1] += r["image_id"] in ranked
            queries += n
    print(
        f"COCO caption -> image retrieval: {n} images, {queries} held-back caption queries ({args.folds} folds), "
        f"caption encoder {args.encoder}, CLIP {args.clip_model} pretrained={args.pretrained}  "
        f"[{time.perf_counter() - start:.0f}s]"
    )
    print(f"{'scores':28} {'visual_weight':>13} {'R@1':>6} {'R@5':>6}")
    for w in args.weights:
        name = {0.0: "caption only", 1.0: "CLIP only"}.get(w, "fused")
        print(f"{name:28} {w:13.2f} {hits[w][0] / queries:6.3f} {hits[w][1] / queries:6.3f}")
    print(f"{'chance':28} {'':>13} {1 / n:6.3f} {5 / n:6.3f}")
    if args.pretrained is None:
        print(
            "NOTE: CLIP weights are random (pretrained=None; no weights can be downloaded offline), so the CLIP-only "
            "column is chance level and every fused row is the caption signal plus CLIP noise. Rerun with "
            "--clip-model ViT-L-14 --pretrained openai (or a local checkpoint) for real CLIP figures."
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
