"""scripts/bench_heads.py: every row trains with the same data, steps and optimiser as the others (the rows differ
only where their names say), head overrides never override a row's own ttt_steps, and the tables are built from
what earlier runs left in --out without running anything again, and a row is reused only when it was trained
with the settings asked for."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from distill.recipe.loader import save_recipe
from scripts import bench_heads, benchmark
from specdistill.recipes import load_recipe

ROOT = Path(__file__).resolve().parents[1]


def trained_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, row: str, head_overrides: list[str],
                 overrides: tuple[str, ...] = (), extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The scripts/train.py command line bench_heads runs for `row`."""
    commands = []
    monkeypatch.setattr(bench_heads, "run", lambda cmd, check=True: commands.append(cmd))
    args = bench_heads.parse_args(["--target", str(tmp_path / "target"), "--dataset", str(tmp_path / "corpus.txt"),
                                   "--eval-prompts", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "out"),
                                   "--steps", "12", "--batch", "3", "--head-overrides", *head_overrides,
                                   "--overrides", *overrides, *extra])
    assert bench_heads.train(args, row) == tmp_path / "out" / row
    *first, command = commands  # a row that starts from another row's draft trains that row first
    starts_from = bench_heads.STARTS_FROM.get(row)
    assert [c[2] for c in first] == ([str(bench_heads.RECIPES / bench_heads.ROWS[starts_from][0])] if starts_from
                                     else [])
    return command


def recipe_of(command: list[str]):
    return load_recipe(command[2], command[3:])


def test_rows_share_data_steps_and_optimiser(tmp_path, monkeypatch):
    recipes = {row: recipe_of(trained_with(tmp_path, monkeypatch, row, ["model.aux_layers=[1,3,5]"]))
               for row in bench_heads.ROWS}
    base = recipes["ce"]
    for row, recipe in recipes.items():
        assert recipe.train.max_steps == 12 and recipe.train.per_device_train_batch_size == 3, row
        # packed text trains on every token whatever data.loss_tokens says (a head's default is all, a draft's not)
        assert recipe.data.format == "text", row
        assert recipe.train.learning_rate > 0 and recipe.data.model_copy(update={"loss_tokens": "all"}) == \
            base.data.model_copy(update={"loss_tokens": "all"}), row
    assert recipes["distilled"].distill.loss == "lk_hybrid" and recipes["distilled_forward_kl"].distill.loss == \
        "forward_kl"
    assert recipes["distilled"].model == recipes["distilled_forward_kl"].model == base.model
    optimiser = {row: recipe.train.model_dump(exclude={"output_dir"}) for row, recipe in recipes.items()}
    assert optimiser["distilled"] == optimiser["distilled_forward_kl"] == optimiser["ce"]
    assert {row: recipes[row].distill.ttt_steps for row in ("head", "head_ttt")} == {"head": 1, "head_ttt": 4}
    assert all(recipes[row].model.aux_layers == [1, 3, 5] for row in ("head", "head_ttt", "p_eagle_head"))
    assert base.model.aux_layers is None  # head overrides reach the head rows only
    # the one-forward rows are their sequential twins drafting in parallel: the same model, loss and optimiser
    pard = recipes["pard_draft"]
    assert pard.model.draft_config == base.model.draft_config and pard.model.pard_gamma == 8
    assert recipes["pard_draft"].distill.loss == recipes["distilled"].distill.loss
    converted = recipes["pard_converted"]  # the trained distilled draft, converted with pard.yaml's own settings
    assert converted.model.draft == str(tmp_path / "out" / "distilled") and converted.model.draft_config is None
    assert optimiser["pard_converted"] == optimiser["pard_draft"] and converted.distill == recipes["pard_draft"].distill
    assert optimiser["pard_draft"] == optimiser["distilled"]
    assert optimiser["p_eagle_head"] == optimiser["head_ttt"] == optimiser["dflash_draft"]
    assert recipes["p_eagle_head"].distill.loss == recipes["head_ttt"].distill.loss \
        == recipes["dflash_draft"].distill.loss
    assert recipes["p_eagle_head"].model.draft_vocab_size == recipes["head_ttt"].model.draft_vocab_size
    assert recipes["p_eagle_head"].model.ptd_gamma == recipes["dflash_draft"].model.dflash_block_size - 1 == 8


def test_head_overrides_do_not_replace_the_rows_ttt_steps(tmp_path, monkeypatch):
    command = trained_with(tmp_path, monkeypatch, "head", ["distill.ttt_steps=6"])
    assert recipe_of(command).distill.ttt_steps == 1


def test_dflash_overrides_reach_the_dflash_draft_row_only(tmp_path, monkeypatch):
    args = ["--dflash-overrides", "model.dflash_target_layers=[0,2,4]"]
    dflash = recipe_of(trained_with(tmp_path, monkeypatch, "dflash_draft", [], extra=args))
    assert dflash.model.dflash_target_layers == [0, 2, 4]
    for row in ("head_ttt", "pard_draft"):  # a dflash key on another kind would be refused: it never gets there
        assert "model.dflash_target_layers=[0,2,4]" not in trained_with(tmp_path, monkeypatch, row, [], extra=args)


