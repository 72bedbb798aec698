"""OUTPUT_DIR/acceptance.jsonl: the one reader and writer of the acceptance measured at each checkpoint, and the one
rule that picks the best (checkpoint, gamma) from its rows (used by the export, the protection of the best
checkpoint from rotation, the model card and the report).

One JSON object per line, `{"step", "checkpoint", <decode.measure.evaluate result keys>}`, one line per (gamma,
temperature) of a measurement (docs/reference/interfaces.md). A process killed at any moment leaves a usable file:
- append_records writes all the lines of one measurement with a single write() on a file opened O_APPEND, so a
  kill leaves either all of them or none (or, on a crash of the machine, a torn last line);
- read_records drops a torn last line (no newline, not JSON) with a warning; what it dropped is measured again;
- rewrite_records replaces the whole file through a temporary file and a rename.
A malformed line elsewhere is not a torn write: it raises AcceptanceLogError naming file and line.

The best checkpoint. Why not the measured wall-clock speedup: on a shared machine it is mostly noise, so two
identical runs would export different checkpoints. What ranks instead is the cost-model speedup (Leviathan et al.)

    speedup(checkpoint, gamma) = tau / (gamma * c + v)

with tau = mean_accepted_tokens measured at that checkpoint (deterministic under greedy decoding) and the cost
ratios c = draft step / target step, v = target verify pass over gamma + 1 tokens / target step, which belong to the
two architectures and the hardware, not to a checkpoint: AcceptanceCallback measures them once per run (many
repeats, median) and every row of the run carries them (`draft_cost_ratio`, `verify_cost_ratio`). Within one run
the checkpoint chosen for a gamma therefore depends on tau alone. The measured `speedup` stays in each row.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from decode.inputs.checks import read_text
from decode.inputs.writes import write_atomic
from decode.loop.auto_gamma import ResolvedGamma, resolve_gamma
from decode.loop.speedup import CostRatios
from distill.utils import no_space, out_of_space

logger = logging.getLogger(__name__)

ACCEPTANCE_LOG = "acceptance.jsonl"


class AcceptanceLogError(ValueError):
    """acceptance.jsonl holds a line that is neither a record nor a torn last line; the message names file:line."""


def log_path(location: str | Path) -> Path:
    """OUTPUT_DIR/acceptance.jsonl for an output folder, or the path itself when it names a file."""
    location = Path(location)
    return location / ACCEPTANCE_LOG if location.is_dir() or location.suffix != ".jsonl" else location


def read_records(location: str | Path, required: bool = False) -> list[dict]:
    """The records of acceptance.jsonl in `location` (an output folder or the file); [] if there is none (with
    `required`: FileNotFoundError naming the file).

    A torn last line is dropped (logged); any other line that is not a JSON object with an integer "step" raises
    AcceptanceLogError naming file and line.
    """
    path = log_path(location)
    if not path.is_file():
        if required:
            raise FileNotFoundError(f"acceptance log {path} does not exist")
        return []
    text = read_text(path, "acceptance log")
    lines = text.split("\n")  # the last item is "" when the file ends with a newline, else a torn line
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        torn = number == len(lines)  # text after the last newline: the write did not finish
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if torn:
                logger.warning("%s:%d: dropped a torn last line (an interrupted write); it is measured again",
                               path, number)
                break
            raise AcceptanceLogError(f"{path}:{number}: not valid JSON ({err.msg}); delete or fix that line") \
                from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise AcceptanceLogError(f"{path}:{number} has no integer 'step' (expected a row written by the trainer)")
        records.append(record)
    return records


def _encode(records: Iterable[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode("utf-8")


def append_records(location: str | Path, records: Sequence[dict]) -> None:
    """Append the lines of one measurement in a single write() (all of them or none survive a kill)."""
    path = log_path(location)
    data = _encode(records)
    if not data:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        _drop_torn_tail(fd, path)
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            while written < len(data):  # only on a full disk or a signal; the rest still goes on at the end
                written += os.write(fd, data[written:])
        except OSError as err:
            if not out_of_space(err):
                raise
            os.ftruncate(fd, size)  # none of this measurement's lines: the resumed run measures it again
            raise no_space(path, "the acceptance log", "its earlier lines and every checkpoint are intact; free "
                           "space, then continue with train.resume_from_checkpoint=true", len(data)) from None
    finally:
        os.close(fd)


def _drop_torn_tail(fd: int, path: Path) -> None:
    """Cut a torn last line off before appending, so that it never ends up in the middle of the file."""
    size = os.fstat(fd).st_size
    if size == 0:
        return
    content = path.read_bytes()
    if not content.endswith(b"\n"):
        os.ftruncate(fd, content.rfind(b"\n") + 1)


def rewrite_records(location: str | Path, records: Sequence[dict]) -> None:
    """Replace acceptance.jsonl with `records` (a temporary file renamed over it: old or new, never half)."""
    write_atomic(log_path(location), _encode(records))


def complete_steps(records: Sequence[dict], gammas: Sequence[int], temperatures: Sequence[float]) -> set[int]:
    """Steps whose records cover every (gamma, temperature) pair asked for: their measurement finished."""
    wanted = {(g, float(t)) for g in gammas for t in temperatures}
    seen: dict[int, set] = {}
    for r in records:
        seen.setdefault(r["step"], set()).add((r.get("gamma"), float(r.get("temperature", -1))))
    return {step for step, pairs in seen.items() if wanted <= pairs}


@dataclass(frozen=True)
class CheckpointChoice:
    """The best (checkpoint, gamma) of a run and the acceptance.jsonl row it was chosen from."""

    step: int | None
    checkpoint: str | None
    gamma: int
    temperature: float
    cost_model_speedup: float | None
    row: dict


def row_gamma(row: dict) -> ResolvedGamma:
    """What a row's gamma setting stands for (decode.loop.auto_gamma.resolve_gamma; "auto" rows carry mean_gamma)."""
    return resolve_gamma(row["gamma"], row.get("mean_gamma"))


def cost_model_speedup(row: dict) -> float | None:
    """tau / (gamma * c + v) from the row's mean_accepted_tokens and cost ratios; None without cost ratios."""
    c, v = row.get("draft_cost_ratio"), row.get("verify_cost_ratio")
    if c is None or v is None:
        return None
    costs, gamma = CostRatios(c, v), row_gamma(row).cost_model
    return costs.predicted_speedup(row["mean_accepted_tokens"], gamma) if costs.step_cost(gamma) > 0 else None


def _rank(row: dict) -> tuple:
    """Higher is better: cost-model speedup (rows without cost ratios: tau alone), then tau, then the smaller
    gamma, then the earlier step (the same model with fewer updates)."""
    speedup = cost_model_speedup(row)
    return (round(speedup, 9) if speedup is not None else float("-inf"), round(row["mean_accepted_tokens"], 9),
            -row_gamma(row).deployed, -(row.get("step") or 0))


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
    return CheckpointChoice(step=best.get("step"), checkpoint=best.get("checkpoint"), gamma=row_gamma(best).deployed,
                            temperature=float(best.get("temperature", 0.0)),
                            cost_model_speedup=cost_model_speedup(best), row=best)
