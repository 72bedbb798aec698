"""Measure a draft where users deploy it: `vllm serve` for the target alone and for the target with its draft, each
driven over HTTP by GuideLLM at fixed concurrency levels (or request rates).

    specdistill bench-serve --target T --draft OUTPUT_DIR --prompts recipes/prompts/chat_eval.jsonl \\
        --chat-template on --concurrency 1 4 8 --output served.json --plot served.png
    specdistill bench-serve --target T --draft prompt-lookup --prompts P.jsonl --rate 0.5 1 2 --output lookup.json

Per level and server: output tokens/s (the level's output tokens over its duration), time to first token and
inter-token latency (p50, p99, ms), then the speculative/plain throughput ratio; tau from the server's own
spec-decode counters over the load (1 + accepted / drafts). The load is greedy (temperature 0, as `specdistill eval`
measures) unless --temperature says otherwise. Before the load, the first --check-prompts prompts are
completed greedily through /v1/completions by both servers: speculative output must equal the target's own, token
for token (exit 1 otherwise). A draft in the speculators format is served as `vllm serve DRAFT` (its config names
the target and gamma), any other with --speculative-config. Both servers are always stopped: on return, failure and
Ctrl-C. vLLM, speculators and GuideLLM come from the serving venv (`make serving`); each server's log and GuideLLM's
raw JSON are kept in --log-dir.
"""
from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import time
from pathlib import Path

from decode.deploy.serving_commands import vllm_speculative_config
from decode.deploy.speculators import folder_speculators_type, proposed_tokens
from decode.inputs.checks import FileProblem, check_language_model_folder, check_writable_file, context_length
from decode.inputs.command_line import CHAT_TEMPLATE_MODES, REQUEST_TIMEOUT_S, OneLineArgumentParser
from decode.inputs.writes import write_atomic
from decode.measure.table import markdown_table
from kinds import Kind, kind_of_source
from specdistill.cli.closed_pipe import quiet_on_a_closed_pipe

# the loaders, the servers and the load generator are imported where they run (after the parse): `--help` and usage
# errors answer before torch loads

PROG = "specdistill-bench-serve"  # `specdistill bench-serve` runs the same code (specdistill.cli.main)
DEFAULT_GAMMA = 4


class ArgumentParser(OneLineArgumentParser, argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 1)."""


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def build_parser(prog: str = PROG) -> ArgumentParser:
    """The command's flags (also what specdistill.cli.reference documents)."""
    p = ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="target model: local folder, .gguf file (served as its converted "
                                                    "folder) or hub id")
    p.add_argument("--draft", required=True, help="draft folder (any kind vLLM serves) or prompt-lookup")
    p.add_argument("--prompts", required=True, help=".jsonl / .txt of prompts (as specdistill eval reads them)")
    levels = p.add_mutually_exclusive_group()
    levels.add_argument("--concurrency", nargs="+", type=positive_int, default=[1, 4, 8],
                        help="requests in flight at once, one level each (default 1 4 8)")
    levels.add_argument("--rate", nargs="+", type=positive_float, default=None,
                        help="request rates (requests/s, constant arrivals) instead of concurrency levels")
    p.add_argument("--requests", type=positive_int, default=None,
                   help="requests per level (default: 2 x the level's concurrency, at least 8)")
    p.add_argument("--num-prompts", type=positive_int, default=32, help="prompts read from --prompts (the first N)")
    p.add_argument("--max-tokens", type=positive_int, default=64, help="new tokens every request asks (ignore_eos)")
    p.add_argument("--temperature", type=non_negative_float, default=0.0,
                   help="sampling temperature of the load's requests (default 0: greedy, as specdistill eval)")
    p.add_argument("--check-prompts", type=int, default=8,
                   help="prompts completed greedily by both servers and compared token for token (0: none)")
    p.add_argument("--chat-template", choices=CHAT_TEMPLATE_MODES, default="auto")
    p.add_argument("--gamma", type=positive_int, default=None,
                   help="draft tokens per step (default: the draft folder's, else 4)")
    p.add_argument("--server-args", default=None,
                   help="extra `vllm serve` arguments for both servers, one string (default: --seed 0, and "
                        "--enforce-eager --dtype float32 on a machine without CUDA)")
    p.add_argument("--port", type=positive_int, default=None, help="the servers' port (default: a free one)")
    p.add_argument("--request-timeout", type=positive_float, default=REQUEST_TIMEOUT_S,
                   help="seconds a request's answer may stall before it counts as failed, in the greedy check and "
                        f"the load (default {REQUEST_TIMEOUT_S:g}); the load as a whole is bounded by it too")
    p.add_argument("--vllm-python", default=None,
                   help="interpreter with vLLM and GuideLLM (default: $SPECDISTILL_VLLM_PYTHON, else "
                        ".venv-vllm/bin/python)")
    p.add_argument("--output", type=Path, required=True, help="the report, JSON")
    p.add_argument("--plot", type=Path, default=None, help="also a PNG: throughput and the ratio against the level")
    p.add_argument("--log-dir", type=Path, default=None, help="server logs and GuideLLM's JSON (default: OUTPUT.logs)")
    return p


