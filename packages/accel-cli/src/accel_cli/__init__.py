"""accel-cli."""
