"""The decoding loop: sampling, KV caches (dynamic, static and compiled), the Drafter protocol, speculative and plain
decoding (batch 1 and batched), the per-step counts and clock, and `gamma="auto"`."""
