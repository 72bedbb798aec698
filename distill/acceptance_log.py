"""The rows of OUTPUT_DIR/acceptance.jsonl, and the one rule that picks the best (checkpoint, gamma) from them.

The rule is used by the export (scripts/train.py), the protection of the best checkpoint from rotation
(distill/callbacks.py), the model card (distill/hub.py) and the report (distill/report.py).

Why not the measured wall-clock speedup: on a shared machine it is mostly noise, so two identical runs would export
different checkpoints. What ranks instead is the cost-model speedup (Leviathan et al.)

    speedup(checkpoint, gamma) = tau / (gamma * c + v)

with tau = mean_accepted_tokens measured at that checkpoint (deterministic under greedy decoding) and the cost
ratios c = draft step / target step, v = target verify pass over gamma + 1 tokens / target step, which belong to the
two architectures and the hardware, not to a checkpoint: AcceptanceCallback measures them once per run (many
repeats, median) and every row of the run carries them (`draft_cost_ratio`, `verify_cost_ratio`). Within one run
the checkpoint chosen for a gamma therefore depends on tau alone. The measured `speedup` stays in each row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class CheckpointChoice:
    """The best (checkpoint, gamma) of a run and the acceptance.jsonl row it was chosen from."""

    step: int | None
    checkpoint: str | None
    gamma: int
    temperature: float
    cost_model_speedup: float | None
    row: dict


def cost_model_speedup(row: dict) -> float | None:
    """tau / (gamma * c + v) from the row's mean_accepted_tokens and cost ratios; None without cost ratios."""
    c, v = row.get("draft_cost_ratio"), row.get("verify_cost_ratio")
    if c is None or v is None or gamma_of(row) * c + v <= 0:
        return None
    # speedup = tau / (gamma * c + v)
    return row["mean_accepted_tokens"] / (gamma_of(row) * c + v)


def gamma_of(row: dict) -> int:
    return int(row["gamma"])


def _rank(row: dict) -> tuple:
    """Higher is better: cost-model speedup (rows without cost ratios: tau alone), then tau, then the smaller
    gamma, then the earlier step (the same model with fewer updates)."""
    speedup = cost_model_speedup(row)
    return (round(speedup, 9) if speedup is not None else float("-inf"), round(row["mean_accepted_tokens"], 9),
            -gamma_of(row), -(row.get("step") or 0))


def best_checkpoint(rows: Sequence[dict], temperature: float | None = None) -> CheckpointChoice | None:
    """The row with the highest cost-model speedup among `rows` at `temperature` (None: the lowest temperature
    logged), with its step, checkpoint and gamma; None when no row is at that temperature.

    `rows`: acceptance.jsonl rows, or an eval_acceptance JSON's results (no step or checkpoint: those are None).
    Ties, and rows without cost ratios, are ranked by mean_accepted_tokens, then the smaller gamma, then the
    earlier step."""
    rows = [r for r in rows if r.get("gamma") is not None and r.get("mean_accepted_tokens") is not None]
    if temperature is None and rows:
        temperature = min(float(r.get("temperature", 0.0)) for r in rows)
    candidates = [r for r in rows if float(r.get("temperature", 0.0)) == temperature]
    if not candidates:
        return None
    best = max(candidates, key=_rank)
    return CheckpointChoice(step=best.get("step"), checkpoint=best.get("checkpoint"), gamma=gamma_of(best),
                            temperature=float(best.get("temperature", 0.0)),
                            cost_model_speedup=cost_model_speedup(best), row=best)
