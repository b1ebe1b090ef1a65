"""chattts_operator."""
