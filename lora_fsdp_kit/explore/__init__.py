"""The explorer: the plan and "will it fit?" as a live widget."""
