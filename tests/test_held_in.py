"""Held-in beside held-out (issue 66): the trainer measures acceptance on a sample of its own training prompts next to
the held-out prompts, records both and warns in one line when held-out acceptance falls below a fraction of held-in."""
from __future__ import annotations

import logging

import datasets
import pytest
import torch
from transformers import TrainerControl, TrainerState, TrainingArguments

from decode.loop.speedup import CostRatios
from decode.measure.evaluate import acceptance_only
from decode.measure.settings import EvalSettings
from distill.data.rows import held_in_prompts
from distill.outputs.acceptance_log import read_records
from distill.publish.model_card import held_in_section
from distill.run.callbacks import AcceptanceCallback, held_in_gap, with_held_in
from distill.utils import IGNORE_INDEX
from kinds import STANDALONE
from specdistill.drafts import evaluate_acceptance
from specdistill.recipes import EvalConfig

from tiny import perturbed_copy, tiny_model

X = IGNORE_INDEX  # a position not trained


def test_held_in_prompts_are_what_the_rows_trained_after():
    """A conversation's prompt is its tokens before the first trained label (the last max_tokens of them); a packed
    text row, trained from its first token, gives its first max_tokens tokens; a row of one token gives none."""
    rows = datasets.Dataset.from_dict({
        "input_ids": [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14], [20]],
        "labels": [[X, X, X, X, 9, 10], [11, 12, 13, 14], [20]],
        "hidden": [[0.0], [0.0], [0.0]],  # a cached column rides along, unread
    })
    prompts = held_in_prompts(rows, count=3, max_tokens=3, seed=0)
    assert sorted(p.tolist() for p in prompts) == [[6, 7, 8], [11, 12, 13]]
    assert [p.tolist() for p in held_in_prompts(rows, 3, 3, seed=0)] == [p.tolist() for p in prompts]  # seeded
    assert len(held_in_prompts(rows, count=1, max_tokens=3)) == 1
    assert held_in_prompts(rows, count=0, max_tokens=3) == []


def test_acceptance_only_is_the_evaluations_acceptance_on_the_same_prompts():
    """Greedy and sampled: acceptance alone equals what evaluate_acceptance counts on the same prompts and seeds."""
    target = tiny_model("llama")
    draft = perturbed_copy(target, 0.3)
    prompts = [torch.tensor([1, 5, 9, 3]), torch.tensor([2, 8, 4, 4, 7])]
    for temperature in (0.0, 1.0):
        settings = EvalSettings(gammas=[1, 3], temperature=temperature, max_new_tokens=12, seed=4, warmup=False)
        full = evaluate_acceptance(target, draft, prompts, settings, progress=False)
        alone = acceptance_only(target, draft, prompts, settings, kind=STANDALONE)
        for f, a in zip(full, alone, strict=True):
            assert (a["gamma"], a["temperature"], a["num_prompts"]) == (f["gamma"], temperature, 2)
            assert a["acceptance_rate"] == pytest.approx(f["acceptance_rate"])
            assert a["mean_accepted_tokens"] == pytest.approx(f["mean_accepted_tokens"])
    assert 0 < alone[0]["acceptance_rate"] < 1  # a draft that disagrees sometimes: the counts are not trivial


def test_held_in_numbers_join_their_records_and_a_gap_warns():
    records = [{"step": 4, "gamma": 2, "temperature": 0.0, "acceptance_rate": 0.2, "mean_accepted_tokens": 1.3},
               {"step": 4, "gamma": 4, "temperature": 0.0, "acceptance_rate": 0.3, "mean_accepted_tokens": 1.5}]
    held_in = [{"gamma": 2, "temperature": 0.0, "acceptance_rate": 0.6, "mean_accepted_tokens": 2.1}]
    joined = with_held_in(records, held_in)
    assert joined[0]["held_in_acceptance_rate"] == 0.6 and joined[0]["held_in_mean_accepted_tokens"] == 2.1
    assert "held_in_acceptance_rate" not in joined[1]  # no held-in row at gamma 4: the record as it was
    warning = held_in_gap(joined[0], 0.5)
    assert warning.startswith("step 4 gamma 2 temperature 0: held-out acceptance 0.200 is 0.33 of held-in 0.600")
    assert held_in_gap(joined[0], 0.3) is None  # 0.2 >= 0.3 * 0.6
    assert held_in_gap(joined[0], 0.0) is None and held_in_gap(joined[1], 0.5) is None


class Fixed:
    """An evaluation that returns fixed acceptance (the held-out evaluation, or the held-in one)."""

    def __init__(self, acceptance: float):
        self.acceptance, self.prompts = acceptance, []

    def __call__(self, target, draft, prompts, settings, progress=True, cost_ratios=None, **kwargs):
        self.prompts.append(len(prompts))
        return [{"gamma": g, "temperature": settings.temperature, "acceptance_rate": self.acceptance,
                 "mean_accepted_tokens": 1 + self.acceptance, "speedup": 1.0} for g in settings.gammas]


@pytest.mark.parametrize("held_out, warned", [(0.1, True), (0.4, False)])
def test_the_callback_records_held_in_beside_held_out_and_warns_on_a_gap(tmp_path, monkeypatch, caplog, held_out,
                                                                         warned):
    import distill.run.callbacks as callbacks

    monkeypatch.setattr(callbacks, "measure_cost_ratios", lambda *args, **kwargs: CostRatios(0.1, 1.0))
    held_in = Fixed(0.5)
    callback = AcceptanceCallback(target=tiny_model("llama"), prompts=[torch.tensor([1, 2, 3])],
                                  cfg=EvalConfig(gammas=[2], held_in_warning=0.5), kind=STANDALONE,
                                  evaluate=Fixed(held_out), tensorboard=False,
                                  held_in=[torch.tensor([4, 5]), torch.tensor([6, 7])], acceptance=held_in)
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    state = TrainerState(global_step=3, max_steps=3, is_world_process_zero=True)
    with caplog.at_level(logging.WARNING, logger="distill.run.callbacks"):
        callback.on_save(args, state, TrainerControl(), model=tiny_model("llama", layers=1))
    [record] = read_records(tmp_path)
    assert (record["acceptance_rate"], record["held_in_acceptance_rate"]) == (held_out, 0.5)
    assert record["held_in_mean_accepted_tokens"] == 1.5 and held_in.prompts == [2]
    gaps = [r.message for r in caplog.records if "held-in" in r.message]
    assert len(gaps) == (1 if warned else 0)
    card = held_in_section([record])
    assert "## Held-in and held-out acceptance" in card and "0.500" in card


def test_no_held_in_prompts_leave_the_records_as_they_were(tmp_path, monkeypatch):
    import distill.run.callbacks as callbacks

    monkeypatch.setattr(callbacks, "measure_cost_ratios", lambda *args, **kwargs: CostRatios(0.1, 1.0))
    callback = AcceptanceCallback(target=tiny_model("llama"), prompts=[torch.tensor([1, 2, 3])],
                                  cfg=EvalConfig(gammas=[2]), kind=STANDALONE, evaluate=Fixed(0.3), tensorboard=False)
    [record] = callback.measure(tiny_model("llama", layers=1))
    assert not any(key.startswith("held_in") for key in record)
    assert held_in_section([record]) == ""