def test_one_forward_rows_are_measured_up_to_gamma_8(tmp_path, monkeypatch):
    commands = []
    monkeypatch.setattr(bench_heads, "run", lambda cmd, check=True: commands.append(cmd))
    args = bench_heads.parse_args(["--target", "t", "--dataset", "c.txt", "--eval-prompts", "p.jsonl",
                                   "--out", str(tmp_path)])
    for row in ("head_ttt", "pard_draft", "p_eagle_head", "dflash_draft", "distilled", "pard_converted"):
        with pytest.raises(SystemExit):  # the mocked run writes no JSON
            bench_heads.evaluate(args, row, tmp_path / row, 0.0, False)
    gammas = [cmd[cmd.index("--gamma") + 1:cmd.index("--temperature")] for cmd in commands]
    assert gammas == [list("23456"), list("2345678"), list("2345678"), list("2345678"), list("23456"), list("2345678")]


def test_overrides_reach_every_row_and_never_replace_what_defines_a_row(tmp_path, monkeypatch):
    overrides = ("train.warmup_steps=0.05", "distill.loss=tv")
    recipes = {row: recipe_of(trained_with(tmp_path, monkeypatch, row, [], overrides)) for row in bench_heads.ROWS}
    assert {row: recipe.train.warmup_steps for row, recipe in recipes.items()} == dict.fromkeys(recipes, 0.05)
    assert recipes["distilled_forward_kl"].distill.loss == "forward_kl"  # the row's own loss comes last
    assert recipes["distilled"].distill.loss == recipes["head_ttt"].distill.loss == "tv"


def test_a_row_is_reused_only_when_trained_with_the_same_settings(tmp_path, monkeypatch):
    command = trained_with(tmp_path, monkeypatch, "head_ttt", ["model.aux_layers=[1,3,5]"], ("train.seed=42",))
    row = tmp_path / "out" / "head_ttt"
    row.mkdir(parents=True)
    save_recipe(recipe_of(command), row / "recipe.yaml")  # what scripts/train.py leaves in a finished row
    (row / "train_results.json").write_text("{}")
    monkeypatch.setattr(bench_heads, "run", lambda cmd, check=True: pytest.fail(f"ran {cmd}"))

    def train_again(*overrides: str) -> Path:
        args = bench_heads.parse_args(["--target", str(tmp_path / "target"), "--dataset", str(tmp_path / "corpus.txt"),
                                       "--eval-prompts", str(tmp_path / "p.jsonl"), "--out", str(tmp_path / "out"),
                                       "--steps", "12", "--batch", "3", "--head-overrides", "model.aux_layers=[1,3,5]",
                                       "--overrides", *overrides])
        return bench_heads.train(args, "head_ttt")

    assert train_again("train.seed=42") == row  # the same settings: reused, nothing runs
    with pytest.raises(SystemExit, match=r"head_ttt holds a draft trained with other settings \(train\.seed: 42 "
                                         r"there, 43 now\): pass another --out"):
        train_again("train.seed=43")


