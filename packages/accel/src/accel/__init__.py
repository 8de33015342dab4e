"""accel."""
