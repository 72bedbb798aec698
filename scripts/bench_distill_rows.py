"""The rows and pairs of scripts/bench_distill.py: what each row overrides in the shipped quickstart recipes, when a
target counts as trained, and the tables written from the measured rows (no models here, so the logic is cheap to
test)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Sizes:
    """How much every run of the benchmark does (the same for every row of a pair)."""

    target_steps: int = 150           # one round of the target's cross-entropy training (cosine to 0 each round)
    target_max_rounds: int = 10       # ... until held-out CE stops improving (target_converged), at most this many
    target_lr_decay: float = 0.7      # round r's peak learning rate: learning_rate * target_lr_decay ** (r - 1)
    target_batch: int = 8
    draft_steps: int = 200            # every draft row
    draft_batch: int = 4
    max_length: int = 128
    learning_rate: float = 3e-3       # the quickstart recipes' peak, cosine decay
    warmup_steps: float = 0.05        # linear warm-up, a fraction of the steps: distill.md was measured with 0.05 (the
                                      # quickstart recipes' until 2026-11-24; they now warm up for 0.2)
    num_prompts: int = 48             # held-out prompts for mean_accepted_tokens
    max_new_tokens: int = 64
    heldout_blocks: int = 16          # held-out text blocks for the teacher-forced columns and the targets' CE
    target_max_new_tokens: int = 64   # sequence-level KD: the target's response length
    on_policy_max_new_tokens: int = 64


SEEDS = (42, 43)  # every row with the first; the top rows (and ce) again with the others
CONVERGED = 0.01  # a target is trained when held-out CE improved by < 1% over the last fifth of its steps


def target_converged(history: list[tuple[int, float]], tolerance: float = CONVERGED) -> bool:
    """Whether held-out CE stopped improving: history is [(optimizer steps so far, held-out CE)] after each round;
    the CE at the last measurement at or before 80% of the steps vs the CE now, relative: < tolerance."""
    if not history:
        return False
    steps, now = history[-1]
    earlier = [ce for s, ce in history[:-1] if s <= 0.8 * steps]
    return bool(earlier) and (earlier[-1] - now) / earlier[-1] < tolerance


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

# An EAGLE-3 head instead of the pair's standalone draft (recipes/quickstart/head.yaml's head: training-time test 4
# steps, decay 0.8, started from the target's lm_head / norm / last MLP)
HEAD = ["model.draft_kind=eagle3", "model.draft_config=null", "model.draft_layers=null", "distill.ttt_steps=4",
        "distill.ttt_decay=0.8"]

# Each row's objective, as recipe overrides; {pair_dir} and {sizes.*} are filled in by draft_overrides.
ROWS: dict[str, list[str]] = {
    "ce": ["distill.loss=ce"],
    "forward_kl": ["distill.loss=forward_kl"],
    "reverse_kl": ["distill.loss=reverse_kl"],
    "jsd": ["distill.loss=jsd", "distill.beta=0.5"],
    "tv": ["distill.loss=tv"],
    "nla": ["distill.loss=nla"],
    "lk_hybrid": ["distill.loss=lk_hybrid"],
    # CE first (learns the argmax fast), TV by the end (the acceptance itself), linearly over the whole run
    "ce_to_tv": ["distill.loss={ce: {start: 1.0, end: 0.0}, tv: {start: 0.0, end: 1.0}}"],
    "forward_kl+on_policy0.5": ["distill.loss=forward_kl", "distill.on_policy_fraction=0.5",
                                "distill.on_policy_max_new_tokens={on_policy_max_new_tokens}"],
    "seq_kd": ["distill.loss=ce", "data.target_weight=1", "data.target_data_dir={pair_dir}/target_responses",
               "data.target_max_new_tokens={target_max_new_tokens}"],
    "forward_kl_top32": ["distill.loss=forward_kl", "distill.teacher_cache={pair_dir}/teacher_cache_top32",
                         "distill.teacher_topk=32"],
    # EAGLE-3 heads on the same target, rows, steps and optimiser, for the leading objectives
    "head_forward_kl": [*HEAD, "distill.loss=forward_kl"],
    "head_tv": [*HEAD, "distill.loss=tv"],
}
HEAD_PREFIX = "head_"  # rows of EAGLE-3 heads; the others train standalone drafts


def _common(sizes: Sizes, steps: int, batch: int, seed: int = SEEDS[0],
            learning_rate: float | None = None) -> list[str]:
    return [f"data.max_length={sizes.max_length}", f"train.max_steps={steps}",
            f"train.per_device_train_batch_size={batch}",
            f"train.learning_rate={learning_rate if learning_rate is not None else sizes.learning_rate}",
            "train.lr_scheduler_type=cosine", f"train.warmup_steps={sizes.warmup_steps}",
            f"train.logging_steps={min(10, steps)}", f"train.save_steps={steps}", "train.save_total_limit=1",
            "train.report_to=[]", f"train.seed={seed}"]


def target_overrides(start: Path, dataset: Path, sizes: Sizes, round_index: int = 1) -> list[str]:
    """recipes/quickstart/target.yaml overrides for one round of the target's CE training on `dataset`: round 1
    trains the pair's seed architecture from scratch, round r > 1 continues from round r - 1's model `start` with
    a lower peak learning rate (cosine to 0 in every round) and other rows (seed 42 + r - 1)."""
    model = [f"model.target={start}"] if round_index == 1 else \
        [f"model.target={start}", f"model.draft={start}", "model.draft_config=null"]
    lr = sizes.learning_rate * sizes.target_lr_decay ** (round_index - 1)
    return [*model, f"data.dataset={dataset}",
            *_common(sizes, sizes.target_steps, sizes.target_batch, SEEDS[0] + round_index - 1, lr)]


def draft_overrides(pair: Pair, row: str, target: Path, dataset: Path, pair_dir: Path, sizes: Sizes,
                    seed: int = SEEDS[0]) -> list[str]:
    """recipes/quickstart/draft_kd.yaml overrides for one row: same data, steps, optimiser, seed; the row's loss.
    No acceptance is measured during training (the benchmark measures the final draft itself)."""
    fill = {"pair_dir": pair_dir, "target_max_new_tokens": sizes.target_max_new_tokens,
            "on_policy_max_new_tokens": sizes.on_policy_max_new_tokens}
    return [f"model.target={target}", *pair.draft, f"data.dataset={dataset}", "data.eval_prompts=null",
            "data.num_eval_prompts=0", "eval.at_checkpoints=false",
            *_common(sizes, sizes.draft_steps, sizes.draft_batch, seed), *(_fill(o, fill) for o in ROWS[row])]


def _fill(override: str, values: dict) -> str:
    """The override with each {name} of `values` replaced (other braces, e.g. a YAML mapping, stay)."""
    for name, value in values.items():
        override = override.replace("{" + name + "}", str(value))
    return override


def row_key(row: str, seed: int) -> str:
    """The file and folder name of one row at one seed: the row's name for the first seed, row@seedN after."""
    return row if seed == SEEDS[0] else f"{row}@seed{seed}"