def test_tables_are_built_from_earlier_results(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    monkeypatch.setattr(bench_heads, "run", lambda cmd, check=True: pytest.fail(f"ran {cmd}"))
    results = {"distilled": 2.5, "head_ttt": 3.75}
    for row, tau in results.items():
        (out / row).mkdir(parents=True)
        (out / row / "train_results.json").write_text("{}")
        for name in ("T0", "T1"):
            result = {"results": [{"gamma": g, "mean_accepted_tokens": tau, "acceptance_rate": 0.5,
                                   "draft_cost_ratio": 0.25, "speedup": 1.5, "predicted_speedup": 1.25,
                                   "per_position_acceptance": [0.6, 0.4]}
                                  for g in (2, 4)]}
            (out / "evals").mkdir(exist_ok=True)
            (out / "evals" / f"{row}_{name}.json").write_text(json.dumps(result))
    parity = [{"gamma": 4, "tau_specdistill": 3.75, "tau_vllm": 3.7, "ratio": 0.987, "greedy_match_vllm": 1.0}]
    (out / "evals" / "head_ttt_T0_both.json").write_text(json.dumps({"parity": parity}))
    doc = tmp_path / "heads.md"
    bench_heads.main(["--target", str(tmp_path / "target6"), "--dataset", "c.txt", "--eval-prompts", "p.jsonl",
                      "--out", str(out), "--rows", "distilled", "head_ttt", "--vllm", "--doc", str(doc)])
    text = doc.read_text()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    assert ["distilled", "T=0", "4", "2.50", "0.500", "0.60 / 0.40", "0.250", "1.50x", "1.25x", "-"] in cells
    assert ["head_ttt", "T=1", "2", "3.75", "0.500", "0.60 / 0.40", "0.250", "1.50x", "1.25x", "-"] in cells
    assert ["head_ttt", "4", "3.750", "3.700", "0.987", "1.0"] in cells  # inside vLLM
    assert len([row for row in cells if row[0] == "head_ttt"]) == 4 + 1  # T=0, T=1 at two gammas; the vLLM row
    assert "`target6`" in text and text in capsys.readouterr().out
    again = tmp_path / "again.md"  # from the record the run left in --out, nothing trained or measured
    monkeypatch.setattr(bench_heads, "evaluate", lambda *a, **k: pytest.fail("measured"))
    bench_heads.main(["--from-json", str(out / "bench_heads.json"), "--doc", str(again)])
    assert again.read_text() == text


def test_doc_replaces_only_the_marked_tables(tmp_path):
    """--doc on a page with the markers rewrites the tables between them and keeps the hand-written text around;
    a new file gets the tables alone; a page without the markers is refused before anything runs, unchanged."""
    begin, end = benchmark.doc_markers("bench_heads")
    assert begin == "<!-- BEGIN bench_heads (scripts/bench_heads.py --doc) -->" and end == "<!-- END bench_heads -->"
    assert begin in (ROOT / "docs/benchmarks/heads.md").read_text()  # the page the script writes into
    doc = tmp_path / "heads.md"
    doc.write_text(f"# Title\n\nsetup\n\n{begin}\nold table\n{end}\n\nnotes\n")
    benchmark.write_doc(doc, "new table\n", "bench_heads")
    assert doc.read_text() == f"# Title\n\nsetup\n\n{begin}\nnew table\n{end}\n\nnotes\n"
    benchmark.write_doc(doc, "newer table\n", "bench_heads")  # twice: the markers stay, one block between them
    assert doc.read_text().count(begin) == 1 and "newer table\n" in doc.read_text()
    assert "new table\n" not in doc.read_text()
    new = tmp_path / "new.md"
    benchmark.write_doc(new, "whole\n", "bench_heads")  # a new file: the tables alone
    assert new.read_text() == "whole\n"
    plain = tmp_path / "plain.md"
    plain.write_text("hand-written\n")
    trained = []
    with pytest.raises(SystemExit) as stopped:  # before any row trains
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(bench_heads, "train", lambda args, row: trained.append(row))
            bench_heads.main(["--target", "t", "--dataset", "d", "--eval-prompts", "p", "--out", str(tmp_path / "o"),
                              "--doc", str(plain)])
    message = str(stopped.value.code)
    assert message.startswith(f"bench_heads: --doc {plain} exists without") and "\n" not in message
    assert begin in message and end in message and not trained and not (tmp_path / "o").exists()
    assert plain.read_text() == "hand-written\n"


def test_new_arms_join_a_committed_record_and_replace_only_their_own_rows():
    """bench_heads_objectives --add-to: new arms are appended in order, a re-measured (arm, seed, T) replaces its row's
    results at the gammas it measured, and a record of another budget or machine is refused in one line."""
    from scripts.bench_heads_objectives import merged

    def run(arm, tau):
        return {"arm": arm, "seed": 0, "temperature": 0.0, "train_seconds": 1.0,
                "results": [{"gamma": 4, "mean_accepted_tokens": tau}]}

    shared = {"machine": "m", "budget": "eagle3.yaml", "data": "data", "num_prompts": 32, "max_new_tokens": 64,
              "seeds": [0]}
    earlier = {**shared, "load_average": "1", "more_seeds": ["ttt4=1"], "arms": {"recipe": [], "tv": ["t"]},
               "runs": [run("recipe", 1.3), run("tv", 1.2)]}
    new = {**shared, "load_average": "2", "more_seeds": [], "arms": {"recipe": [], "nla": ["n"]},
           "runs": [run("recipe", 1.35), run("nla", 1.4)]}
    got = merged(earlier, new)
    assert list(got["arms"]) == ["recipe", "tv", "nla"] and got["more_seeds"] == ["ttt4=1"]
    assert [(r["arm"], r["results"][0]["mean_accepted_tokens"]) for r in got["runs"]] == [
        ("recipe", 1.35), ("tv", 1.2), ("nla", 1.4)]
    with pytest.raises(SystemExit, match="budget"):
        merged(earlier, {**new, "budget": "eagle3_90min.yaml"})
    # another machine: its rows are labelled B beside A's, A's recipe row kept; the table shows a machine column
    other = merged(earlier, {**new, "machine": "m2"})
    assert other["machines"] == {"A": {"machine": "m", "load_average": "1"},
                                 "B": {"machine": "m2", "load_average": "2"}}
    assert [(r["machine"], r["arm"]) for r in other["runs"]] == [("A", "recipe"), ("A", "tv"), ("B", "recipe"),
                                                                  ("B", "nla")]
    from scripts.bench_heads_objectives import doc_text
    text = doc_text({**other, "runs": [{**r, "results": [{"gamma": 4, "mean_accepted_tokens": 1.3,
                                                          "acceptance_rate": 0.3, "speedup": 1.0}]}
                                       for r in other["runs"]]})
    assert text.startswith("Machine A: m; load average at the end 1.\nMachine B: m2;") and "| machine |" in \
        text.replace(" ", "").replace("|machine|", "| machine |")
    again = merged(other, {**new, "machine": "m2", "runs": [run("nla", 1.5)]})  # B re-measured: its row replaced
    assert [(r["machine"], r["arm"], r["results"][0]["mean_accepted_tokens"]) for r in again["runs"]][-1] == (
        "B", "nla", 1.5) and len(again["runs"]) == 4
    # all 96 held-out prompts beside 32: both rows kept, each with its count, and a prompts column in the table
    wider = merged(earlier, {**new, "num_prompts": 96, "runs": [run("recipe", 1.33)]})
    assert wider["num_prompts"] == [32, 96]
    assert [(r["arm"], r["num_prompts"], r["results"][0]["mean_accepted_tokens"]) for r in wider["runs"]] == [
        ("recipe", 32, 1.3), ("tv", 32, 1.2), ("recipe", 96, 1.33)]
    rows = doc_text({**wider, "runs": [{**r, "results": [{"gamma": 4, "mean_accepted_tokens": 1.3,
                                                          "acceptance_rate": 0.3, "speedup": 1.0}]}
                                       for r in wider["runs"]]})
    assert "32 or 96 (column `prompts`) held-out chat prompts" in rows and "prompts |" in rows
    assert merged(wider, {**new, "num_prompts": 96, "runs": [run("recipe", 1.34)]})["runs"][-1]["results"][0][
        "mean_accepted_tokens"] == 1.34  # the 96-prompt row re-measured: replaced, the 32-prompt one kept
    # judged again at another gamma: that gamma joins the row, the row's other gammas kept; a gamma measured again
    # replaced
    at_1 = merged(earlier, {**new, "runs": [{**run("recipe", 1.31), "results": [
        {"gamma": 1, "mean_accepted_tokens": 1.31}, {"gamma": 4, "mean_accepted_tokens": 1.36}]}]})
    assert [(r["gamma"], r["mean_accepted_tokens"]) for r in at_1["runs"][0]["results"]] == [(1, 1.31), (4, 1.36)]
    at_2 = merged(at_1, {**new, "runs": [{**run("recipe", 1.32), "results": [
        {"gamma": 2, "mean_accepted_tokens": 1.32}]}]})
    assert [(r["gamma"], r["mean_accepted_tokens"]) for r in at_2["runs"][0]["results"]] == [
        (1, 1.31), (2, 1.32), (4, 1.36)] and len(at_2["runs"]) == 2
    # the recipe at a seed the record lists for another arm only (`--seeds 1`): named in the header's seeds
    seed1 = merged(earlier, {**new, "seeds": [1], "arms": {"recipe": [], "ttt4": ["t4"]},
                             "runs": [{**run("recipe", 1.31), "seed": 1},
                                      {**run("ttt4", 1.4), "seed": 1}]})
    assert seed1["more_seeds"] == ["ttt4=1", "recipe=1"] and seed1["seeds"] == [0]
    assert "seeds 0 (ttt4=1, recipe=1: more seeds for the winners and the recipe);" in doc_text(
        {**seed1, "runs": [{**r, "results": [{"gamma": 4, "mean_accepted_tokens": 1.3, "acceptance_rate": 0.3}]}
                           for r in seed1["runs"]]})


def test_objective_overrides_reach_every_arm_and_keep_a_smoke_run_out_of_the_committed_record(tmp_path, monkeypatch):
    """bench_heads_objectives --overrides (a smoke run's train.max_steps=2): after each arm's own overrides in its
    training command, named in the record and its block; --add-to refuses to join it to a record trained without them
    and starts a record that is not there yet; relative --data / --out are this folder's, not the repository's."""
    from scripts import bench_heads_objectives as bho

    commands = []
    monkeypatch.setattr(bho, "run", lambda cmd: commands.append(cmd))
    monkeypatch.chdir(tmp_path)
    args = bho.parse_args(["--data", "qs/data", "--out", "out", "--arms", "ttt4", "--overrides", "train.max_steps=2"])
    assert args.data == tmp_path / "qs" / "data" and args.out == tmp_path / "out"
    bho.train(args, "ttt4", 0)
    assert commands[0][-3:] == [*bho.ARMS["ttt4"], "train.max_steps=2"]
    assert f"data.dataset={tmp_path / 'qs' / 'data' / 'chat'}" in commands[0]

    def record(overrides):
        base = {"machine": "m", "load_average": "1", "budget": "eagle3.yaml", "data": "data", "seeds": [0],
                "more_seeds": [], "num_prompts": 1, "max_new_tokens": 8, "arms": {"recipe": []},
                "runs": [{"arm": "recipe", "seed": 0, "temperature": 0.0, "train_seconds": 1.0,
                          "results": [{"gamma": 2, "mean_accepted_tokens": 1.0, "acceptance_rate": 0.0,
                                       "speedup": 1.0}]}]}
        return {**base, **({"overrides": overrides} if overrides else {})}

    with pytest.raises(SystemExit, match="overrides"):
        bho.merged(record([]), record(["train.max_steps=2"]))
    assert "every arm also `train.max_steps=2`" in bho.doc_text(record(["train.max_steps=2"]))
    assert "; every arm also `train.bf16=true` `train.use_cpu=true`. Arms:" in bho.doc_text(
        record(["train.bf16=true", "train.use_cpu=true"]))
    assert "every arm also" not in bho.doc_text(record([]))


def test_the_quickstart_budget_trains_every_arm_from_the_recipe_its_arms_were_measured_on(tmp_path, monkeypatch):
    """bench_heads_objectives BASE: the quickstart's recipe now starts fc on the deepest aux layer and the attention
    from the target's last layer, so each arm of that budget trains with `model.head_fc_init=random`
    `model.head_attn_init=random` before its own changes (the recipe its committed rows were measured on; `fc_last`'s
    last_aux after it, so it wins), the record and its block name them, and a record without them refuses to take its
    rows; the 90-minute budget trains from its recipe as it is."""
    import yaml

    from scripts import bench_heads_objectives as bho

    recipe = yaml.safe_load((bho.ROOT / "recipes" / "smollm2" / "eagle3.yaml").read_text())
    base = ["model.head_fc_init=random", "model.head_attn_init=random"]
    assert recipe["model"]["head_fc_init"] == "last_aux" and recipe["model"]["head_attn_init"] == "target"
    assert bho.BASE["eagle3.yaml"] == base
    commands = []
    monkeypatch.setattr(bho, "run", lambda cmd: commands.append(cmd))
    args = bho.parse_args(["--target", "t.gguf", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "out")])
    bho.train(args, "recipe", 0)
    bho.train(args, "fc_last", 0)
    assert commands[0][-2:] == base
    assert commands[1][-3:] == [*base, "model.head_fc_init=last_aux"]
    bho.train(bho.parse_args(["--budget", "90min", "--target", "t.gguf", "--data", str(tmp_path / "data"),
                              "--out", str(tmp_path / "out90")]), "recipe", 0)
    assert not any(c.startswith(("model.head_fc_init", "model.head_attn_init")) for c in commands[2])

    monkeypatch.setattr(bho, "train", lambda args, arm, seed: tmp_path)
    (tmp_path / "train_results.json").write_text('{"train_runtime": 1.0}')
    monkeypatch.setattr(bho, "evaluate", lambda *a: {"results": [{"gamma": 2, "mean_accepted_tokens": 1.0,
                                                                   "acceptance_rate": 0.0}]})
    record = bho.measure(bho.parse_args(["--target", "t.gguf", "--data", str(tmp_path), "--arms", "recipe"]))
    assert record["base"] == base
    assert "Budget: `recipes/smollm2/eagle3.yaml` with `model.head_fc_init=random` `model.head_attn_init=random` " \
        "(the recipe as these arms were measured; each arm's changes after it) on the rows" in bho.doc_text(record)
    with pytest.raises(SystemExit, match="base"):
        bho.merged({k: v for k, v in record.items() if k != "base"}, record)
    for name in ("bench_heads_objectives.json", "bench_heads_objectives_eos.json"):  # the committed records say so
        committed = json.loads((bho.ROOT / "docs" / "benchmarks" / "head_objectives" / name).read_text())
        assert committed["base"] == bho.BASE["eagle3.yaml"]


