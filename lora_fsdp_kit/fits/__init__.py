"""Will the step fit? The trace of one training step on the meta device, its report, and the check on real ranks."""
