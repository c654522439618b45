"""Save and load of peft adapters from shards, the streams measured, and the kit inside the HF Trainer."""
