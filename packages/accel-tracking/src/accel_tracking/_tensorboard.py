"""TensorBoard: event files under ``<logging_dir>/<run_name>``.

Written with torch's `SummaryWriter` (torch.utils.tensorboard, which needs the `tensorboard`
package) or, without torch, with tensorboardX's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from accel_tracking._base import GeneralTracker, import_optional, module_installed
from accel_tracking._values import coerce_step, param_values, scalar_values


def _writer_modules() -> tuple[Any, Any]:
    """(SummaryWriter class, module with `hparams`) from torch, else from tensorboardX."""
    if module_installed("torch"):
        import_optional("tensorboard", "tensorboard", "tensorboard")
        writer = import_optional("torch.utils.tensorboard", "tensorboard", "tensorboard")
        summary = import_optional("torch.utils.tensorboard.summary", "tensorboard", "tensorboard")
        return writer.SummaryWriter, summary
    tbx = import_optional("tensorboardX", "tensorboard", "tensorboard")
    return tbx.SummaryWriter, import_optional("tensorboardX.summary", "tensorboard", "tensorboard")


class TensorBoardTracker(GeneralTracker):
    """Log scalars, text, hyperparameters and images to TensorBoard event files.

    Numbers go to `add_scalar`, strings to `add_text`; `kwargs` are passed to `SummaryWriter`.
    """

    name = "tensorboard"
    requires_logging_directory = True
    writes_to_urls = True  # TensorBoard's own file layer writes s3:// (boto3), gs://, ...
    extra = "tensorboard"
    libraries = ("tensorboard",)

    @classmethod
    def is_available(cls) -> bool:
        return module_installed("tensorboard") and (
            module_installed("torch") or module_installed("tensorboardX")
        )

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        if logging_dir is None:
            raise ValueError("TensorBoardTracker needs a logging_dir; got None.")
        self._writer_cls, self._summary = _writer_modules()
        self.run_name = run_name
        # os.path.join keeps a URL's "//" (s3://...), which a Path would collapse into "s3:/"
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.init_kwargs = kwargs
        self._writer: Any = None
        self._warned: set[str] = set()

    def start(self) -> None:
        if self._writer is None:
            self._writer = self._writer_cls(log_dir=str(self.logging_dir), **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        """The `SummaryWriter`."""
        self.start()
        return self._writer

    def store_init_configuration(self, values: Mapping[str, Any]) -> None:
        """Write the hyperparameters for TensorBoard's HParams tab, into this run's files."""
        hparams = param_values(values, tracker=self.name, warned=self._warned)
        writer = self.tracker
        for summary in self._summary.hparams(hparams, {}):
            writer.file_writer.add_summary(summary)
        writer.flush()

    def log(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        step = coerce_step(step)
        writer = self.tracker
        for key, value in scalar_values(
            values, tracker=self.name, warned=self._warned, strings=True
        ).items():
            if isinstance(value, str):
                writer.add_text(key, value, global_step=step, **kwargs)
            else:
                writer.add_scalar(key, value, global_step=step, **kwargs)
        writer.flush()

    def log_images(self, values: Mapping[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """`add_image` per entry; pass ``dataformats="HWC"`` for height-width-channel arrays."""
        step = coerce_step(step)
        writer = self.tracker
        for key, image in values.items():
            writer.add_image(key, image, global_step=step, **kwargs)
        writer.flush()

    def finish(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
