"""`vllm serve` as users run it: an OpenAI-compatible HTTP server started in the vLLM interpreter, waited for, asked
over HTTP, and always stopped (on return, on an error, on Ctrl-C).

    with vllm_server(python, "out/head", port=None, log=Path("serve.log")) as server:   # vllm serve out/head
        ids = server.complete([1, 2, 3], max_tokens=32)         # greedy, token ids back (vLLM's return_token_ids)
        counters = server.spec_counters()                       # vllm:spec_decode_* from /metrics

A taken port, a server that dies before it is ready, or one that is not ready in time is one line (ServerError)
naming the log file, whose last lines say why.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from decode.inputs.command_line import REQUEST_TIMEOUT_S
from decode.serving.vllm_engine import ServingError

READY_TIMEOUT_S = 900.0  # a CPU build loads, profiles and warms up in 1-3 minutes on 2 cores
STOP_TIMEOUT_S = 30.0
SPEC_METRICS = {"vllm:spec_decode_num_drafts": "num_drafts", "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
                "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens"}


class ServerError(ServingError):
    """The server could not be started or answered wrongly (one line)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_taken(port: int) -> bool:
    """Whether something listens on the port (one left in TIME_WAIT by closed connections is free, as for vLLM)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def vllm_command(python: Path) -> list[str]:
    """`vllm` of the interpreter's venv (`make serving` installs one that runs as typed on the CPU build:
    scripts/vllm_cpu.py), else that interpreter running vLLM's CLI module."""
    script = Path(python).parent / "vllm"
    return [str(script)] if script.is_file() else [str(python), "-m", "vllm.entrypoints.cli.main"]


@dataclass
class Server:
    url: str                 # http://127.0.0.1:PORT
    model: str               # the served model's name (what requests name)
    process: subprocess.Popen
    log: Path

    def get(self, path: str, timeout: float = 10.0) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
            return response.read()

    def post(self, path: str, body: dict, timeout: float = REQUEST_TIMEOUT_S) -> dict:
        request = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            raise ServerError(f"{path} answered {err.code}: {err.read().decode(errors='replace')[:300]}") from None
        except TimeoutError:
            raise ServerError(f"{path} did not answer within {timeout:g} s (the server's log: {self.log})") from None

    def complete(self, prompt_ids: Sequence[int], max_tokens: int, ignore_eos: bool = False,
                 timeout: float = REQUEST_TIMEOUT_S) -> list[int]:
        """Greedy completion of a tokenized prompt through /v1/completions: the new token ids (ServerError when the
        answer takes over `timeout` seconds)."""
        body = {"model": self.model, "prompt": list(prompt_ids), "max_tokens": max_tokens, "temperature": 0.0,
                "return_token_ids": True, "ignore_eos": ignore_eos}
        answer = self.post("/v1/completions", body, timeout=timeout)
        return list(answer["choices"][0]["token_ids"])

    def spec_counters(self) -> dict[str, float]:
        """The server's speculative-decoding counters since it started (Prometheus text of /metrics): num_drafts,
        num_draft_tokens, num_accepted_tokens; {} for a server without a draft."""
        found: dict[str, float] = {}
        for line in self.get("/metrics").decode().splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name, value = line.rsplit(" ", 1)
            base = name.split("{", 1)[0].removesuffix("_total")
            if base in SPEC_METRICS:
                found[SPEC_METRICS[base]] = found.get(SPEC_METRICS[base], 0.0) + float(value)
        return found


def wait_ready(server: Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = server.process.poll()
        if code is not None:
            raise ServerError(f"vllm serve exited with code {code} before it was ready: {last_line(server.log)} "
                              f"(log: {server.log})")
        try:
            server.get("/health", timeout=2.0)
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(1.0)
    raise ServerError(f"vllm serve was not ready after {timeout:.0f} s (log: {server.log})")


def last_line(log: Path) -> str:
    try:
        text = log.read_bytes().decode(errors="replace")  # a server's log: whatever bytes it wrote
        lines = [line for line in text.splitlines() if line.strip()]
    except OSError:
        return "no log"
    errors = [line for line in lines if "Error" in line or "error:" in line]
    return (errors or lines or ["an empty log"])[-1].strip()[:300]


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (vLLM shuts its engine down, as on SIGINT), SIGKILL after
    STOP_TIMEOUT_S; then whatever of the group is left (an engine process holding the port) is killed, and the group
    waited for until it is empty. SIGTERM, not SIGINT: a command that a script starts in the background (`cmd &`) hands
    its children SIGINT ignored, and a process that ignores it would hold the port until the SIGKILL."""
    for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, STOP_TIMEOUT_S)):
        if process.poll() is not None:
            break
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=wait)
        except ProcessLookupError:
            break
        except subprocess.TimeoutExpired:
            continue
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # the group's leader is gone: its stragglers
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.2)


@contextmanager
def vllm_server(python: Path, model: str, args: Sequence[str] = (), port: int | None = None,
                log: Path | None = None, env: dict | None = None,
                ready_timeout: float = READY_TIMEOUT_S) -> Iterator[Server]:
    """`vllm serve MODEL ARGS` on 127.0.0.1:PORT (a free one when None), yielded once /health answers; stopped when
    the block ends however it ends. Raises ServerError for a taken port or a server that is never ready."""
    if port is not None and port_taken(port):
        raise ServerError(f"port {port} is taken: stop what listens there or choose another port")
    port = port or free_port()
    log = Path(log or f"vllm-serve-{port}.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [*vllm_command(python), "serve", model, "--host", "127.0.0.1", "--port", str(port), *args]
    with open(log, "w") as sink:
        sink.write("$ " + " ".join(command) + "\n")
        sink.flush()
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})})
    server = Server(f"http://127.0.0.1:{port}", model, process, log)
    try:
        wait_ready(server, ready_timeout)
        served = json.loads(server.get("/v1/models"))["data"]
        server.model = served[0]["id"] if served else model
        yield server
    finally:
        stop(process)
