"""Experiment tracking on the Accelerator: trackers live on the main process only."""

from __future__ import annotations

from typing import Any


class _NoOpTracker:
    """What `get_tracker` returns on processes that do not log: every call does nothing."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tracker = None

    def __getattr__(self, attribute: str) -> Any:
        return lambda *args, **kwargs: None


class TrackingMixin:
    is_main_process: bool
    logging_dir: str | None
    strategy: Any

    def _init_tracking(self, log_with: Any) -> None:
        self.log_with = log_with
        self.trackers: list[Any] = []
        if self.is_main_process:
            # imported on use, so that importing accel does not load every tracker module
            from accel_tracking import filter_trackers

            filter_trackers(log_with, self.logging_dir)  # fail early on a bad name

    def init_trackers(
        self,
        project_name: str,
        config: dict[str, Any] | None = None,
        init_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Start the trackers of `log_with` on the main process and store `config`."""
        if not self.is_main_process:
            return
        from accel_tracking import resolve_trackers

        self.trackers = resolve_trackers(
            self.log_with,
            project_name,
            logging_dir=self.logging_dir,
            init_kwargs=init_kwargs,
            config=config,
        )

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called `name` (its underlying run with ``unwrap``); a do-nothing
        stand-in on the other processes, so code need not check the rank."""
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        if not self.is_main_process:
            return _NoOpTracker(name)
        names = [t.name for t in self.trackers]
        raise ValueError(f"No tracker named {name!r} was started; started: {names}.")

    def log(
        self,
        values: dict[str, Any],
        step: int | None = None,
        log_kwargs: dict[str, dict] | None = None,
    ) -> None:
        """Log `values` to every tracker (main process only)."""
        if not self.is_main_process:
            return
        log_kwargs = log_kwargs or {}
        for tracker in self.trackers:
            tracker.log(values, step=step, **log_kwargs.get(tracker.name, {}))

    def end_training(self) -> None:
        """Finish every tracker (main process only), stop what the strategy started (its
        `close`: torchft's manager, ...), then close the process group; call once, at the
        end, on every process (no barrier: a script that calls it on the main process only
        does not hang). A second call does nothing more."""
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []
        pending = getattr(self, "_pending_save", None)
        if pending is not None:  # an asynchronous save_state still writing: let it finish
            self._pending_save = None
            pending.join()
            pending.raise_error()
        self.strategy.close()
        self.state.destroy_process_group()
