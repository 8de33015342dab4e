"""accel-tracking: experiment trackers behind one small interface.

`resolve_trackers(log_with, project_name, ...)` turns a name, ``"all"``, a tracker instance
or a list of those into started trackers; each has `store_init_configuration`, `log`,
`log_images`, `log_table` and `finish`. The default tracker, ``"jsonl"``, needs no library;
the others import theirs only when created. Importing this package imports none of them.
"""

from accel_tracking._aim import AimTracker
from accel_tracking._base import GeneralTracker
from accel_tracking._clearml import ClearMLTracker
from accel_tracking._comet import CometMLTracker
from accel_tracking._dvclive import DVCLiveTracker
from accel_tracking._jsonl import JSONLTracker, read_jsonl
from accel_tracking._mlflow import MLflowTracker
from accel_tracking._plot import (
    STEP_METRICS,
    jsonl_figure,
    plot_jsonl,
    plot_step_metrics,
    scalar_series,
)
from accel_tracking._registry import (
    TRACKER_CLASSES,
    available_trackers,
    filter_trackers,
    get_tracker,
    known_trackers,
    register_tracker_class,
    resolve_trackers,
    unregister_tracker_class,
)
from accel_tracking._swanlab import SwanLabTracker
from accel_tracking._tensorboard import TensorBoardTracker
from accel_tracking._trackio import TrackioTracker
from accel_tracking._values import TrackerValueWarning, flatten_dict
from accel_tracking._wandb import WandBTracker

__version__ = "0.1.0"

__all__ = [
    "STEP_METRICS",
    "TRACKER_CLASSES",
    "AimTracker",
    "ClearMLTracker",
    "CometMLTracker",
    "DVCLiveTracker",
    "GeneralTracker",
    "JSONLTracker",
    "MLflowTracker",
    "SwanLabTracker",
    "TensorBoardTracker",
    "TrackerValueWarning",
    "TrackioTracker",
    "WandBTracker",
    "available_trackers",
    "filter_trackers",
    "flatten_dict",
    "get_tracker",
    "jsonl_figure",
    "known_trackers",
    "plot_jsonl",
    "plot_step_metrics",
    "read_jsonl",
    "register_tracker_class",
    "resolve_trackers",
    "scalar_series",
    "unregister_tracker_class",
]
