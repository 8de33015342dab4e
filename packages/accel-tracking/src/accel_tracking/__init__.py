"""accel-tracking."""
