"""`specdistill bench-serve` (specdistill/cli/bench_serve.py) and what it stands on: the `vllm serve` process
(decode.serving.http_server) and GuideLLM's load (decode.serving.guidellm_load).

Without vLLM: a taken port, a server that dies, a missing GuideLLM and a GuideLLM that never ends are one line each;
GuideLLM's report is read into levels, and a stalled answer fails its level (against GuideLLM's own mock server when
the serving venv has GuideLLM). With vLLM (integration): the
command on a tiny pair (the target drafting for itself: tau 1 + gamma exactly) starts both servers over HTTP, greedy
completions equal the target's, the report has every level and key, and both servers are gone afterwards (prompt
lookup's server, the target with vLLM's ngram method, is checked without vLLM); `vllm serve` as `specdistill check`
prints it runs as typed.
"""
import contextlib
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import decode.serving.guidellm_load as guidellm_load
from decode.serving.guidellm_load import find_guidellm, guidellm_command, level_metrics, run_load, write_dataset
from decode.serving.http_server import STOP_TIMEOUT_S, ServerError, port_taken, vllm_server
from decode.serving.vllm_engine import ServingError, find_vllm_python
from specdistill.cli import bench_serve

from tiny import TINY_TEXT, save_and_load, tiny_model, tiny_tokenizer


def serving_python():
    try:
        return find_vllm_python()
    except ServingError:
        return None


PYTHON = serving_python()
HAS_GUIDELLM = PYTHON is not None and (Path(PYTHON).parent / "guidellm").is_file()


def fake_python(folder: Path, vllm_script: str | None) -> Path:
    """An interpreter path whose venv has `vllm` = ``vllm_script`` (a shell script) and no guidellm."""
    folder.mkdir(parents=True, exist_ok=True)
    python = folder / "python"
    python.symlink_to(sys.executable)
    if vllm_script is not None:
        (folder / "vllm").write_text("#!/bin/sh\n" + vllm_script)
        (folder / "vllm").chmod(0o755)
    return python


def test_a_taken_port_is_one_line(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert port_taken(port)
        with pytest.raises(ServerError, match=f"port {port} is taken"), \
                vllm_server(fake_python(tmp_path / "bin", "sleep 60"), "m", port=port, log=tmp_path / "s.log"):
            pass


def test_a_server_that_dies_is_one_line_naming_its_log(tmp_path):
    python = fake_python(tmp_path / "bin", 'echo "ValueError: no such model: m"; exit 3\n')
    started = time.monotonic()
    with pytest.raises(ServerError) as err, vllm_server(python, "m", log=tmp_path / "s.log"):
        pass
    line = str(err.value)
    assert "\n" not in line and "exited with code 3" in line and "no such model" in line and "s.log" in line
    assert time.monotonic() - started < 30  # found dead at once, not after the ready timeout


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_the_server_is_stopped_when_the_block_fails(sigint, tmp_path, monkeypatch):
    """A fake server that answers /health (python -m http.server): the block raises, the process is gone after, at
    once, also when it ignores SIGINT (as every process of a command a script starts with `&` does)."""
    trap = "trap '' INT\n" if sigint == "ignored" else ""  # inherited by what the shell execs: Python keeps it
    script = f'{trap}exec {sys.executable} -m http.server "$6" --bind 127.0.0.1 >/dev/null 2>&1\n'
    python = fake_python(tmp_path / "bin", script)
    (tmp_path / "health").write_text("ok")
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "models").write_text(json.dumps({"data": [{"id": "m"}]}))
    monkeypatch.chdir(tmp_path)  # http.server serves the current folder: /health and /v1/models answer
    with pytest.raises(RuntimeError, match="inside"), vllm_server(python, "m", log=tmp_path / "s.log") as server:
        process = server.process
        assert server.model == "m"
        started = time.monotonic()
        raise RuntimeError("inside the block")
    assert process.poll() is not None
    assert time.monotonic() - started < STOP_TIMEOUT_S / 2, "stopped by the first signal, not the SIGKILL after it"


def test_missing_guidellm_is_one_line_saying_make_serving(tmp_path):
    with pytest.raises(ServerError, match="make serving"):
        find_guidellm(fake_python(tmp_path / "bin", None))


