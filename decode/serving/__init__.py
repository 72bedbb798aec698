"""Measuring a draft inside a serving engine (vLLM): the worker run in vLLM's own interpreter (vllm_worker.py, stdlib
+ vllm only), our side that starts it and reads its counters (vllm_engine.py, counters.py), and the side-by-side
comparison with our engine (parity.py)."""
