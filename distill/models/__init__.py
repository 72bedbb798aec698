"""Step 2, load: the frozen target and the trainable draft (load.py, the draft built by the recipe's kind), the
served draft inside a kind's training wrapper (served.py), and where their weights live: LoRA drafts (lora.py), FSDP2
sharding (fsdp.py), launch-mode checks and DeepSpeed ZeRO-3 (distributed.py). Nothing is imported here."""
