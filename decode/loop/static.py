"""The compiled decode path: a preallocated (static) KV cache per model and role, and ``torch.compile``d steps.

A ``StaticLM`` has the interface of ``decode.loop.cache.CachedLM`` (``forward``, ``rollback``, ``length``) over a
``transformers.StaticCache``:
  * the cache holds ``capacity`` positions, allocated once (power-of-two buckets, so prompts of different lengths
    share it); ``StaticCache`` writes new keys/values at its ``cumulative_length`` counter and masks keys after each
    query's position (causal mask over the whole buffer), so
  * rollback = moving that counter back (no crop, no reallocation): entries beyond it are stale, never attended
    to, and overwritten by the next forward;
  * a forward of T tokens runs a step compiled for exactly T tokens; a T that has no compiled step is padded up to
    the next compiled length (the padding writes stale entries beyond the committed length, and its logits are
    dropped); a longer T (a prefill) runs eagerly on the same cache.
Compiled steps and caches live in a registry keyed on the model object and a role ("target", "draft"), so the
compilation is paid once per model and shape: across prompts, across gammas that share a shape, across the
trainer's checkpoints (the same draft module is evaluated each time). CUDA: ``mode="reduce-overhead"`` (CUDA
graphs); CPU: inductor's default. A model whose cache cannot be static or whose step fails to compile falls back to
the eager path with a warning.
"""
from __future__ import annotations

import inspect
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_map
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from decode.inputs.vocab import lm_head_rows
from decode.loop.cache import CachedLM, aux_hidden, cache_keyword

MIN_CAPACITY = 64
BACKEND = "inductor"  # torch.compile backend (tests of the decode logic swap in "aot_eager": no code generation)


class StaticCacheUnsupported(RuntimeError):
    """The model's cache cannot be a plain static cache (sliding-window or hybrid layers)."""


def compile_options(device: torch.device) -> dict:
    """torch.compile arguments for a decode step on ``device``: CUDA graphs on CUDA, inductor's default elsewhere."""
    options = {"backend": BACKEND, "dynamic": False, "isolate_recompiles": True}
    if device.type == "cuda" and BACKEND == "inductor":
        options["mode"] = "reduce-overhead"
    # isolate_recompiles: every (model, role, length) step is its own compiled region, so the many sessions that
    # share the step's code never reach dynamo's per-code recompile limit
    return supported_compile_options(options)


RECOMPILE_LIMIT = 256  # per-code limit where torch.compile lacks isolate_recompiles (torch < 2.13)


def supported_compile_options(options: dict, compile_fn: Callable = torch.compile) -> dict:
    """``options`` less what this torch's ``compile_fn`` does not take. Without ``isolate_recompiles`` every step
    shares its code's recompile budget, so dynamo's per-code limit is raised to RECOMPILE_LIMIT instead."""
    accepted = inspect.signature(compile_fn).parameters
    kept = {key: value for key, value in options.items() if key in accepted}
    if options.get("isolate_recompiles") and "isolate_recompiles" not in kept:
        import torch._dynamo.config as dynamo_config

        for name in ("recompile_limit", "cache_size_limit"):  # the name changed in torch 2.6
            if hasattr(dynamo_config, name):
                setattr(dynamo_config, name, max(getattr(dynamo_config, name), RECOMPILE_LIMIT))
    return kept


def bucket(length: int) -> int:
    """The cache capacity for ``length`` positions: the next power of two, at least MIN_CAPACITY."""
    return max(MIN_CAPACITY, 1 << (max(length, 1) - 1).bit_length())


