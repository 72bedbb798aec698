"""The rows and pairs of scripts/bench_distill.py: what each row overrides in the shipped quickstart recipes, and
the tables written from the measured rows (no models here, so the row-building logic is cheap to test)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Sizes:
    """How much every run of the benchmark does (the same for every row of a pair)."""

    target_steps: int = 60           # the target's cross-entropy pre-training
    target_batch: int = 8
    draft_steps: int = 50            # every draft row
    draft_batch: int = 4
    max_length: int = 128
    learning_rate: float = 3e-3       # the quickstart recipes' peak, cosine decay
    num_prompts: int = 12             # held-out prompts for mean_accepted_tokens
    max_new_tokens: int = 32
    heldout_blocks: int = 8          # held-out text blocks for the teacher-forced columns
    target_max_new_tokens: int = 32   # sequence-level KD: the target's response length
    on_policy_max_new_tokens: int = 32


@dataclass(frozen=True)
class Pair:
    name: str
    describe: str
    target_shape: dict = field(default_factory=dict)  # overrides of the quickstart seed target's config
    draft: tuple[str, ...] = ()                       # model.* overrides of recipes/quickstart/draft_kd.yaml


PAIRS = {
    "quickstart": Pair("quickstart", "the quickstart's target (Llama hidden 256 x 4 layers, vocab 4096, 5.3M "
                                     "parameters) and draft (hidden 128 x 2 layers from scratch, 1.4M)"),
    "deep": Pair("deep", "a deeper, narrower target (hidden 128 x 8 layers, 2.6M parameters) and a draft made of its "
                         "layers 0 and 7 (`model.draft_layers: [0, 7]`, embeddings and head copied, 1.4M)",
                 target_shape={"hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 8,
                               "num_attention_heads": 2, "num_key_value_heads": 2},
                 draft=("model.draft_config=null", "model.draft_layers=[0,7]")),
}

# Each row's objective, as recipe overrides; {pair_dir} and {sizes.*} are filled in by draft_overrides.
ROWS: dict[str, list[str]] = {
    "ce": ["distill.loss=ce"],
    "forward_kl": ["distill.loss=forward_kl"],
    "reverse_kl": ["distill.loss=reverse_kl"],
    "jsd": ["distill.loss=jsd", "distill.beta=0.5"],
    "tv": ["distill.loss=tv"],
    "forward_kl+ce0.1": ["distill.loss=forward_kl", "distill.ce_weight=0.1"],
    "forward_kl+on_policy0.5": ["distill.loss=forward_kl", "distill.on_policy_fraction=0.5",
                                "distill.on_policy_max_new_tokens={on_policy_max_new_tokens}"],
    "seq_kd": ["distill.loss=ce", "data.target_weight=1", "data.target_data_dir={pair_dir}/target_responses",
               "data.target_max_new_tokens={target_max_new_tokens}"],
    "forward_kl_top32": ["distill.loss=forward_kl", "distill.teacher_cache={pair_dir}/teacher_cache_top32",
                         "distill.teacher_topk=32"],
}


def _common(sizes: Sizes, steps: int, batch: int) -> list[str]:
    return [f"data.max_length={sizes.max_length}", f"train.max_steps={steps}",
            f"train.per_device_train_batch_size={batch}", f"train.learning_rate={sizes.learning_rate}",
            "train.lr_scheduler_type=cosine", "train.logging_steps=10", f"train.save_steps={steps}",
            "train.save_total_limit=1", "train.report_to=[]", "train.seed=42"]


def target_overrides(seed_target: Path, dataset: Path, sizes: Sizes) -> list[str]:
    """recipes/quickstart/target.yaml overrides: the pair's seed architecture trained with CE on `dataset`."""
    return [f"model.target={seed_target}", f"data.dataset={dataset}",
            *_common(sizes, sizes.target_steps, sizes.target_batch)]


def draft_overrides(pair: Pair, row: str, target: Path, dataset: Path, pair_dir: Path, sizes: Sizes) -> list[str]:
    """recipes/quickstart/draft_kd.yaml overrides for one row: same data, steps, optimiser, seed; the row's loss.
    No acceptance is measured during training (the benchmark measures the final draft itself)."""
    fill = {"pair_dir": pair_dir, "target_max_new_tokens": sizes.target_max_new_tokens,
            "on_policy_max_new_tokens": sizes.on_policy_max_new_tokens}
    return [f"model.target={target}", *pair.draft, f"data.dataset={dataset}", "data.eval_prompts=null",
            "data.num_eval_prompts=0", "eval.at_checkpoints=false",
            *_common(sizes, sizes.draft_steps, sizes.draft_batch), *(o.format(**fill) for o in ROWS[row])]


# ---------------------------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------------------------

COLUMNS = ("row", "tf_acceptance", "greedy_agreement", "tau_greedy", "x CE", "tau_sampled", "x CE",
           "speedup greedy", "speedup sampled", "train tokens/s", "train wall s")


def _num(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_pair_table(rows: dict[str, dict]) -> str:
    """Markdown table of one pair's rows; tau columns also as a multiple of the ce row's."""
    ce = rows.get("ce", {})
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for name, r in rows.items():
        ratio = {m: r[f"tau_{m}"] / ce[f"tau_{m}"] if ce.get(f"tau_{m}") else None for m in ("greedy", "sampled")}
        cells = [f"`{name}`", _num(r["tf_acceptance"], ".3f"), _num(r["greedy_agreement"], ".3f"),
                 _num(r["tau_greedy"], ".2f"), _num(ratio["greedy"], ".2f") + "x", _num(r["tau_sampled"], ".2f"),
                 _num(ratio["sampled"], ".2f") + "x", _num(r["speedup_greedy"], ".2f") + "x",
                 _num(r["speedup_sampled"], ".2f") + "x", _num(r.get("tokens_per_s"), ".0f"),
                 _num(r.get("train_wall_s"), ".0f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratios_to_ce(results: dict[str, dict[str, dict]], mode: str) -> dict[str, list[float]]:
    """Per row, its tau at `mode` over the ce row's, one value per pair that measured both."""
    out: dict[str, list[float]] = {}
    for rows in results.values():
        ce = rows.get("ce", {}).get(f"tau_{mode}")
        for name, r in rows.items():
            if ce:
                out.setdefault(name, []).append(r[f"tau_{mode}"] / ce)
    return out


def winners(results: dict[str, dict[str, dict]]) -> list[str]:
    """Markdown lines naming the best row per decoding mode (highest mean tau / tau_ce over the pairs)."""
    lines = ["## Winner per decoding mode", ""]
    for mode in ("greedy", "sampled"):
        ratios = ratios_to_ce(results, mode)
        if not ratios:
            continue
        best = max(ratios, key=lambda n: sum(ratios[n]) / len(ratios[n]))
        shown = ", ".join(f"{v:.2f}x" for v in ratios[best])
        lines.append(f"- {mode} (gamma 4): **`{best}`**, mean_accepted_tokens {shown} the CE draft's "
                     f"(pairs {', '.join(results)})")
    return lines + [""]
