import subprocess
import sys

import accel_tracking

EXPECTED = [
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


def test_all_is_the_declared_api():
    assert accel_tracking.__all__ == EXPECTED
    assert sorted(EXPECTED, key=lambda n: (not n.isupper(), n)) == EXPECTED
    for name in EXPECTED:
        assert getattr(accel_tracking, name) is not None


def test_import_loads_no_tracker_library():
    code = (
        "import sys, accel_tracking\n"
        "heavy = ['wandb', 'mlflow', 'tensorboard', 'tensorboardX', 'torch', 'numpy',\n"
        "         'matplotlib', 'comet_ml', 'aim', 'clearml', 'dvclive', 'swanlab', 'trackio',\n"
        "         'accel_state']\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
