"""Familiar path `accelerate.tracking`: re-exports from the packages that own the code."""

from accel_state import on_main_process
from accel_tracking import (
    AimTracker,
    ClearMLTracker,
    CometMLTracker,
    DVCLiveTracker,
    GeneralTracker,
    JSONLTracker,
    MLflowTracker,
    SwanLabTracker,
    TensorBoardTracker,
    TrackioTracker,
    WandBTracker,
    filter_trackers,
    get_tracker,
    register_tracker_class,
)
from accel_tracking import available_trackers as get_available_trackers

__all__ = [
    "AimTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "JSONLTracker",
    "MLflowTracker",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackioTracker",
    "WandBTracker",
    "filter_trackers",
    "get_available_trackers",
    "get_tracker",
    "on_main_process",
    "register_tracker_class",
]
