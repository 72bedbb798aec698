"""Step 2, load: the frozen target and the trainable draft (load.py), and where their weights live: LoRA drafts
(lora.py), FSDP2 sharding (fsdp.py), launch-mode checks and DeepSpeed ZeRO-3 (distributed.py), EAGLE-3 heads built
from the target's config (heads.py). Nothing is imported here."""
