"""The plan: which modules become FSDP units (policies, the WrapConfig, the job), what FSDP will refuse (checks), and the pictures of it (viz)."""