def test_an_arm_of_its_own_rows_writes_them_from_the_same_prompts_once_and_trains_on_them(tmp_path, monkeypatch):
    """bench_heads_objectives ROWS: an arm with rows of its own (longer answers) first has the target answer --data's
    prompts into a folder beside chat/, then trains on those rows with a hidden-state cache of its own; rows already
    written are not written again, other arms keep --data's chat/ and cache, and the record names the rows' options."""
    from scripts import bench_heads_objectives as bho

    commands = []
    monkeypatch.setattr(bho, "run", lambda cmd: commands.append(cmd))
    data = tmp_path / "data"
    args = bho.parse_args(["--target", "t.gguf", "--data", str(data), "--out", str(tmp_path / "out")])
    bho.train(args, "ttt4_answers256", 0)
    respond, training = commands
    assert respond[1].endswith("build_data.py") and respond[2] == "responses"
    assert respond[respond.index("--prompts") + 1] == str(data / "prompts")
    assert respond[respond.index("--out") + 1] == str(data / "chat_answers256")
    assert respond[respond.index("--max-new-tokens") + 1] == "256"
    assert f"data.dataset={data / 'chat_answers256'}" in training
    assert f"distill.hidden_state_cache={data / 'hidden_cache_answers256'}" in training
    assert training[-2:] == bho.TTT4

    (data / "chat_answers256").mkdir(parents=True)
    (data / "chat_answers256" / "train.jsonl").write_text("{}\n")
    commands.clear()
    bho.train(args, "ttt4_answers256", 1)
    assert len(commands) == 1 and commands[0][2].endswith("eagle3.yaml")  # the rows are there: training alone
    commands.clear()
    bho.train(args, "ttt4", 0)
    assert f"data.dataset={data / 'chat'}" in commands[0]
    assert f"distill.hidden_state_cache={data / 'hidden_cache'}" in commands[0]
    assert bho.arm_changes("ttt4_answers_t1") == [*bho.TTT4, "rows: responses --max-new-tokens 128 --temperature 1.0"]
    assert bho.arm_changes("ttt4") == bho.TTT4


