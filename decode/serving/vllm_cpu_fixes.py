"""A fix for vLLM 0.32's CPU build, applied in every process that runs vLLM's sampler: our offline worker
(decode/serving/vllm_worker.py) and the `vllm` command that `make serving` installs (scripts/vllm_cpu.py, for
`vllm serve`). Standard library, torch and vllm only: this file is run by path, or copied into the serving venv as
`specdistill_vllm_cpu_fixes`, where our package cannot be imported.

The bug: the CPU stand-in for vLLM's Triton `expand_kernel` hands the C++ op an int64 *copy* of a float output, so
the per-token temperatures of speculative sampling stay uninitialised memory. At temperature > 0 the target's logits
are divided by garbage (+-inf, 1e23): the acceptance test reads garbage probabilities and the served text is garbage
too (a draft identical to the target: tau 1.0-1.3 instead of 1 + gamma; the SmolLM2 head behind `vllm serve`: 0
drafts accepted). Greedy requests never reach it. Where the installed vLLM shows the bug, `patch_cpu_expand` swaps
in the same expansion in plain torch; GPU builds (Triton kernels) are left alone.
"""
from __future__ import annotations


def expand_batch_to_tokens(x, cu_num_tokens, num_tokens: int, replace_from: int = 0, replace_to: int = 0):
    """vLLM's rejection_sampler.expand_batch_to_tokens in plain torch: x [B] -> [num_tokens], x_b repeated for the
    tokens of request b (cu_num_tokens: cumulative counts), values equal to replace_from set to replace_to."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())  # [B]
    y = torch.where(x == replace_from, torch.as_tensor(replace_to, dtype=x.dtype, device=x.device), x)
    return torch.repeat_interleave(y, counts, output_size=num_tokens)


def patch_cpu_expand() -> bool:
    """Replace vLLM's expand_batch_to_tokens in this process when it gets floats wrong on this platform; True when
    it was replaced. Spawned engine and worker processes must call it too (they import vLLM afresh)."""
    import torch
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    current_platform.register_triton_kernel_overrides()
    from vllm.v1.sample import rejection_sampler

    temperatures, cumulative = torch.tensor([1.0, 0.7]), torch.tensor([4, 8], dtype=torch.int32)
    got = rejection_sampler.expand_batch_to_tokens(temperatures, cumulative, 8)
    if torch.equal(got, temperatures.repeat_interleave(4)):
        return False
    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    return True
