"""accel-precision."""