def test_an_arm_reading_other_aux_layers_trains_from_a_cache_of_its_own_and_the_trainer_measures_nothing(
        tmp_path, monkeypatch):
    """bench_heads_objectives CACHES: an arm that reads other aux layers (aux_top) trains on --data's rows from a
    hidden-state cache of its own beside hidden_cache/ (a cache holds one set of aux layers); every arm's training
    skips the trainer's own acceptance measurement (specdistill-eval measures the exported head)."""
    from scripts import bench_heads_objectives as bho

    commands = []
    monkeypatch.setattr(bho, "run", lambda cmd: commands.append(cmd))
    data = tmp_path / "data"
    args = bho.parse_args(["--target", "t.gguf", "--data", str(data), "--out", str(tmp_path / "out")])
    for arm in ("aux_top", "ttt4_aux_top", "recipe"):
        bho.train(args, arm, 0)
    caches = [next(c for c in cmd if c.startswith("distill.hidden_state_cache=")) for cmd in commands]
    assert caches == [f"distill.hidden_state_cache={data / 'hidden_cache_aux_top'}"] * 2 + [
        f"distill.hidden_state_cache={data / 'hidden_cache'}"]
    assert all(f"data.dataset={data / 'chat'}" in cmd for cmd in commands)
    assert all("data.num_eval_prompts=0" in cmd and "eval.held_in_prompts=0" in cmd for cmd in commands)
    assert commands[0][-1] == "model.aux_layers=[2,15,29]"