@dataclass
class Session:
    """One model's static cache in one role, and its compiled steps by token count."""

    model_ref: weakref.ReferenceType[torch.nn.Module]  # weak: the registry must not keep a model alive
    cache: StaticCache | None = None
    capacity: int = 0
    steps: dict[int, Callable[[torch.Tensor], torch.Tensor]] = field(default_factory=dict)
    compile_seconds: float = 0.0   # first calls of each compiled step (compilation and one run)
    eager: bool = False            # compilation failed once: every step runs eagerly on the static cache
    aux_layers: tuple[int, ...] = ()  # hidden-state layers every step also returns (a head drafter's features)
    cache_keyword: str = "past_key_values"  # model.forward's name for its cache (decode.loop.cache.cache_keyword)

    @property
    def model(self) -> torch.nn.Module:
        return self.model_ref()

    @torch.inference_mode()
    def reserve(self, capacity: int) -> None:
        """Make the cache hold at least ``capacity`` positions (a new, larger cache recompiles its steps)."""
        if self.cache is not None and capacity <= self.capacity:
            return
        device = next(self.model.parameters()).device
        cache = StaticCache(config=self.model.config, max_cache_len=bucket(capacity))
        if not all(type(layer) is StaticLayer for layer in cache.layers):
            raise StaticCacheUnsupported(
                f"{type(self.model).__name__} uses sliding-window or hybrid attention layers")
        self.cache, self.capacity, self.steps = cache, cache.layers[0].max_cache_len, {}
        # allocate the buffers eagerly (a lazy allocation inside a compiled step would break its graph)
        self.model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), **{self.cache_keyword: cache},
                   use_cache=True)
        self.set_position(0)

    @torch.inference_mode()
    def set_position(self, length: int) -> None:
        """The next forward writes at position ``length``; positions from there on are masked as stale."""
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(length)

    def eager_step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits [T, V], the aux layers' hidden states [T, k * H] or None without aux layers)."""
        out = self.model(input_ids=tokens, **{self.cache_keyword: self.cache}, use_cache=True,
                         output_hidden_states=bool(self.aux_layers))
        return out.logits[0], aux_hidden(out.hidden_states, self.aux_layers) if self.aux_layers else None

    def step(self, length: int) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]:
        """The step for ``length`` tokens: compiled on first use (its time is added to compile_seconds)."""
        if self.eager:
            return self.eager_step
        if length not in self.steps:
            self.steps[length] = self.first_call(length)
        return self.steps[length]

    def chain(self, length: int, steps: int, choose: Callable[[torch.Tensor], torch.Tensor], name: str
              ) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """A drafter's whole round as ONE compiled call (one CUDA graph with reduce-overhead, as SGLang captures its
        multi-step draft): a forward over ``length`` tokens, then ``steps - 1`` one-token forwards, each fed the token
        ``choose`` picked from the last row of the logits before it (logits [1, V] -> token [1]); returns the
        ``steps`` picked tokens [steps], the cache advanced by length + steps - 1. ``name`` keys ``choose`` (one
        compiled chain per name, length and steps, reused across prompts). None when the session runs eagerly."""
        key = ("chain", name, length, steps)
        if self.eager:
            return None
        if key not in self.steps:
            def draft(tokens: torch.Tensor) -> torch.Tensor:
                logits, _ = self.eager_step(tokens)
                picked = [choose(logits[-1:])]
                for _ in range(steps - 1):
                    logits, _ = self.eager_step(picked[-1].view(1, 1))
                    picked.append(choose(logits))
                return torch.cat(picked)

            self.steps[key] = self.first_call(length, draft, key)
        return None if self.eager else self.steps[key]

    @torch.inference_mode()
    def first_call(self, length: int, function: Callable | None = None, key: object = None) -> Callable:
        """``function`` (default ``eager_step``) of a [1, length] token input, compiled at its first call (which
        also runs it): stored as ``steps[key]`` (default ``length``)."""
        function, key = function or self.eager_step, length if key is None else key
        device = next(self.model.parameters()).device
        options = compile_options(device)
        graphs = options.get("mode") == "reduce-overhead"
        # one input buffer per step: the same strides, dispatch keys and address at every call (no guard misses)
        buffer = torch.zeros(1, length, dtype=torch.long, device=device)
        torch._dynamo.mark_static_address(buffer)
        compiled: list[Callable] = []

        def run(tokens: torch.Tensor):
            buffer.copy_(tokens)
            if graphs:  # CUDA graphs reuse their output buffers: copy the outputs out
                torch.compiler.cudagraph_mark_step_begin()
                return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, compiled[0](buffer))
            return compiled[0](buffer)

        def warm(tokens: torch.Tensor):
            start = time.perf_counter()
            position = int(self.cache.layers[0].cumulative_length)
            try:
                compiled.append(torch.compile(function, **options))
                outputs = run(tokens)
                self.steps[key] = run
            except Exception as err:  # noqa: BLE001 - any compiler failure means: use the eager path
                reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
                warnings.warn(f"torch.compile failed for {type(self.model).__name__} ({type(err).__name__}: "
                              f"{reason}); decoding it eagerly on the static cache instead", RuntimeWarning,
                              stacklevel=2)
                self.eager = True
                self.set_position(position)
                outputs = function(tokens)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            self.compile_seconds += time.perf_counter() - start
            return outputs

        return warm


# model -> role -> Session; weak keys, so a model that is gone takes its caches and compiled steps with it
_SESSIONS: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, Session]] = weakref.WeakKeyDictionary()


def role_name(role: str, aux_layers: tuple[int, ...] = ()) -> str:
    """The session role of a model that also returns aux hidden states: its steps differ, so its cache is apart."""
    return f"{role}+aux{','.join(map(str, aux_layers))}" if aux_layers else role


def session(model: torch.nn.Module, role: str, aux_layers: tuple[int, ...] = ()) -> Session:
    """The registry's session of ``model`` in ``role`` (created on first use; ``aux_layers``: see role_name)."""
    sessions = _SESSIONS.setdefault(model, {})
    name = role_name(role, aux_layers)
    if name not in sessions:
        sessions[name] = Session(weakref.ref(model), aux_layers=tuple(aux_layers), cache_keyword=cache_keyword(model))
    return sessions[name]


def register(model: torch.nn.Module, role: str, made: Callable[[], object]) -> object:
    """A session of another kind (anything with ``compile_seconds``, e.g. a head drafter's static cache) kept in
    the registry beside the models' own: created by ``made()`` on first use."""
    sessions = _SESSIONS.setdefault(model, {})
    if role not in sessions:
        sessions[role] = made()
    return sessions[role]