def parse_args(argv: list[str] | None, prog: str = PROG) -> argparse.Namespace:
    return build_parser(prog).parse_args(argv)


# ---- what each server runs ------------------------------------------------------------------------------------------
def draft_gamma(draft: str, kind: Kind, given: int | None) -> int:
    """--gamma, else the draft folder's (speculators proposal, generation_config), else DEFAULT_GAMMA."""
    if given is not None:
        return given
    if kind.has_weights and Path(draft).is_dir():
        from decode.deploy.deploy_check import check_generation_config

        config_file = Path(draft) / "config.json"
        tokens = proposed_tokens(json.loads(config_file.read_text())) if config_file.is_file() else None
        return tokens or check_generation_config(Path(draft))[2] or DEFAULT_GAMMA
    return DEFAULT_GAMMA


def server_args(given: str | None, max_seqs: int) -> list[str]:
    """--server-args, or the defaults; --max-num-seqs always holds the largest level."""
    if given is not None:
        args = shlex.split(given)
    else:
        import torch

        # on a CPU: float32, as every measurement of ours there (vLLM's auto casts a float32 model to bfloat16, whose
        # many-token verify rounds differently from a one-token step: greedy output is then not the target's exactly)
        args = ["--seed", "0"] + ([] if torch.cuda.is_available() else ["--enforce-eager", "--dtype", "float32"])
    return args if "--max-num-seqs" in args else [*args, "--max-num-seqs", str(max_seqs)]


def served_context(server_args: list[str], context: int | None) -> int | None:
    """The context `vllm serve` runs with: --max-model-len among the server arguments (a plain integer; vLLM's "32k"
    forms are left to vLLM), else the model's own ``context`` (decode.inputs.checks.context_length)."""
    for i, arg in enumerate(server_args):
        if arg.startswith("--max-model-len="):
            value = arg.split("=", 1)[1]
        elif arg == "--max-model-len" and i + 1 < len(server_args):
            value = server_args[i + 1]
        else:
            continue
        return int(value) if value.isdigit() else None
    return context


def check_requests_fit(prompt_ids: list[list[int]], max_tokens: int, context: int | None) -> None:
    """LoadError in one line when the longest prompt and --max-tokens pass the served ``context``: vLLM's server
    would answer every such request with an error, after both servers start."""
    from decode.inputs.loading import LoadError

    longest = max(len(ids) for ids in prompt_ids)
    if context is not None and longest + max_tokens > context:
        fix = f"--max-tokens {context - longest} at most" if context > longest else "shorter prompts"
        raise LoadError(f"the longest prompt ({longest} tokens) and --max-tokens {max_tokens} pass the served context "
                        f"of {context} positions (the target's, or --max-model-len in --server-args): vLLM's server "
                        f"refuses such a request; {fix}")


def speculative_server(target: str, draft: str, kind: Kind, gamma: int, base: list[str]) -> tuple[str, list[str], str]:
    """(model, args, how) of the speculative server: `vllm serve DRAFT` for a speculators folder drafting ``gamma``,
    else the target with the kind's --speculative-config."""
    if kind.has_weights and folder_speculators_type(draft) and proposed_tokens(
            json.loads((Path(draft) / "config.json").read_text())) == gamma:
        return draft, base, f"vllm serve {draft}"
    spec = json.loads(vllm_speculative_config(kind.vllm_method, draft, gamma, kind.vllm_options()))
    if not kind.has_weights:
        spec.pop("model")
    return target, [*base, "--speculative-config", json.dumps(spec)], "--speculative-config " + json.dumps(spec)


