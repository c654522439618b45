"""Fixtures for the kit's own tests: tiny models, real multi-rank runs and their references. Not for users."""