def compile_seconds(*models: torch.nn.Module) -> float:
    """Seconds spent so far in the first (compiling) calls of every step of ``models``, all roles."""
    return sum(s.compile_seconds for m in models if isinstance(m, torch.nn.Module)
               for s in _SESSIONS.get(m, {}).values())


class StaticLM:
    """``CachedLM``'s interface on a session's static cache; ``lengths`` are the token counts that run compiled.
    With ``aux_layers``, every forward also leaves ``aux`` [T, k * H] (as CachedLM does)."""

    def __init__(self, model: torch.nn.Module, role: str, capacity: int, lengths: tuple[int, ...],
                 aux_layers: tuple[int, ...] = ()) -> None:
        self.model = model
        self.aux_layers = tuple(aux_layers)
        self.aux: torch.Tensor | None = None
        self.session = session(model, role, self.aux_layers)
        self.session.reserve(capacity)
        self.lengths = tuple(sorted(set(lengths)))
        self.precompile()
        self.length = 0

    @torch.inference_mode()
    def precompile(self) -> None:
        """Compile every step this decoder may call now, so that no compilation happens mid-generation."""
        device = next(self.model.parameters()).device
        for n in self.lengths:
            if n not in self.session.steps and n <= self.session.capacity:
                self.session.set_position(0)
                self.session.step(n)(torch.zeros(1, n, dtype=torch.long, device=device))
        self.session.set_position(0)

    @property
    def vocab_size(self) -> int:
        return lm_head_rows(self.model)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, last_only: bool = False, keep: int = 0) -> torch.Tensor:
        """Append ``tokens`` [1, T]; logits [T, V] (or [1, V] with ``last_only``, the last ``keep`` rows with
        ``keep`` > 0). Padded up to a compiled length."""
        n = tokens.shape[1]
        if self.length + n > self.session.capacity:
            raise ValueError(f"the static cache holds {self.session.capacity} positions; cannot append {n} to "
                             f"{self.length}")
        padded = next((t for t in self.lengths if t >= n), None)
        if padded is None or self.length + padded > self.session.capacity:
            logits, aux = self.session.eager_step(tokens)
        else:
            pad = tokens[:, -1:].expand(1, padded - n)  # any ids: their entries lie beyond the committed length
            logits, aux = self.session.step(padded)(torch.cat([tokens, pad], dim=1) if padded > n else tokens)
            logits, aux = logits[:n], None if aux is None else aux[:n]
        self.aux = aux
        self.length += n
        if padded != n:
            self.session.set_position(self.length)
        return logits[-1:] if last_only else logits[-keep:] if keep else logits

    @torch.inference_mode()
    def precompile_chain(self, lengths: tuple[int, ...], steps: int, choose: Callable[[torch.Tensor], torch.Tensor],
                         name: str) -> None:
        """Compile Session.chain for each of ``lengths`` now (before the sequence starts), so that none compiles
        mid-generation."""
        device = next(self.model.parameters()).device
        for length in lengths:
            if ("chain", name, length, steps) not in self.session.steps and length + steps <= self.session.capacity:
                self.session.set_position(0)
                run = self.session.chain(length, steps, choose, name)
                if run is not None:
                    run(torch.zeros(1, length, dtype=torch.long, device=device))
        self.session.set_position(self.length)

    def chain(self, tokens: torch.Tensor, steps: int, choose: Callable[[torch.Tensor], torch.Tensor],
              name: str) -> torch.Tensor | None:
        """Session.chain over ``tokens`` [1, T]: the ``steps`` picked tokens [steps] in one compiled call, the cache
        advanced by T + steps - 1; None (nothing run) when the session runs eagerly or that would outrun the cache."""
        grown = self.length + tokens.shape[1] + steps - 1
        run = self.session.chain(tokens.shape[1], steps, choose, name) if grown <= self.session.capacity else None
        if run is None:
            return None
        picked = run(tokens)
        self.length = grown
        return picked

    def rollback(self, num_tokens: int) -> None:
        """Forget the last ``num_tokens`` tokens: move the write position back."""
        if num_tokens < 0 or num_tokens > self.length:
            raise ValueError(f"cannot roll back {num_tokens} tokens from a cache of {self.length}")
        if num_tokens:
            self.length -= num_tokens
            self.session.set_position(self.length)


def cached_lm(model: torch.nn.Module, compile: bool, role: str, capacity: int,
              lengths: tuple[int, ...], aux_layers: tuple[int, ...] = ()) -> CachedLM | StaticLM:
    """A ``StaticLM`` when ``compile`` (falling back, with a warning, to the eager ``CachedLM`` for a model whose
    cache cannot be static), else a ``CachedLM``; both leave ``aux`` after each forward when given ``aux_layers``."""
    if not compile:
        return CachedLM(model, aux_layers, capacity)
    try:
        return StaticLM(model, role, capacity, lengths, aux_layers)
    except StaticCacheUnsupported as err:
        warnings.warn(f"{err}: no static cache, decoding it eagerly", RuntimeWarning, stacklevel=2)
        return CachedLM(model, aux_layers, capacity)
