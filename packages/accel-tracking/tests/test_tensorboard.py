import numpy as np
import pytest

from accel_tracking import TensorBoardTracker, TrackerValueWarning, resolve_trackers

pytest.importorskip("tensorboard")
if not TensorBoardTracker.is_available():
    pytest.skip("TensorBoard needs torch or tensorboardX to write", allow_module_level=True)


def _accumulator(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"tensors": 0, "scalars": 0, "images": 0})
    acc.Reload()
    return acc


def test_scalars_text_hparams_images_read_back(tmp_path):
    (tracker,) = resolve_trackers(
        "tensorboard", "proj", logging_dir=tmp_path, config={"lr": 0.01, "opt": {"name": "adam"}}
    )
    losses = [1.0, 0.5, 0.25]
    for step, loss in enumerate(losses):
        with pytest.warns(TrackerValueWarning) if step == 0 else _nothing():
            tracker.log(
                {"loss": np.float32(loss), "eval": {"acc": step / 10}, "skip": None}, step=step
            )
    tracker.log({"phase": "finetune"}, step=3)
    image = np.zeros((4, 5, 3), dtype=np.uint8)
    image[..., 0] = 255
    tracker.log_images({"sample": image}, step=2, dataformats="HWC")
    tracker.finish()

    acc = _accumulator(tmp_path / "proj")
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == list(enumerate(losses))
    assert [round(e.value, 6) for e in acc.Scalars("eval/acc")] == [0.0, 0.1, 0.2]
    assert "skip" not in acc.Tags()["scalars"]
    (text,) = acc.Tensors("phase/text_summary")
    assert text.step == 3 and text.tensor_proto.string_val == [b"finetune"]
    (img,) = acc.Images("sample")
    assert (img.step, img.width, img.height) == (2, 5, 4)

    plugin = acc.PluginTagToContent("hparams")
    from tensorboard.plugins.hparams import plugin_data_pb2

    data = plugin_data_pb2.HParamsPluginData.FromString(plugin["_hparams_/session_start_info"])
    hparams = data.session_start_info.hparams
    assert hparams["lr"].number_value == pytest.approx(0.01)
    assert hparams["opt/name"].string_value == "adam"


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
