"""accel-bigmodel."""
