"""Familiar path `accelerate.tracking`: re-exports from the packages that own the code."""

from accel._compat._environment import (
    str_to_bool,
)
from accel._compat._imports import (
    is_aim_available,
    is_clearml_available,
    is_comet_ml_available,
    is_dvclive_available,
    is_mlflow_available,
    is_swanlab_available,
    is_tensorboard_available,
    is_trackio_available,
    is_wandb_available,
)
from accel._compat._operations import (
    listify,
)
from accel._compat._tracking import register_tracker_class
from accel._compat._versions import (
    compare_versions,
)
from accel._logging import (
    get_logger,
)
from accel_state import (
    LoggerType,
    PartialState,
    on_main_process,
)
from accel_tracking import TRACKER_CLASSES as LOGGER_TYPE_TO_CLASS
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
)
from accel_tracking import available_trackers as get_available_trackers

__all__ = [
    "LOGGER_TYPE_TO_CLASS",
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

# accelerate's module binds these too; users import them from here
__all__ += [
    "LoggerType",
    "PartialState",
    "compare_versions",
    "get_logger",
    "is_aim_available",
    "is_clearml_available",
    "is_comet_ml_available",
    "is_dvclive_available",
    "is_mlflow_available",
    "is_swanlab_available",
    "is_tensorboard_available",
    "is_trackio_available",
    "is_wandb_available",
    "listify",
    "str_to_bool",
]