def serve_and_load(name: str, python: Path, model: str, args: list[str], prompts: list[list[int]],
                   args_ns: argparse.Namespace, tokenizer_folder: str, data: Path, log_dir: Path) -> dict:
    """One server: started, greedy completions of the check prompts, the load at every level, its spec counters over
    the load; stopped."""
    from decode.serving.guidellm_load import find_guidellm, run_load
    from decode.serving.http_server import vllm_server

    guidellm = find_guidellm(python)
    started = time.perf_counter()
    with vllm_server(python, model, args, port=args_ns.port, log=log_dir / f"{name}-server.log") as server:
        ready_s = time.perf_counter() - started
        greedy = [server.complete(ids, args_ns.max_tokens, ignore_eos=True, timeout=args_ns.request_timeout)
                  for ids in prompts]
        before = server.spec_counters()
        levels = run_load(guidellm, server.url, tokenizer_folder, data, log_dir / f"{name}-guidellm.json",
                          requests_per_level(args_ns), streams=args_ns.concurrency if not args_ns.rate else (),
                          rates=args_ns.rate or (), temperature=args_ns.temperature,
                          request_timeout=args_ns.request_timeout)
        after = server.spec_counters()
    counters = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    return {"model": model, "args": args, "ready_s": ready_s, "greedy": greedy, "levels": levels,
            "spec_counters": counters or None}


def requests_per_level(args: argparse.Namespace) -> int:
    return args.requests or max(8, 2 * max(args.concurrency if not args.rate else [4]))


def tau_of(counters: dict | None) -> float | None:
    """vLLM's mean acceptance length: 1 + accepted / drafts (None without drafts)."""
    if not counters or not counters.get("num_drafts"):
        return None
    return 1 + counters["num_accepted_tokens"] / counters["num_drafts"]


def compare_levels(plain: list[dict], speculative: list[dict]) -> list[dict]:
    rows = []
    for p, s in zip(plain, speculative):
        row = {"level": p["level"], "streams": p["streams"], "rate": p["rate"]}
        for name, result in (("plain", p), ("speculative", s)):
            row.update({f"{name}_{k}": result[k] for k in ("output_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99",
                                                           "itl_ms_p50", "itl_ms_p99", "requests")})
        row["ratio"] = s["output_tokens_per_s"] / p["output_tokens_per_s"]
        rows.append(row)
    return rows


def table(report: dict) -> list[str]:
    headers = ["level", "plain tok/s", "spec tok/s", "spec/plain", "TTFT p50 plain / spec (ms)",
               "ITL p50 plain / spec (ms)", "ITL p99 plain / spec (ms)"]
    rows = [[r["level"], f"{r['plain_output_tokens_per_s']:.1f}", f"{r['speculative_output_tokens_per_s']:.1f}",
             f"{r['ratio']:.2f}x", f"{r['plain_ttft_ms_p50']:.0f} / {r['speculative_ttft_ms_p50']:.0f}",
             f"{r['plain_itl_ms_p50']:.1f} / {r['speculative_itl_ms_p50']:.1f}",
             f"{r['plain_itl_ms_p99']:.1f} / {r['speculative_itl_ms_p99']:.1f}"] for r in report["levels"]]
    return markdown_table(headers, rows)


def plot(path: Path, report: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = report["levels"]
    x = [r["streams"] or r["rate"] for r in levels]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    left.plot(x, [r["plain_output_tokens_per_s"] for r in levels], "o-", label="plain")
    left.plot(x, [r["speculative_output_tokens_per_s"] for r in levels], "o-", label=f"{report['kind']} draft")
    right.plot(x, [r["ratio"] for r in levels], "o-", color="C2")
    right.axhline(1.0, color="grey", lw=0.8)
    xlabel = "requests in flight" if levels[0]["streams"] else "requests / s"
    left.set(xlabel=xlabel, ylabel="output tokens / s", title="served throughput")
    right.set(xlabel=xlabel, ylabel="speculative / plain", title=f"gamma {report['gamma']}, tau {report['tau']:.2f}"
              if report["tau"] else "speculative / plain")
    left.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None, prog: str = PROG) -> dict:
    """Serve the target plain and with the draft, load both at every level, compare; the report (--output)."""
    return run(parse_args(argv, prog))


