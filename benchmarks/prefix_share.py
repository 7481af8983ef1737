"""Share of an SFT recipe's training tokens that prefix sharing saves, batch by batch (what `share_training_prefixes`
in training/shared_prefill.py skips), and a lower bound for batches whose rows all share their system message.

The recipe's own data loader gives the batches (its sampler, KB lists, truncation); `prefix_plan` picks each batch's
prefix as training does. The bound counts, per batch, (rows - 1) x the shortest system message (up to its first
`<|im_end|>`): what one KB list a batch would at least let the rows share. The trainer loads the model, which never runs.

    python benchmarks/prefix_share.py configs/train/smollm2_router_chain_v2_sft_routing_lora_cpu.yaml \
        configs/train/smollm2_router_chain_v2_sft_lora_cpu.yaml
"""

from __future__ import annotations

import argparse
import tempfile


def shares(recipe: str, end_token: str = "<|im_end|>") -> dict[str, float]:
    from training.config import load_config
    from training.shared_prefill import prefix_plan
    from training.trainers import build_sft_trainer

    with tempfile.TemporaryDirectory(prefix="kbrouter_prefix_share_") as tmp:
        trainer = build_sft_trainer(load_config("sft", recipe, ["--output_dir", tmp]))
        end = trainer.processing_class.convert_tokens_to_ids(end_token)
        real = saved = bound = batches = 0
        for batch in trainer.get_train_dataloader():
            ids, mask = batch["input_ids"], batch["attention_mask"]
            real += int(mask.sum())
            plan = prefix_plan(ids, mask)
            if plan is not None:
                length, first, _ = plan
                saved += (ids.shape[0] - first.shape[0]) * length
            hits = [(row == end).nonzero() for row in ids]
            ends = [int(h[0]) + 1 if len(h) else 0 for h in hits]
            bound += (ids.shape[0] - 1) * min(ends)
            batches += 1
    return {"batches": batches, "tokens": real, "saved": saved / real, "bound": bound / real}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipes", nargs="+", help="SFT recipes")
    args = ap.parse_args()
    rows = {recipe: shares(recipe) for recipe in args.recipes}
    print(f"{'recipe':70}{'batches':>9}{'tokens':>10}{'saved now':>11}{'one list a batch, at least':>28}")
    for recipe, r in rows.items():
        print(f"{recipe:70}{r['batches']:9d}{r['tokens']:10d}{r['saved']:11.1%}{r['bound']:28.1%}")


if __name__ == "__main__":
    main()
