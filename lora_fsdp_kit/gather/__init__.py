"""One LoRA gather: each unit's sharded view, the rank votes that keep collectives in step, the heartbeats that tell a
dead rank from a slow one, the packed all-gather, peft's names, the merged weights."""
