"""Build TRL trainers for Step-GRPO and SFT from a recipe: data first (fail fast), then the policy, then the trainer.

`trl.GRPOTrainer` and `trl.SFTTrainer` are used as they are (STYLE §22). Everything that can be wrong with the input
(missing gold, unknown reward, missing images, G < 2) is checked before a model loads.
"""

from __future__ import annotations

import logging
from pathlib import Path

from agent.backends.models import warn_if_slow_bf16
from agent.metrics import normalize_answer, shows_answer
from agent.protocol import answer_evidence, is_none
from training.config import StepDataArgs, StepGRPOConfig, StepSFTConfig
from training.kb_lists import vary_kb_lists, vary_kb_names
from training.rewards import ANSWER, PLAN, RewardFunc, build_reward
from training.step_data import StepRecord, load_step_records, resolve_images
from training.step_dataset import build_step_dataset

logger = logging.getLogger(__name__)

_GATED = ("ask", "route", "answer")


def load_records(cfg: StepDataArgs, path: str) -> list[StepRecord]:
    """Read and validate step records (and their images when used); no model is touched."""
    records = load_step_records(path, cfg.train_format, cfg.kb_pairs() or None)
    if cfg.use_images:
        records = resolve_images(records, cfg.image_root)
    if cfg.sample_seed is not None:
        import random

        records = list(records)
        random.Random(cfg.sample_seed).shuffle(records)
    if cfg.answers_shown:
        kept = [r for r in records if r.step_type != ANSWER or _evidence_shows_gold(r)]
        logger.info("answers_shown: %d answer records dropped (their evidence shows no gold answer)",
                    len(records) - len(kept))  # fmt: skip
        records = kept
    if cfg.balance_plan_decisions:
        records = _balance_plan_decisions(records)
    if cfg.max_per_dataset:
        records = _cap_per_dataset(records, cfg.max_per_dataset)
    if cfg.max_per_step_type:  # a step type left out of the caps gets none
        records = _cap(records, lambda r: r.step_type, lambda r: cfg.max_per_step_type.get(r.step_type, 0))
    if cfg.max_train_samples is not None:
        kept = [r for r in records if not cfg.step_types or r.step_type in cfg.step_types]
        records = kept[: cfg.max_train_samples]
    if cfg.kb_list_share:
        records = vary_kb_lists(records, cfg.kb_list_share, cfg.kb_list_min, seed=cfg.sample_seed or 0)
    if cfg.kb_name_share:
        aliases = cfg.kb_name_aliases or {}
        records = vary_kb_names(records, cfg.kb_name_share, aliases, cfg.kb_name_opaque, seed=cfg.sample_seed or 0)
    return records


def _cap(records: list[StepRecord], key, cap) -> list[StepRecord]:  # noqa: ANN001 - record -> key / limit
    """Keep the records in order, at most `cap(r)` (None = no limit) of each `key(r)`."""
    seen: dict = {}
    kept = []
    for r in records:
        k = key(r)
        seen[k] = seen.get(k, 0) + 1
        limit = cap(r)
        if limit is None or seen[k] <= limit:
            kept.append(r)
    return kept


def _cap_per_dataset(records: list[StepRecord], caps: dict) -> list[StepRecord]:
    """Keep at most `caps[dataset]` (else `caps["*"]`, else all) records of each (dataset, step type), in order. A
    mapping as the cap gives each step type its own (a step type it leaves out is not capped)."""

    def dataset(r: StepRecord) -> str:
        return r.metadata.get("dataset", "")

    def limit(r: StepRecord) -> int | None:
        cap = caps.get(dataset(r), caps.get("*"))
        return cap.get(r.step_type) if isinstance(cap, dict) else cap

    return _cap(records, lambda r: (dataset(r), r.step_type), limit)


def _evidence_shows_gold(r: StepRecord) -> bool:
    golds = [str(g) for g in r.gold.get("answers", [])]
    yes_no = any(normalize_answer(g) in ("yes", "no") for g in golds)
    return yes_no or shows_answer(answer_evidence(r.messages), golds)


def _gold_stops(r: StepRecord) -> bool:
    return is_none(r.gold.get("kb"))  # as the route reward reads it: no gold KB = the step should stop


