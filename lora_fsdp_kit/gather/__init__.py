"""One LoRA gather: each unit's sharded view, the rank votes that keep collectives in step, the packed all-gather, peft's names, the merged weights."""