def test_guidellm_command_names_levels_and_rates(tmp_path):
    command = guidellm_command(Path("guidellm"), "http://h:1", "tok", tmp_path / "d.jsonl", tmp_path / "o.json", 8,
                               streams=[1, 4])
    assert command[command.index("--profile") + 1] == "kind=concurrent,streams=1"
    assert command[command.index("--override") + 1:command.index("--override") + 3] == ["profile.streams", "1,4"]
    assert "kind=max_requests,count=8" in command
    backend = json.loads(command[command.index("--backend") + 1])  # GuideLLM reads YAML / JSON there
    assert backend == {"kind": "openai_http", "target": "http://h:1", "request_format": "/v1/completions",
                       "timeout": 600.0, "extras": {"body": {"temperature": 0.0}}}, \
        "greedy unless asked (vLLM's default is T=1); a stalled answer fails (GuideLLM's default waits for ever)"
    rated = guidellm_command(Path("guidellm"), "u", "tok", tmp_path / "d", tmp_path / "o", 4, rates=[0.5, 2])
    assert rated[rated.index("--override") + 2] == "0.5,2" and "kind=constant,rate=0.5" in rated
    sampled = guidellm_command(Path("guidellm"), "u", "tok", tmp_path / "d", tmp_path / "o", 4, streams=[1],
                               temperature=0.7)
    assert json.loads(sampled[sampled.index("--backend") + 1])["extras"] == {"body": {"temperature": 0.7}}


def test_the_load_is_bounded_by_its_slowest_legitimate_requests():
    assert guidellm_load.load_bound_s(8, streams=[1, 4], request_timeout=10) == guidellm_load.START_S + 8 * 10 + 2 * 10
    assert guidellm_load.load_bound_s(6, rates=[2.0], request_timeout=10) == guidellm_load.START_S + 3 + 10


def test_a_stuck_guidellm_is_stopped_with_what_it_started_in_one_line(tmp_path, monkeypatch):
    """GuideLLM that never ends (its worker processes neither): stopped past the bound, one line naming its log, and
    no process of it left."""
    from test_vllm_worker_group import child_pid, gone

    monkeypatch.setattr(guidellm_load, "START_S", 1.0)
    guidellm = tmp_path / "guidellm"
    guidellm.write_text(f"#!/bin/bash\nsleep 300 &\necho $! > {tmp_path / 'child.pid'}\nwait\n")
    guidellm.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(ServerError, match=r"guidellm did not finish within 2 s, the most its requests may take "
                                          r"\(stopped; log: .*out.log\)"):
        run_load(guidellm, "http://127.0.0.1:1", "tok", tmp_path / "d.jsonl", tmp_path / "out.json", requests=1,
                 streams=[1], request_timeout=0.5)
    # stop() takes at most 3 x STOP_TIMEOUT_S past the bound (SIGTERM, SIGKILL, the group's stragglers), far short of
    # the fake's 300 s: ~3 s
    assert time.monotonic() - started < 2 + 3 * STOP_TIMEOUT_S < 300
    assert gone(child_pid(tmp_path))


def stats(values: dict) -> dict:
    return {"successful": {"total_sum": values.get("sum", 0.0), "percentiles": values.get("p", {})}}


def test_level_metrics_reads_throughput_over_the_duration_and_percentiles():
    benchmark = {"config": {"strategy": {"type_": "concurrent", "streams": 4}}, "duration": 8.0,
                 "metrics": {"request_totals": {"successful": 8, "errored": 0},
                             "output_token_count": stats({"sum": 512.0}),
                             "time_to_first_token_ms": stats({"p": {"p50": 40.0, "p99": 90.0}}),
                             "inter_token_latency_ms": stats({"p": {"p50": 20.0, "p99": 30.0}})}}
    level = level_metrics(benchmark)
    assert level["level"] == "concurrent@4" and level["streams"] == 4
    assert level["output_tokens_per_s"] == 64.0 and level["ttft_ms_p99"] == 90.0 and level["itl_ms_p50"] == 20.0


def test_tau_and_the_default_server_arguments():
    assert bench_serve.tau_of({"num_drafts": 10, "num_accepted_tokens": 5}) == 1.5
    assert bench_serve.tau_of({}) is None and bench_serve.tau_of(None) is None
    args = bench_serve.server_args(None, 8)
    assert args[args.index("--max-num-seqs") + 1] == "8" and "--seed" in args
    import torch

    if not torch.cuda.is_available():  # float32 on a CPU: vLLM's auto would serve a float32 model in bfloat16
        assert args[args.index("--dtype") + 1] == "float32"
    assert bench_serve.server_args("--max-num-seqs 2 --dtype float32", 8) == ["--max-num-seqs", "2", "--dtype",
                                                                              "float32"]


def test_bad_levels_are_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_serve.parse_args(["--target", "t", "--draft", "d", "--prompts", "p", "--output", "o.json",
                                "--concurrency", "0"])
    assert exit_.value.code == 1
    assert "--concurrency" in capsys.readouterr().err