def _balance_plan_decisions(records: list[StepRecord]) -> list[StepRecord]:
    """Reorder the plan records among their own positions by their rank within (dataset, gold decision), so the
    first plans of each dataset alternate stop / search; other step types keep their places. Caps applied
    afterwards then take both decisions about equally, where the data holds them."""
    slots = [i for i, r in enumerate(records) if r.step_type == PLAN]
    seen: dict = {}
    ranks = {}
    for i in slots:
        key = (records[i].metadata.get("dataset", ""), _gold_stops(records[i]))
        ranks[i] = seen[key] = seen.get(key, -1) + 1
    out = list(records)
    for slot, i in zip(slots, sorted(slots, key=lambda i: ranks[i]), strict=True):  # stable: ties keep order
        out[slot] = records[i]
    return out


def build_rewards(cfg: StepGRPOConfig) -> list[RewardFunc]:
    """Reward functions in recipe order (their weights are `cfg.reward_weights`)."""
    funcs = []
    for spec in cfg.reward_specs():
        kwargs = dict(spec.kwargs)
        if spec.name in _GATED:
            kwargs.setdefault("gate", cfg.format_gate)
        funcs.append(build_reward(spec.name, **kwargs))
    return funcs


def _dtype(name: str):
    import torch

    return "auto" if name == "auto" else getattr(torch, name)


def is_vision_language(model_path: str) -> bool:
    """Whether the model's config has a vision tower (Qwen2.5-VL-class)."""
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(model_path), "vision_config", None) is not None


