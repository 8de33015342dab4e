"""accel-data."""
