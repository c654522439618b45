"""The rollout: LoRA weights from the trainer's shards into an inference engine (vLLM, peft), certified."""