def load_processing_class(model_path: str):
    """The tokenizer (text policy) or processor (vision-language policy) of a model folder."""
    from transformers import AutoProcessor, AutoTokenizer

    if is_vision_language(model_path):
        return AutoProcessor.from_pretrained(model_path)
    tok = AutoTokenizer.from_pretrained(model_path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_policy(model_path: str, dtype: str, init_adapter: str | None = None):
    """The policy model: `AutoModelForImageTextToText` for VL configs, else `AutoModelForCausalLM`; with
    `init_adapter`, that peft adapter on top, trainable (so GRPO continues the SFT adapter rather than a new one)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from agent.backends.models import check_adapter_base

    if init_adapter:  # a missing or mismatched adapter fails before the model loads (and not when a recipe parses:
        check_adapter_base(init_adapter, model_path)  # the stage before writes it)
    cls = AutoModelForImageTextToText if is_vision_language(model_path) else AutoModelForCausalLM
    model = cls.from_pretrained(model_path, dtype=_dtype(dtype))
    if init_adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, init_adapter, is_trainable=True)
    return model


def resolve_model_path(name_or_path: str) -> str:
    """`smollm2` → the cached SmolLM2 folder (converted once from the packaged GGUF); else unchanged."""
    from agent.backends.models import resolve_model

    return resolve_model(name_or_path)


def _tokenizer_of(processing_class):
    return getattr(processing_class, "tokenizer", processing_class)


def build_datasets(cfg: StepDataArgs, processing_class, train: list[StepRecord], evals: list[StepRecord] | None):
    tok = _tokenizer_of(processing_class)
    kw = dict(tokenizer=tok, max_prompt_tokens=cfg.max_prompt_tokens, use_images=cfg.use_images,
              step_types=cfg.step_types, grammar_tokens=cfg.grammar_tokens)  # fmt: skip
    train_ds = build_step_dataset(train, **kw)
    eval_ds = build_step_dataset(evals, **kw) if evals else None
    return train_ds, eval_ds


def step_datasets(cfg: StepDataArgs):
    """The recipe's train (and eval) step records as datasets, tokenised by the policy's processing class.

    Returns `(model_path, processing_class, train_ds, eval_ds)`; no model loads, so data errors come first.
    """
    train = load_records(cfg, cfg.train_file)
    evals = load_records(cfg, cfg.eval_file) if cfg.eval_file else None
    model_path = resolve_model_path(cfg.model_name_or_path)
    processing_class = load_processing_class(model_path)
    train_ds, eval_ds = build_datasets(cfg, processing_class, train, evals)
    return model_path, processing_class, train_ds, eval_ds


def make_trainer(trainer_cls, cfg, model_path: str, processing_class, train_dataset, **kwargs):
    """Load the policy (base model + `init_adapter`), then build `trainer_cls` on it with the recipe's args and LoRA.

    `kwargs` go to the trainer as they are (`reward_funcs`, `eval_dataset`, `rollout_func`, ...).
    """
    model = load_policy(model_path, cfg.model_dtype, cfg.init_adapter)
    return trainer_cls(model=model, args=cfg, train_dataset=train_dataset, processing_class=processing_class,
                       peft_config=cfg.lora_config(), **kwargs)  # fmt: skip


def grpo_trainer_class(trainer_cls: type, cfg: StepGRPOConfig) -> type:
    """`trainer_cls`, skipping zero-advantage rows in the loss where the recipe asks (`skip_zero_advantage`)."""
    from training.zero_advantage import with_zero_advantage_skip

    return with_zero_advantage_skip(trainer_cls) if cfg.skip_zero_advantage else trainer_cls


def _plain_text_generate(cfg: StepGRPOConfig, model_path: str) -> bool:
    """TRL would sample a text policy with transformers' `generate`: kbrouter's rollout does the same, each distinct
    prompt prefilled once (training/shared_prefill.py). vLLM, continuous batching, images and
    `KBROUTER_SHARED_PREFILL=0` keep TRL's own."""
    from training import shared_prefill

    other = cfg.use_vllm or getattr(cfg, "use_transformers_continuous_batching", False) or cfg.use_images
    return shared_prefill.enabled() and not other and not is_vision_language(model_path)


def build_grpo_trainer(cfg: StepGRPOConfig):
    """Step-GRPO: `trl.GRPOTrainer` over step prompts with the recipe's rewards."""
    from trl import GRPOTrainer

    model_path, processing_class, train_ds, eval_ds = step_datasets(cfg)
    rewards = build_rewards(cfg)
    if cfg.step_types and set(cfg.step_types) == {PLAN}:
        logger.info("plan steps only: the answer reward will be None (not applicable) on every row")
    train_ds = train_ds.remove_columns("completion")
    eval_ds = eval_ds.remove_columns("completion") if eval_ds is not None else None
    logger.info("Step-GRPO on %d step prompts (%s)", len(train_ds), dict(_count(train_ds["step_type"])))
    names = plan_kb_names(train_ds)
    from training.constrained_rollouts import ConstrainedRollouts, constrained_trainer_class, free_rollout_func

    if not cfg.constrained_rollouts:
        own = {"rollout_func": free_rollout_func} if _plain_text_generate(cfg, model_path) else {}
        trainer = make_trainer(grpo_trainer_class(GRPOTrainer, cfg), cfg, model_path, processing_class, train_ds,
                               eval_dataset=eval_ds, reward_funcs=rewards, **own)  # fmt: skip
        trainer.kb_names = names
        return trainer

    rollouts = ConstrainedRollouts(cfg.grammar_tokens, min_steps=cfg.rollout_min_steps)
    logger.info("rollouts sampled under the step grammars of %s tokens", cfg.grammar_tokens)
    trainer_cls = grpo_trainer_class(constrained_trainer_class(), cfg)
    trainer = make_trainer(trainer_cls, cfg, model_path, processing_class, train_ds, eval_dataset=eval_ds,
                           reward_funcs=rewards, rollout_func=rollouts.rollout_func)  # fmt: skip
    trainer.constrained = rollouts
    trainer.kb_names = names
    return trainer


def build_sft_trainer(cfg: StepSFTConfig):
    """SFT on step records: prompt + gold completion written with the step's tags (loss on the completion)."""
    from training.decision_loss import DecisionWeightedSFTTrainer

    model_path, processing_class, train_ds, eval_ds = step_datasets(cfg)
    names = plan_kb_names(train_ds)
    keep = ["prompt", "completion"] + (["images"] if "images" in train_ds.column_names else [])
    train_ds = train_ds.select_columns(keep)
    eval_ds = eval_ds.select_columns(keep) if eval_ds is not None else None
    logger.info("SFT on %d step examples", len(train_ds))
    trainer = make_trainer(DecisionWeightedSFTTrainer, cfg, model_path, processing_class, train_ds,
                           eval_dataset=eval_ds, decision_weight=cfg.decision_weight)  # fmt: skip
    trainer.kb_names = names
    return trainer


def plan_kb_names(train_ds) -> set[str]:  # noqa: ANN001 - a step dataset
    """The KB names the dataset's plan prompts list: what the trained adapter's router card records."""
    rows = zip(train_ds["step_type"], train_ds["kb_names"], strict=True)
    return {n for step_type, names in rows if step_type == PLAN for n in names}


def _count(values: list[str]) -> dict:
    from collections import Counter

    return Counter(values)


WEIGHT_FILES = ("adapter_model.safetensors", "model.safetensors", "model.safetensors.index.json", "adapter_model.bin",
                "pytorch_model.bin")  # fmt: skip
TORCH_FILES = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin")  # torch.save: zip archives


def _safetensors_problem(path: Path) -> str:
    """Why a safetensors file is unreadable (its header is cut or its tensors run past the end), or ""."""
    import json
    import struct

    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{path.name} is truncated ({size} bytes)"
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            return f"{path.name} is truncated (header of {n} bytes, file of {size})"
        try:
            header = json.loads(f.read(n))
        except ValueError:
            return f"{path.name} has an unreadable header"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    return f"{path.name} is truncated ({size} bytes, its tensors need {8 + n + end})" if 8 + n + end > size else ""


def checkpoint_problems(path: str | Path) -> list[str]:
    """Why a Trainer checkpoint folder is not a complete one (empty when it is).

    The Trainer writes `trainer_state.json` last: a checkpoint without it, or with it unreadable, was cut short. The
    weights must be present and whole (safetensors sizes checked against their headers), and the optimizer,
    scheduler and RNG files, when present, whole zip archives (what `torch.save` writes).
    """
    import json
    import zipfile

    path = Path(path)
    problems = []
    state = path / "trainer_state.json"
    try:
        json.loads(state.read_text())
    except FileNotFoundError:
        problems.append("no trainer_state.json (the save was interrupted)")
    except (ValueError, OSError):
        problems.append("trainer_state.json is unreadable (the save was interrupted)")
    weights = [path / name for name in WEIGHT_FILES if (path / name).is_file()]
    if not weights:
        problems.append(f"no weights ({' or '.join(WEIGHT_FILES[:2])})")
    for w in weights:
        if w.suffix == ".safetensors" and (problem := _safetensors_problem(w)):
            problems.append(problem)
    for name in TORCH_FILES:
        f = path / name
        if f.is_file() and not zipfile.is_zipfile(f):
            problems.append(f"{name} is truncated or not a torch.save archive")
    return problems


def newest_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The `checkpoint-<step>` folder of `output_dir` with the highest step that is complete (see
    `checkpoint_problems`); a half-written newer one is skipped with a warning naming what is wrong with it."""
    import re

    folders = [
        p for p in Path(output_dir).glob("checkpoint-*") if p.is_dir() and re.fullmatch(r"checkpoint-\d+", p.name)
    ]
    for folder in sorted(folders, key=lambda p: int(p.name.split("-")[1]), reverse=True):
        problems = checkpoint_problems(folder)
        if not problems:
            return str(folder)
        logger.warning("skipping incomplete checkpoint %s: %s", folder, "; ".join(problems))
    return None


def resume_checkpoint(cfg) -> str | bool | None:
    """`resume_from_checkpoint` as `Trainer.train` takes it: a path, or None.

    `true` (or `last`, `latest`) picks the newest complete checkpoint in `output_dir`: a half-written newer one (a
    run killed while saving) is skipped. A named checkpoint must be complete.

    Raises:
        FileNotFoundError: a named checkpoint folder does not exist.
        ValueError: a named checkpoint is incomplete; the message names what is missing and the newest complete one.
    """
    value = cfg.resume_from_checkpoint
    if value is None or str(value).lower() in ("", "false", "none"):
        return None
    if str(value).lower() in ("true", "last", "latest"):
        last = newest_complete_checkpoint(cfg.output_dir) if Path(cfg.output_dir).is_dir() else None
        if last is None:
            logger.info("no complete checkpoint in %s: starting from scratch", cfg.output_dir)
        return last
    if not Path(value).is_dir():
        raise FileNotFoundError(f"resume_from_checkpoint: no checkpoint folder at {value}")
    problems = checkpoint_problems(value)
    if problems:
        other = newest_complete_checkpoint(Path(value).parent)
        fix = f"resume from {other} instead" if other else "start from scratch (drop resume_from_checkpoint)"
        raise ValueError(f"resume_from_checkpoint: {value} is incomplete ({'; '.join(problems)}); {fix}")
    return value


def throughput_callback():
    """A `TrainerCallback` logging, on every process, each optimizer step's wall time and completions per second.

    Replicas log at INFO only with `log_level_replica: info` (TRL's default for replicas is warning).
    """
    import time

    from transformers import TrainerCallback

    class ThroughputCallback(TrainerCallback):
        def __init__(self):
            self.t0 = 0.0
            self.times: list[float] = []

        def on_train_begin(self, args, state, control, **kwargs):
            logger.info("process %d/%d on %s", args.process_index, args.world_size, args.device)

        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            dt = time.perf_counter() - self.t0
            self.times.append(dt)
            n = args.per_device_train_batch_size * args.gradient_accumulation_steps
            logger.info("throughput process %d: step %d took %.1f s, %d completions, %.2f completions/s",
                        args.process_index, state.global_step, dt, n, n / dt)  # fmt: skip

        def on_train_end(self, args, state, control, **kwargs):
            if self.times:
                n = args.per_device_train_batch_size * args.gradient_accumulation_steps * len(self.times)
                logger.info("throughput process %d: %d steps in %.1f s, %.2f completions/s on this process",
                            args.process_index, len(self.times), sum(self.times), n / sum(self.times))  # fmt: skip

    return ThroughputCallback()


def finished_at(checkpoint: str | Path, max_steps: int) -> int | None:
    """The checkpoint's global step when it already is the run's last one (`max_steps`, else the step count the run
    had planned, saved in its `trainer_state.json`), else None."""
    import json

    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text(encoding="utf-8"))
    target = max_steps if max_steps and max_steps > 0 else int(state.get("max_steps") or 0)
    step = int(state.get("global_step") or 0)
    return step if target > 0 and step >= target else None


def train(trainer, cfg) -> dict:
    """Train (resuming when asked), save the final model, return the final metrics.

    A run killed after its last checkpoint but before the final save is finished from that checkpoint: its weights
    are saved as they are. (`Trainer.train` resumed at `global_step == max_steps` trains one step more: measured by
    benchmarks/chaos_kill9.py, 7 steps for `max_steps: 6`.)
    """
    import torch
    from transformers import TrainerState

    from training import cpu_lm_head, shared_prefill  # imports TRL

    trainer.add_callback(throughput_callback())
    on_cpu = getattr(cfg, "use_cpu", False) or not torch.cuda.is_available()
    warn_if_slow_bf16(bool(getattr(cfg, "bf16", False)), "cpu" if on_cpu else "cuda")
    if cpu_lm_head.install() and on_cpu:
        logger.info("fused LM head: labelled positions only on CPU (training/cpu_lm_head.py; off: %s=0)",
                    cpu_lm_head.OFF_ENV)  # fmt: skip
    sharded = bool(getattr(cfg, "deepspeed", None) or getattr(cfg, "fsdp", None))  # they wrap the backbone's modules
    if not sharded and shared_prefill.share_training_prefixes(trainer.model):
        logger.info("training forwards run each batch's shared prompt prefix once (training/shared_prefill.py; "
                    "off: %s=0)", shared_prefill.TRAIN_OFF_ENV)  # fmt: skip
    checkpoint = resume_checkpoint(cfg)
    step = finished_at(checkpoint, getattr(cfg, "max_steps", -1)) if checkpoint else None
    if step is not None:
        logger.info("%s is the run's last step (%d): nothing left to train, saving its weights", checkpoint, step)
        trainer._load_from_checkpoint(checkpoint)  # weights only (a LoRA adapter or the full model)
        trainer.state = TrainerState.load_from_json(str(Path(checkpoint) / "trainer_state.json"))
        trainer.save_model(cfg.output_dir)
        save_router_card(trainer, cfg)
        return {"global_step": step, "resumed_finished_checkpoint": checkpoint}
    if getattr(cfg, "screen_prompts", False):
        from training.prompt_screen import screen_prompts

        screen_prompts(trainer, cfg.output_dir)
    result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(cfg.output_dir)
    save_router_card(trainer, cfg)
    return dict(result.metrics)


def save_router_card(trainer, cfg) -> None:  # noqa: ANN001
    """Next to a saved LoRA adapter, the KB names its plan steps trained on (`agent.route_prior: auto` reads it)."""
    from agent.backends.models import write_router_card

    names = getattr(trainer, "kb_names", None)
    if names and (Path(cfg.output_dir) / "adapter_config.json").is_file():
        write_router_card(cfg.output_dir, names, getattr(cfg, "init_adapter", None))
