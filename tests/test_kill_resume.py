"""kill -9 at a checkpoint save and at an acceptance measurement, then resume: the same weights, bit for bit, and
the complete acceptance log; resuming a finished run trains nothing.

The kill is exact, not a race: SPECDISTILL_KILL_AT=point:K makes the run SIGKILL itself the K-th time it reaches
`point` (distill.outputs.checkpoints.crash_point). Killed runs are real processes; the reference and the resumes run in
this process (one thread everywhere, so the arithmetic is the same).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from distill.outputs.acceptance_log import read_records
from distill.outputs.checkpoints import KILL_ENV, PARTIAL_DIR
from distill.run.trainer import DistillTrainer

from helpers import TINY_RECIPE, run_train
from tiny import TINY_TEXT, save_and_load, tiny_model, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
RUN = ("train.max_steps=12", "train.save_steps=4", "train.save_total_limit=null", "train.logging_steps=4",
       "train.report_to=[]", "data.num_eval_prompts=2", "eval.gammas=[2]", "eval.max_new_tokens=8")
STEPS = (4, 8, 12)
# what a measurement yields that does not depend on wall-clock time
MEASURED = ("step", "checkpoint", "gamma", "temperature", "acceptance_rate", "mean_accepted_tokens",
            "per_position_acceptance", "greedy_match", "num_prompts", "new_tokens")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("kill")
    tok = tiny_tokenizer()
    save_and_load(tiny_model("llama", vocab_size=len(tok), hidden=32, layers=2), root / "target", tok)
    (root / "code.txt").write_text(TINY_TEXT)
    return root


@pytest.fixture(scope="module")
def reference(workdir) -> Path:
    """The uninterrupted run."""
    return run_train(workdir, "reference", *RUN)


def killed_run(workdir: Path, out: str, point: str) -> Path:
    """A real run that SIGKILLs itself at `point` (name:K); returns its output folder."""
    env = {**os.environ, KILL_ENV: point, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, str(ROOT / "scripts" / "train.py"), TINY_RECIPE, f"model.target={workdir / 'target'}",
               f"data.dataset={workdir / 'code.txt'}", f"train.output_dir={workdir / out}", *RUN]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    return workdir / out


def measured(folder: Path) -> list[tuple]:
    return sorted(tuple(json.dumps(r.get(k)) for k in MEASURED) for r in read_records(folder))


def assert_same_run(resumed: Path, reference: Path) -> None:
    for step in STEPS:
        ours, theirs = (load_file(f / f"checkpoint-{step}" / "model.safetensors") for f in (resumed, reference))
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours), step
    assert measured(resumed) == measured(reference)  # every checkpoint measured once, the same numbers
    assert {r["step"] for r in read_records(resumed)} == set(STEPS)
    best = json.loads((resumed / "train_results.json").read_text())["best"]
    exported, saved = load_file(resumed / "model.safetensors"), load_file(resumed / best["checkpoint"] /
                                                                          "model.safetensors")
    assert all(torch.equal(exported[k], saved[k]) for k in saved)
    assert not (resumed / PARTIAL_DIR).exists() or not any((resumed / PARTIAL_DIR).iterdir())


@pytest.mark.integration
def test_killed_while_saving_a_checkpoint_resumes_to_the_same_run(workdir, reference):
    out = killed_run(workdir, "killed_saving", "checkpoint-save:2")  # step 8 written, not yet renamed
    assert not (out / "checkpoint-8").exists() and (out / PARTIAL_DIR / "checkpoint-8").is_dir()
    assert {r["step"] for r in read_records(out)} == {4}
    run_train(workdir, "killed_saving", *RUN, "train.resume_from_checkpoint=true")
    assert_same_run(out, reference)


@pytest.mark.integration
def test_killed_while_measuring_resumes_and_measures_what_is_missing(workdir, reference, monkeypatch):
    out = killed_run(workdir, "killed_measuring", "acceptance:2")  # checkpoint-8 saved, its lines not written
    assert (out / "checkpoint-8" / "trainer_state.json").is_file()
    assert {r["step"] for r in read_records(out)} == {4}
    with open(out / "acceptance.jsonl", "a") as log:  # and a torn line, as a crash mid-write leaves
        log.write('{"step": 8, "checkpoint": "checkpoint-8", "gamma": 2, "accep')
    trained = []
    original = DistillTrainer.compute_loss
    monkeypatch.setattr(DistillTrainer, "compute_loss",
                        lambda self, *a, **k: trained.append(self.state.global_step) or original(self, *a, **k))
    run_train(workdir, "killed_measuring", *RUN, "train.resume_from_checkpoint=true")
    assert trained == [8, 9, 10, 11]  # only the steps after the checkpoint
    assert_same_run(out, reference)


@pytest.mark.integration
def test_resuming_a_finished_run_trains_nothing(workdir, reference, monkeypatch, capsys):
    monkeypatch.setattr(DistillTrainer, "train", lambda *a, **k: pytest.fail("a finished run was trained again"))
    before = {p: p.stat().st_mtime_ns for p in reference.rglob("*")}
    run_train(workdir, "reference", *RUN, "train.resume_from_checkpoint=true")
    assert "nothing to do" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in reference.rglob("*")} == before  # not a file touched
    # killed while measuring the last checkpoint: measured and exported on resume, still no step trained
    cut = workdir / "cut"
    cut.mkdir()
    for item in reference.iterdir():
        if item.name.startswith("checkpoint-"):
            (cut / item.name).symlink_to(item)  # read-only use: the checkpoints themselves are not rewritten
    (cut / "recipe.yaml").write_text((reference / "recipe.yaml").read_text())
    kept = [r for r in read_records(reference) if r["step"] != 12]
    (cut / "acceptance.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    run_train(workdir, "cut", *RUN, "train.resume_from_checkpoint=true")
    assert measured(cut) == measured(reference)
    assert not (cut / "checkpoint-13").exists() and (cut / "train_results.json").is_file()


# ---------------------------------------------------------------------------------------------------------------
# The pieces, fast: acceptance.jsonl, complete checkpoints, used output folders
# ---------------------------------------------------------------------------------------------------------------

def record(step: int, gamma: int, temperature: float = 0.0) -> dict:
    return {"step": step, "checkpoint": f"checkpoint-{step}", "gamma": gamma, "temperature": temperature,
            "acceptance_rate": 0.5}


def test_acceptance_log_drops_a_torn_last_line_and_appends_after_it(tmp_path, caplog):
    from distill.outputs.acceptance_log import append_records, complete_steps, rewrite_records

    append_records(tmp_path, [record(4, 1), record(4, 2)])
    with open(tmp_path / "acceptance.jsonl", "a") as log:
        log.write('{"step": 8, "gamma"')  # killed mid-write
    assert [r["step"] for r in read_records(tmp_path)] == [4, 4]
    assert "torn last line" in caplog.text
    append_records(tmp_path, [record(8, 1)])  # the torn tail is cut off first, never left mid-file
    assert (tmp_path / "acceptance.jsonl").read_text().count("\n") == 3
    assert [r["step"] for r in read_records(tmp_path)] == [4, 4, 8]
    assert complete_steps(read_records(tmp_path), gammas=[1, 2], temperatures=[0.0]) == {4}  # 8 lacks gamma 2
    rewrite_records(tmp_path, [record(4, 1)])
    assert read_records(tmp_path) == [record(4, 1)] and not list(tmp_path.glob("*.tmp"))


def test_acceptance_log_names_a_corrupt_line_in_the_middle(tmp_path):
    from distill.outputs.acceptance_log import AcceptanceLogError

    (tmp_path / "acceptance.jsonl").write_text('{"step": 4}\n{oops\n{"step": 8}\n')
    with pytest.raises(AcceptanceLogError, match=r"acceptance.jsonl:2: not valid JSON"):
        read_records(tmp_path)
    (tmp_path / "acceptance.jsonl").write_text('{"step": "four"}\n')
    with pytest.raises(AcceptanceLogError, match=r"acceptance.jsonl:1 has no integer 'step'"):
        read_records(tmp_path)


def test_resume_picks_the_latest_complete_checkpoint(tmp_path, caplog):
    from distill.outputs.checkpoints import find_checkpoints

    for step in (4, 8, 12):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-4" / "trainer_state.json").write_text('{"global_step": 4}')
    (tmp_path / "checkpoint-8" / "trainer_state.json").write_text('{"global_step": 8}')
    (tmp_path / "checkpoint-12" / "trainer_state.json").write_text('{"global_st')  # torn
    (tmp_path / PARTIAL_DIR / "checkpoint-16").mkdir(parents=True)
    found = find_checkpoints(tmp_path)
    assert found.latest == tmp_path / "checkpoint-8"
    assert found.incomplete == [tmp_path / "checkpoint-12", tmp_path / PARTIAL_DIR]


def test_a_used_output_folder_is_refused_and_overwrite_replaces_it(workdir, capsys):
    from specdistill.recipes import RecipeError

    out = run_train(workdir, "used", "train.max_steps=2", "train.save_steps=2", "data.num_eval_prompts=0",
                    "train.report_to=[]")
    (out / "acceptance.jsonl").write_text(json.dumps(record(99, 1)) + "\n")  # a mark of the first run
    with pytest.raises(RecipeError, match="already holds a run .* train.resume_from_checkpoint=true, replace it "
                                          "with train.overwrite_output_dir=true"):
        run_train(workdir, "used", "train.max_steps=2", "data.num_eval_prompts=0", "train.report_to=[]")
    assert read_records(out) == [record(99, 1)]  # nothing was touched
    run_train(workdir, "used", "train.max_steps=2", "train.save_steps=2", "data.num_eval_prompts=0",
              "train.report_to=[]", "train.overwrite_output_dir=true")
    assert read_records(out) == [] and (out / "checkpoint-2" / "trainer_state.json").is_file()


def test_a_resume_that_learns_otherwise_is_said_in_one_warning(workdir, caplog, monkeypatch):
    """Resuming with another dataset (or loss, target...) than the run started with goes on, with one warning naming
    each key that differs from the run's recipe.yaml; the same values (a path given relative or absolute alike) and
    a longer train.max_steps say nothing."""
    def warnings() -> list[str]:  # the run's INFO lines may reach caplog too, as the suite's earlier tests leave it
        return [r.getMessage() for r in caplog.records
                if r.name == "distill.run.preflight" and r.levelname == "WARNING"]

    (workdir / "other.txt").write_text(TINY_TEXT)
    quick = ("train.save_steps=2", "data.num_eval_prompts=0", "train.report_to=[]")
    out = run_train(workdir, "changed", "train.max_steps=2", *quick)
    monkeypatch.chdir(workdir)
    with caplog.at_level("WARNING", logger="distill.run.preflight"):
        run_train(workdir, "changed", "train.max_steps=4", *quick, "train.resume_from_checkpoint=true",
                  "data.dataset=code.txt")  # the same file, relative
    assert not warnings()
    with caplog.at_level("WARNING", logger="distill.run.preflight"):
        run_train(workdir, "changed", "train.max_steps=6", *quick, "train.resume_from_checkpoint=true",
                  f"data.dataset={workdir / 'other.txt'}", "distill.loss=forward_kl")
    (warning,) = warnings()
    assert warning.startswith(f"resuming from {out / 'checkpoint-4'} with a recipe that differs from the one the "
                              f"run started with ({out / 'recipe.yaml'}): ")
    assert f"data.dataset: code.txt -> {workdir / 'other.txt'}" in warning  # recipe.yaml: the resume's values
    assert "distill.loss: " in warning and "-> forward_kl" in warning
    assert (out / "checkpoint-6").is_dir()