def test_a_drafts_folder_as_the_target_is_one_line_before_a_server_starts(tmp_path, monkeypatch, capsys):
    """--target naming a head's folder (architectures LlamaForCausalLMEagle3, no transformers class): one line,
    exit 1, no server started (vLLM and GuideLLM found by stand-ins)."""
    import decode.serving.vllm_engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "find_vllm_python", lambda given=None: Path(sys.executable))
    monkeypatch.setattr(guidellm_load, "find_guidellm", lambda python: Path("guidellm"))
    monkeypatch.setattr(bench_serve, "serve_and_load", lambda *a, **k: pytest.fail("a server was started"))
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama"}))
    with pytest.raises(SystemExit) as exit_:
        bench_serve.cli(["--target", str(head), "--draft", "prompt-lookup", "--prompts", "p.jsonl", "--output",
                         str(tmp_path / "o.json")])
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"--target: {head} is not a model to draft for" in err and "LlamaForCausalLMEagle3" in err


def test_requests_past_the_served_context_are_one_line_before_a_server_starts(tmp_path, monkeypatch, capsys):
    """The longest prompt and --max-tokens past the target's max_position_embeddings (or --max-model-len of
    --server-args): vLLM's server would refuse every such request after both servers start; one line naming the most
    --max-tokens that fit, exit 1, no server started. Within the context, the servers are started."""
    import decode.serving.vllm_engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "find_vllm_python", lambda given=None: Path(sys.executable))
    monkeypatch.setattr(guidellm_load, "find_guidellm", lambda python: Path("guidellm"))
    started = []

    def serve_and_load(*args, **kwargs):
        started.append(args[0])
        raise ServingError("stand-in: no server here")

    monkeypatch.setattr(bench_serve, "serve_and_load", serve_and_load)
    tok = tiny_tokenizer()
    target = tiny_model("llama", seed=0, vocab_size=len(tok))
    target.config.max_position_embeddings = 40
    save_and_load(target, tmp_path / "target", tok)
    (tmp_path / "p.txt").write_text(TINY_TEXT.splitlines()[0] + "\n")
    longest = len(tok(TINY_TEXT.splitlines()[0])["input_ids"])
    capsys.readouterr()

    def run(*flags):
        with pytest.raises(SystemExit) as exit_:
            bench_serve.cli(["--target", str(tmp_path / "target"), "--draft", "prompt-lookup", "--prompts",
                             str(tmp_path / "p.txt"), "--output", str(tmp_path / "o.json"), *flags])
        err = capsys.readouterr().err
        assert exit_.value.code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        return err

    err = run("--max-tokens", "64")
    assert "pass the served context of 40 positions" in err and f"--max-tokens {40 - longest} at most" in err
    err = run("--max-tokens", "16", "--server-args", "--seed 0 --max-model-len 20")
    assert f"--max-tokens {20 - longest} at most" in err
    assert started == []
    assert "stand-in: no server here" in run("--max-tokens", str(40 - longest))
    assert started == ["plain"]
    assert bench_serve.served_context(["--max-model-len=24", "--seed", "0"], 40) == 24
    assert bench_serve.served_context(["--max-model-len", "32k"], 40) is None  # vLLM's own forms: left to vLLM
    assert bench_serve.served_context(["--seed", "0"], 40) == 40


@contextlib.contextmanager
def mock_server(ttft_ms: int):
    """GuideLLM's own mock server (TTFT ``ttft_ms``, 10 ms between tokens, 16 tokens per request): its URL."""
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    number = port.getsockname()[1]
    port.close()
    mock = subprocess.Popen([str(find_guidellm(PYTHON)), "mock-server", "--port", str(number), "--ttft-ms",
                             str(ttft_ms), "--itl-ms", "10", "--output-tokens", "16"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not port_taken(number):
            time.sleep(0.5)
        yield f"http://127.0.0.1:{number}"
    finally:
        mock.terminate()
        mock.wait(timeout=30)


def load_data(tmp_path: Path) -> tuple[str, Path]:
    tokenizer = tmp_path / "tok"
    tiny_tokenizer().save_pretrained(tokenizer)
    texts = ["def add(a, b):", "class Point:", "import os"]
    return str(tokenizer), write_dataset(tmp_path / "prompts.jsonl", texts, 16)


@pytest.mark.skipif(not HAS_GUIDELLM, reason="GuideLLM is installed by `make serving`")
def test_guidellm_load_against_its_mock_server(tmp_path):
    """Every level comes back with its requests, throughput and percentiles near the mock's settings."""
    with mock_server(ttft_ms=50) as url:
        levels = run_load(find_guidellm(PYTHON), url, *load_data(tmp_path), tmp_path / "out.json", requests=4,
                          streams=[1, 2])
    assert [level["level"] for level in levels] == ["concurrent@1", "concurrent@2"]
    for level in levels:
        assert level["requests"] >= 1 and level["errored"] == 0 and level["output_tokens_per_s"] > 0
        assert 40 <= level["ttft_ms_p50"] <= 500 and 5 <= level["itl_ms_p50"] <= 100


@pytest.mark.skipif(not HAS_GUIDELLM, reason="GuideLLM is installed by `make serving`")
def test_a_stalled_answer_fails_its_level_in_one_line(tmp_path):
    """A server whose first token takes 20 s, a request timeout of 1 s: the load fails within seconds in one line
    (GuideLLM alone would wait for ever on a server that stalls). GuideLLM reports the level's requests failed, or,
    when no request of the level has a time to report, fails itself: either is the line."""
    with mock_server(ttft_ms=20_000) as url:
        started = time.monotonic()
        failed = "requests failed at concurrent@1|guidellm exited with code 1: ValueError"
        with pytest.raises(ServerError, match=failed):
            run_load(find_guidellm(PYTHON), url, *load_data(tmp_path), tmp_path / "out.json", requests=1,
                     streams=[1], request_timeout=1.0)
    assert time.monotonic() - started < 120


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-serve-pair")
    tok = tiny_tokenizer()
    save_and_load(tiny_model("llama", seed=0, vocab_size=len(tok), hidden=128), root / "target", tok)
    lines = [line for line in TINY_TEXT.splitlines() if line.strip()][:4]
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in lines))
    return root