def is_head(row: str) -> bool:
    return row.startswith(HEAD_PREFIX)


def top_rows(rows: dict[str, dict], count: int) -> list[str]:
    """The `count` standalone rows (ce and heads left out) with the highest mean of tau_greedy / ce's and
    tau_sampled / ce's."""
    ce = rows.get("ce")
    if not ce:
        return []

    def score(r: dict) -> float:
        return (r["tau_greedy"] / ce["tau_greedy"] + r["tau_sampled"] / ce["tau_sampled"]) / 2
    return sorted((n for n in rows if n != "ce" and not is_head(n)), key=lambda n: -score(rows[n]))[:count]


def over_seeds(runs: list[dict]) -> dict:
    """One row from its runs at several seeds: every number the mean, plus spread_<tau> = max - min of each tau."""
    merged = dict(runs[0])
    for key, value in runs[0].items():
        values = [r.get(key) for r in runs]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and None not in values:
            merged[key] = statistics.fmean(values)
    for mode in ("greedy", "sampled"):
        merged[f"spread_tau_{mode}"] = max(r[f"tau_{mode}"] for r in runs) - min(r[f"tau_{mode}"] for r in runs) \
            if len(runs) > 1 else None
    merged["seeds"] = len(runs)
    return merged


# ---------------------------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------------------------

