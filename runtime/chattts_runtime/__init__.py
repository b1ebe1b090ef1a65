"""chattts_runtime."""
