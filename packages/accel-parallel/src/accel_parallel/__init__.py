"""accel-parallel."""