COLUMNS = ("row", "seeds", "tf_acceptance", "greedy_agreement", "tau_greedy", "x CE", "tau_sampled", "x CE",
           "speedup greedy", "speedup sampled", "train tokens/s", "train wall s")


def _num(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _tau(r: dict, mode: str) -> str:
    """'2.61' or, over two seeds, '2.61 ±0.04' (half the spread max - min)."""
    spread = r.get(f"spread_tau_{mode}")
    return _num(r[f"tau_{mode}"], ".2f") + ("" if spread is None else f" ±{spread / 2:.2f}")


def format_pair_table(rows: dict[str, dict]) -> str:
    """Markdown table of one pair's rows (each the mean over its seeds, over_seeds); tau columns also as a
    multiple of the ce row's."""
    ce = rows.get("ce", {})
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for name, r in rows.items():
        ratio = {m: r[f"tau_{m}"] / ce[f"tau_{m}"] if ce.get(f"tau_{m}") else None for m in ("greedy", "sampled")}
        cells = [f"`{name}`", str(r.get("seeds", 1)), _num(r["tf_acceptance"], ".3f"),
                 _num(r["greedy_agreement"], ".3f"), _tau(r, "greedy"), _num(ratio["greedy"], ".2f") + "x",
                 _tau(r, "sampled"), _num(ratio["sampled"], ".2f") + "x", _num(r["speedup_greedy"], ".2f") + "x",
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
    """Markdown lines naming the best standalone row per decoding mode (highest mean tau / tau_ce over the pairs),
    and the best head row."""
    lines = ["## Winner per decoding mode", ""]
    for mode, kind in (("greedy", "standalone"), ("sampled", "standalone"), ("greedy", "head"), ("sampled", "head")):
        ratios = {n: r for n, r in ratios_to_ce(results, mode).items() if is_head(n) == (kind == "head")}
        if not ratios:
            continue
        best = max(ratios, key=lambda n: sum(ratios[n]) / len(ratios[n]))
        shown = ", ".join(f"{v:.2f}x" for v in ratios[best])
        spreads = [rows[best].get(f"spread_tau_{mode}") for rows in results.values() if best in rows]
        spread = "" if None in spreads else "; seed spread of its tau (max - min) " + ", ".join(
            f"{v:.2f}" for v in spreads)
        lines.append(f"- {mode} (gamma 4), {kind}: **`{best}`**, mean_accepted_tokens {shown} the CE draft's "
                     f"(pairs {', '.join(results)}){spread}")
    return lines + [""]


def target_lines(target: dict) -> list[str]:
    """How the pair's target was trained: rounds, steps, convergence, training and held-out CE."""
    rounds = target["rounds"]
    if not rounds:
        return ["Target: not trained yet.", ""]
    last = rounds[-1]
    stop = "held-out CE improved by < 1% over the last fifth of its steps" if target["converged"] else \
        "**not converged**: stopped at target_max_rounds"
    per_round = ", ".join(f"{r['heldout_ce']:.3f}" for r in rounds)
    train_ce = "-" if last["train_ce"] is None else f"{last['train_ce']:.2f}"
    return [f"Target: {len(rounds)} rounds, {last['steps']} steps of cross-entropy ({stop}); last logged training "
            f"CE {train_ce}, held-out CE {last['heldout_ce']:.2f} nats/token (ln 4096 = 8.32); "
            f"held-out CE after each round: {per_round}.", ""]


def budget_line(sizes: Sizes) -> str:
    tokens = sizes.draft_steps * sizes.draft_batch * sizes.max_length
    return (f"Budget per row: {sizes.draft_steps} optimizer steps x {sizes.draft_batch} rows x {sizes.max_length} "
            f"tokens = {tokens:,} training tokens (same data, optimiser and seed for every row; its wall time is "
            f"the last column); measured on {sizes.num_prompts} held-out prompts x {sizes.max_new_tokens} new "
            f"tokens at gamma 4, greedy and at temperature 1, and teacher-forced on {sizes.heldout_blocks} x "
            f"{sizes.max_length} held-out tokens. Rows with seeds = 2 were trained and measured again with seed "
            f"{SEEDS[1]} (draft init, data order, sampling): tau is the mean, ± half the spread (max - min).")