def run(args: argparse.Namespace) -> dict:
    """What `main` does once the command line is parsed."""
    from decode.deploy.deploy_check import load_target_config
    from decode.inputs.loading import load_tokenizer, resolve_draft_path, resolve_model_path
    from decode.inputs.prompts import encode_prompt_rows, raw_prompts_note, read_prompt_rows
    from decode.serving.guidellm_load import find_guidellm, write_dataset
    from decode.serving.http_server import ServerError
    from decode.serving.vllm_engine import find_vllm_python

    check_writable_file(args.output, "--output")
    python = find_vllm_python(args.vllm_python)
    find_guidellm(python)  # missing: one line before anything starts
    target = str(resolve_model_path(args.target, "--target"))  # a .gguf: its converted folder, which vLLM serves
    check_language_model_folder(target, "--target")  # a draft's folder given as the target: one line
    draft = resolve_draft_path(args.draft, "--draft")  # a .gguf or a hub id: its folder, whose config tells the kind
    kind = kind_of_source(draft)
    gamma = draft_gamma(draft, kind, args.gamma)
    log_dir = args.log_dir or args.output.with_suffix(".logs")
    log_dir.mkdir(parents=True, exist_ok=True)

    tokenizer = load_tokenizer(target)
    rows = read_prompt_rows(args.prompts, limit=args.num_prompts)
    prompt_ids = [ids.tolist() for ids in encode_prompt_rows(tokenizer, rows, args.chat_template)]
    if note := raw_prompts_note(tokenizer, rows, args.chat_template):
        print(note, file=sys.stderr)
    base = server_args(args.server_args, max(args.concurrency if not args.rate else [1]))
    check_requests_fit(prompt_ids, args.max_tokens, served_context(base, context_length(load_target_config(target),
                                                                                         tokenizer)))
    data = write_dataset(log_dir / "prompts.jsonl", [tokenizer.decode(ids) for ids in prompt_ids], args.max_tokens)
    checked = prompt_ids[:max(args.check_prompts, 0)]

    plain = serve_and_load("plain", python, target, base, checked, args, target, data, log_dir)
    model, spec_args, how = speculative_server(target, draft, kind, gamma, base)
    speculative = serve_and_load("speculative", python, model, spec_args, checked, args, target, data, log_dir)

    equal = sum(s == p for s, p in zip(speculative["greedy"], plain["greedy"]))
    report = {"target": args.target, "draft": args.draft, "kind": kind.name, "gamma": gamma, "served_as": how,
              "prompts": args.prompts, "num_prompts": len(prompt_ids), "max_tokens": args.max_tokens,
              "temperature": args.temperature,
              "requests_per_level": requests_per_level(args), "server_args": base,
              "greedy_equal": equal, "greedy_checked": len(checked),
              "tau": tau_of(speculative["spec_counters"]), "spec_counters": speculative["spec_counters"],
              "ready_s": {"plain": plain["ready_s"], "speculative": speculative["ready_s"]},
              "levels": compare_levels(plain["levels"], speculative["levels"])}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.output, json.dumps(report, indent=2) + "\n")
    if args.plot:  # the files before the table: a reader who leaves early (`| head`) loses nothing
        plot(args.plot, report)
    tau = f"{report['tau']:.3f}" if report["tau"] else "-"
    print(f"{kind.name} draft, gamma {gamma}, tau {tau} (vLLM's counters); greedy output = the target's on "
          f"{equal}/{len(checked)} prompts\n")
    print("\n".join(table(report)))
    if equal != len(checked):
        raise ServerError(f"speculative greedy output differs from the target's on {len(checked) - equal} of "
                          f"{len(checked)} prompts (report: {args.output}); in bfloat16 or float16 a many-token verify "
                          "rounds differently from a one-token step: check losslessness with --dtype float32")
    return report


@quiet_on_a_closed_pipe
def cli(argv: list[str] | None = None, prog: str = PROG) -> None:
    """Console entry point `specdistill-bench-serve`: user errors exit 1 with one line; Ctrl-C and SIGTERM stop the
    servers (SIGTERM unwinds as SystemExit 143, through the blocks that stop them)."""
    args = parse_args(argv, prog)  # --help and usage errors answer here, before torch loads
    from decode.inputs.loading import LoadError
    from decode.serving.vllm_engine import ServingError

    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        run(args)
    except (LoadError, FileProblem, ServingError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; the servers are stopped", file=sys.stderr)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    cli()