def test_the_plot_draws_each_arms_gain_over_its_own_machines_recipe(tmp_path):
    """--plot: a panel per gamma; a bar per arm and machine, the mean over its seeds of its tau minus the recipe's
    mean on the same machine (CPUs train differently), each seed a dot; the arms sorted by the gain at their largest
    gamma, best on top; no bar where the arm or its machine's recipe was not judged; the 90-minute record, without a
    `recipe` arm, is drawn against its first arm."""
    pytest.importorskip("matplotlib")
    from scripts import bench_heads_objectives as bho

    def run(arm, machine, seed, taus):
        return {"arm": arm, "machine": machine, "seed": seed, "temperature": 0.0, "train_seconds": 1.0,
                "results": [{"gamma": g, "mean_accepted_tokens": t, "acceptance_rate": 0.1} for g, t in taus.items()]}
    runs = [run("recipe", "A", 0, {2: 1.30, 4: 1.30}), run("recipe", "A", 1, {2: 1.32, 4: 1.34}),
            run("ttt4", "A", 0, {2: 1.40, 4: 1.45}), run("ttt4", "A", 1, {2: 1.42, 4: 1.47}),
            run("recipe", "B", 0, {2: 1.20}), run("tv", "B", 0, {2: 1.10}),
            run("kl_tv", "B", 0, {2: 1.25, 4: 1.30})]  # no recipe at gamma 4 on B: no kl_tv bar there
    fig = bho.plot(tmp_path / "gain.png", runs, "recipe")
    assert (tmp_path / "gain.png").stat().st_size > 0
    axes = [ax for ax in fig.axes if ax.get_xlabel()]
    assert [ax.get_xlabel() for ax in axes] == ["tau gain at gamma 2", "tau gain at gamma 4"]
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ["ttt4 (A)", "kl_tv (B)", "tv (B)"]
    bars = [[bar.get_width() for bar in ax.patches] for ax in axes]
    assert bars[0] == pytest.approx([0.10, 0.05, -0.10])
    assert bars[1][0] == pytest.approx(0.14) and all(math.isnan(w) for w in bars[1][1:])
    seeds = sorted(x for line in axes[1].lines for x in line.get_xdata() if line.get_marker() == ".")
    assert seeds == pytest.approx([0.13, 0.15])
    assert bho.plot(tmp_path / "none.png", runs[:2], "recipe") is None and not (tmp_path / "none.png").exists()
    assert bho.baseline_of({"arms": {"answers": [], "all_tokens": []}}) == "answers"
    assert bho.baseline_of({"arms": {"tv": [], "recipe": []}}) == "recipe"