def test_prompt_lookup_is_served_as_the_target_with_vllms_ngram_method():
    """A drafter without weights: `vllm serve TARGET --speculative-config` with vLLM's ngram method and no model."""
    from kinds import kind_of_source

    base = bench_serve.server_args(None, 2)
    model, args, how = bench_serve.speculative_server("t", "prompt-lookup", kind_of_source("prompt-lookup"), 3, base)
    assert model == "t" and args[:len(base)] == base and args[len(base)] == "--speculative-config"
    spec = json.loads(args[len(base) + 1])
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] == 3 and "model" not in spec
    assert how == "--speculative-config " + args[len(base) + 1]


@pytest.mark.integration
@pytest.mark.skipif(not HAS_GUIDELLM, reason="vLLM and GuideLLM are installed by `make serving`")
def test_bench_serve_on_a_tiny_pair(pair, tmp_path):
    """The target as its own draft: two real `vllm serve` processes, HTTP completions equal token for token, two
    concurrency levels, every reported key; no server left running. GuideLLM's requests reach the server at
    temperature 0 (vLLM's default is 1), so every drafted token is accepted and the server's tau is 1 + gamma
    exactly."""
    out = tmp_path / "served.json"
    report = bench_serve.main(["--target", str(pair / "target"), "--draft", str(pair / "target"), "--gamma", "3",
                               "--prompts", str(pair / "prompts.jsonl"), "--concurrency", "1", "2", "--requests",
                               "4", "--max-tokens", "16", "--check-prompts", "4", "--output", str(out),
                               "--plot", str(tmp_path / "served.png"), "--vllm-python", str(PYTHON),
                               "--request-timeout", "120"])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["temperature"] == 0.0 and report["greedy_equal"] == report["greedy_checked"] == 4
    assert report["spec_counters"]["num_drafts"] > 0 and report["tau"] == pytest.approx(4.0), report["spec_counters"]
    assert [level["streams"] for level in report["levels"]] == [1, 2]
    for level in report["levels"]:
        for key in ("plain_output_tokens_per_s", "speculative_output_tokens_per_s", "ratio", "plain_ttft_ms_p50",
                    "speculative_ttft_ms_p99", "plain_itl_ms_p50", "speculative_itl_ms_p99"):
            assert level[key] > 0, key
    assert (tmp_path / "served.png").stat().st_size > 1000
    logs = out.with_suffix(".logs")
    for name in ("plain", "speculative"):
        first = (logs / f"{name}-server.log").read_text().splitlines()[0]
        port = int(first.split("--port ")[1].split()[0])
        with pytest.raises(ConnectionRefusedError):  # nothing listens there any more: the server is stopped
            socket.create_connection(("127.0.0.1", port), timeout=5)


@pytest.mark.skipif(not HAS_GUIDELLM, reason="vLLM is installed by `make serving`")
def test_the_vllm_command_fixes_sampling_in_the_processes_it_spawns():
    """vLLM's CPU platform spawns its engine and workers, and a spawned process runs the `vllm` command's file as
    __mp_main__: doing so swaps in the plain-torch expansion wherever the installed vLLM has the CPU bug (and changes
    nothing where it has not)."""
    vllm = Path(PYTHON).parent / "vllm"
    code = ("import runpy, sys, torch; runpy.run_path(sys.argv[1], run_name='__mp_main__'); "
            "from vllm.v1.sample import rejection_sampler as r; "
            "got = r.expand_batch_to_tokens(torch.tensor([1.0, 0.7, -1.0]), torch.tensor([2, 3, 4]), 4, -1, 1); "
            "print(got.tolist())")
    out = subprocess.run([str(PYTHON), "-c", code, str(vllm)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[1.0, 1.0, 0.699999988079071, 1.0]"
