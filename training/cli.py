"""`kbrouter train sft|grpo --config FILE [--key value ...]`: SFT and Step-GRPO of a step-wise RAG policy.

CPU (here, SmolLM2-135M, a few minutes):
    python -m training.cli grpo --config configs/train/smollm2_grpo_cpu.yaml
    python -m training.cli sft --config configs/train/smollm2_sft_cpu.yaml --max_steps 4

GPU (8 × H100, Qwen2.5-VL-7B, DeepSpeed ZeRO-3, vLLM colocated):
    accelerate launch --config_file configs/accelerate/deepspeed_zero3.yaml -m training.cli grpo \
        --config configs/train/qwen2p5vl7b_grpo.yaml

Resume: add `--resume_from_checkpoint last` (or a checkpoint folder); the run continues at the saved global step
with the same data order.

Flags: every field of the recipe's dataclass (TRL's `GRPOConfig`/`SFTConfig` plus ours) is a `--key value` flag of
TRL's `TrlParser`; `kbrouter train grpo --help` lists them.
"""

from __future__ import annotations

import argparse
import logging

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """Parse `sft|grpo --config FILE [--key value ...]`, build the trainer, train, save."""
    parser = argparse.ArgumentParser(prog="kbrouter train", description=__doc__, add_help=False, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("-h", "--help", action="store_true", help="this help; after sft|grpo, every recipe key")
    parser.add_argument("command", nargs="?", choices=["sft", "grpo"], help="training stage")
    parser.add_argument("--config", help="YAML recipe (configs/train/*.yaml)")
    args, overrides = parser.parse_known_args(argv)

    if args.help and args.command is None:
        parser.print_help()
        parser.exit()
    from training.config import load_config, recipe_parser

    if args.help:  # `kbrouter train grpo --help`: TRL's parser lists every field of the recipe with its help
        recipe_parser(args.command).print_help()
        parser.exit()
    if args.command is None or args.config is None:
        parser.error("give the stage and the recipe: kbrouter train sft|grpo --config FILE [--key value ...]")
    from training.trainers import build_grpo_trainer, build_sft_trainer, train

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # the parse's
    cfg = load_config(args.command, args.config, overrides)  # own lines (`bf16: auto -> ...`) show too
    # the main process logs at INFO (TRL's "passive" default would keep WARNING); replicas follow log_level_replica
    level = logging.INFO if cfg.should_log and cfg.log_level == "passive" else cfg.get_process_log_level()
    logging.getLogger().setLevel(level)
    logger.info("resolved %s config:\n%s", args.command, cfg)
    if args.command == "grpo" and cfg.online:  # live step trees (training/online_grpo.py)
        from training.online_grpo import build_online_grpo_trainer

        trainer = build_online_grpo_trainer(cfg)
    else:
        trainer = build_grpo_trainer(cfg) if args.command == "grpo" else build_sft_trainer(cfg)
    try:
        metrics = train(trainer, cfg)
    except KeyboardInterrupt as e:  # Ctrl-C: `kbrouter` prints this one line
        step = trainer.state.global_step
        e.args = (
            f"stopped at step {step}; the checkpoints in {cfg.output_dir} are kept (every save_steps); rerun with "
            "--resume_from_checkpoint true to resume from the newest complete one",
        )
        raise
    logger.info("done: %s", metrics)
    print(f"{args.command} finished: global_step={trainer.state.global_step} saved to {cfg.output_dir}")  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