def test_each_budget_writes_its_own_block_of_the_page(tmp_path):
    """--doc: the quickstart budget's table goes between the bench_heads_objectives markers, the 90-minute budget's
    between bench_heads_objectives_90min's (--from-json: the record's budget decides), the other block kept; a page
    without the budget's markers is refused before anything is written."""
    from scripts import bench_heads_objectives as bho
    from scripts.benchmark import doc_blocks, doc_markers

    names = ["bench_heads_objectives", "bench_heads_objectives_90min"]
    page = tmp_path / "page.md"
    page.write_text("".join(f"{b}\nold\n{e}\n" for b, e in (doc_markers(n, "bench_heads_objectives") for n in names)))
    for budget in ("eagle3_90min.yaml", "eagle3.yaml"):
        record = {"machine": "m", "load_average": "1", "budget": budget, "data": "d", "seeds": [0], "more_seeds": [],
                  "num_prompts": 96, "max_new_tokens": 64, "arms": {"recipe": []},
                  "runs": [{"arm": "recipe", "seed": 0, "temperature": 0.0, "train_seconds": 1.0,
                            "results": [{"gamma": 4, "mean_accepted_tokens": 1.5, "acceptance_rate": 0.2}]}]}
        (tmp_path / budget).write_text(json.dumps(record))
        bho.main(["--from-json", str(tmp_path / budget), "--doc", str(page)])
    blocks = doc_blocks(page.read_text())
    assert "`recipes/smollm2/eagle3.yaml`" in blocks["bench_heads_objectives"]
    assert "`recipes/smollm2/eagle3_90min.yaml`" in blocks["bench_heads_objectives_90min"]
    assert "old" not in page.read_text()

    quickstart_only = tmp_path / "quickstart_only.md"
    quickstart_only.write_text("\n".join(doc_markers(names[0], "bench_heads_objectives")) + "\n")
    with pytest.raises(SystemExit, match="bench_heads_objectives_90min"):
        bho.main(["--from-json", str(tmp_path / "eagle3_90min.yaml"), "--doc", str(quickstart_only)])
    assert quickstart_only.read_text() == "\n".join(doc_markers(names[0], "bench_heads_objectives")) + "\n"


def test_the_table_has_a_row_per_arm_seed_and_temperature_with_its_gammas_side_by_side():
    """doc_text: one row per run, tau at every gamma of the record in its own column ("-" where the run was not
    judged at it), the acceptance per position at the run's largest gamma, a speedup column per timed gamma; the
    note under the table says what a "-" means only when one is there."""
    from scripts import bench_heads_objectives as bho

    def result(gamma, tau, positions, speedup=None):
        return {"gamma": gamma, "mean_accepted_tokens": tau, "acceptance_rate": 0.3,
                "per_position_acceptance": positions, **({"speedup": speedup} if speedup else {})}

    record = {"machine": "m", "load_average": "1", "budget": "eagle3.yaml", "data": "d", "seeds": [0],
              "more_seeds": [], "num_prompts": 96, "max_new_tokens": 64, "arms": {"recipe": [], "ttt4": []},
              "runs": [{"arm": "recipe", "seed": 0, "temperature": 0.0, "train_seconds": 200.0,
                        "results": [result(4, 1.35, [0.3, 0.05, 0.0, 0.0], 1.02), result(2, 1.34, [0.3, 0.04], 1.1)]},
                       {"arm": "ttt4", "seed": 0, "temperature": 1.0, "train_seconds": 900.0,
                        "results": [result(1, 1.31, [0.31])]}]}
    lines = bho.doc_text(record).splitlines()
    table = [[c.strip() for c in line.strip("|").split("|")] for line in lines if line.startswith("|")]
    assert table[0] == ["arm", "seed", "T", "tau, gamma 1", "tau, gamma 2", "tau, gamma 4",
                        "acceptance per position, largest gamma", "speedup, gamma 2", "speedup, gamma 4",
                        "training s"]
    assert table[2:] == [["recipe", "0", "0", "-", "1.340", "1.350", "0.30 / 0.05 / 0.00 / 0.00", "1.10x", "1.02x",
                          "200"],
                         ["ttt4", "0", "1", "1.310", "-", "-", "0.31", "-", "-", "900"]]
    assert lines[-1] == ("tau and speedup at each gamma, the acceptance per position at the row's largest gamma; "
                         "-: not judged at that gamma, or judged on acceptance alone (`--acceptance-only`: the same "
                         "tau and acceptance, nothing timed).")
    complete = {**record, "runs": record["runs"][:1]}
    assert bho.doc_text(complete).splitlines()[-1] == \
        "tau and speedup at each gamma, the acceptance per position at the row's largest gamma."


def test_an_eval_is_reused_only_at_the_gammas_it_measured(tmp_path, monkeypatch):
    """bench_heads_objectives.evaluate: a judged arm's JSON is reused for the same --gammas and measured again for
    others (its file name does not hold them), so a run at gamma 2 then at 2 and 4 never reports gamma 2 alone."""
    from scripts import bench_heads_objectives as bho

    commands = []

    def fake_run(cmd):
        commands.append(cmd)
        gammas = cmd[cmd.index("--gamma") + 1:cmd.index("--temperature")]
        rows = [{"gamma": int(g), "mean_accepted_tokens": 1.5, "acceptance_rate": 0.25} for g in gammas]
        rows.append({"gamma": int(gammas[0]), "category": "qa", "mean_accepted_tokens": 1.0, "acceptance_rate": 0.0})
        Path(cmd[cmd.index("--output") + 1]).write_text(json.dumps({"results": rows}))

    monkeypatch.setattr(bho, "run", fake_run)

    def judged(*gammas):
        args = bho.parse_args(["--target", "t.gguf", "--out", str(tmp_path / "out"), "--gammas", *gammas])
        return [r["gamma"] for r in bho.evaluate(args, "recipe", 0, tmp_path / "head", 0.0)["results"]
                if "category" not in r]

    assert judged("2") == [2] and len(commands) == 1
    assert judged("2") == [2] and len(commands) == 1  # the same gammas: reused
    assert judged("2", "4") == [2, 4] and len(commands) == 2  # more gammas: measured again
    assert commands[-1][commands[-1].index("--gamma") + 1:commands[-1].index("--temperature")] == ["2", "4"]
    with pytest.raises(SystemExit):
        bho.parse_args(["--gammas", "two"])


def test_answers_ended_at_eos_are_judged_and_recorded_apart(tmp_path, monkeypatch):
    """bench_heads_objectives --stop-at-eos: the judge gets specdistill-eval's --stop-at-eos and an eval file of its
    own (a judge past EOS is not reused for it), the record says so (its header: each answer ending at its EOS),
    --add-to refuses to join it to a record judged past EOS, and --doc writes it into the budget's block + _eos."""
    from scripts import bench_heads_objectives as bho
    from scripts.benchmark import doc_blocks, doc_markers

    commands = []

    def fake_run(cmd):
        commands.append(cmd)
        out = Path(cmd[cmd.index("--output") + 1])
        out.write_text(json.dumps({"results": [{"gamma": 2, "temperature": 0.0, "mean_accepted_tokens": 1.5,
                                                "acceptance_rate": 0.25, "num_prompts": 1}]}))

    monkeypatch.setattr(bho, "run", fake_run)
    head = tmp_path / "out" / "recipe_seed0"
    for eos in ([], ["--stop-at-eos"]):
        args = bho.parse_args(["--target", "t.gguf", "--out", str(tmp_path / "out"), "--gammas", "2", *eos])
        bho.evaluate(args, "recipe", 0, head, 0.0)
    past, ended = commands
    assert "--stop-at-eos" not in past and ended[-1] == "--stop-at-eos"
    assert past[past.index("--output") + 1].endswith("recipe_seed0_T0_n96.json")
    assert ended[ended.index("--output") + 1].endswith("recipe_seed0_T0_n96_eos.json")

    def record(eos):
        return {"machine": "m", "load_average": "1", "budget": "eagle3.yaml", "data": "d", "seeds": [0],
                "more_seeds": [], "num_prompts": 96, "max_new_tokens": 64, "arms": {"recipe": []},
                **({"stop_at_eos": True} if eos else {}),
                "runs": [{"arm": "recipe", "seed": 0, "temperature": 0.0, "train_seconds": 1.0,
                          "results": [{"gamma": 4, "mean_accepted_tokens": 1.5, "acceptance_rate": 0.2}]}]}

    with pytest.raises(SystemExit, match="stop_at_eos"):
        bho.merged(record(False), record(True))
    assert "64 new tokens (each answer ending at its EOS)" in bho.doc_text(record(True))
    assert "64 new tokens (past any EOS)" in bho.doc_text(record(False))
    page = tmp_path / "page.md"
    names = ["bench_heads_objectives", "bench_heads_objectives_eos"]
    page.write_text("".join(f"{b}\nold\n{e}\n" for b, e in (doc_markers(n, "bench_heads_objectives") for n in names)))
    (tmp_path / "eos.json").write_text(json.dumps(record(True)))
    bho.main(["--from-json", str(tmp_path / "eos.json"), "--doc", str(page)])
    blocks = doc_blocks(page.read_text())
    assert blocks["bench_heads_objectives"].strip() == "old" and "ending at its EOS" in blocks[
        "bench_heads_objectives_eos"]
