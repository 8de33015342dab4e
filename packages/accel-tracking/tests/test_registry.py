import pytest

from accel_tracking import (
    GeneralTracker,
    JSONLTracker,
    available_trackers,
    filter_trackers,
    get_tracker,
    known_trackers,
    read_jsonl,
    register_tracker_class,
    resolve_trackers,
    unregister_tracker_class,
)

BUILTIN = [
    "jsonl",
    "tensorboard",
    "wandb",
    "mlflow",
    "comet_ml",
    "aim",
    "clearml",
    "dvclive",
    "swanlab",
    "trackio",
]
EXTRAS = {
    "comet_ml": "comet",
    "aim": "aim",
    "clearml": "clearml",
    "dvclive": "dvclive",
    "swanlab": "swanlab",
    "trackio": "trackio",
}


class ListTracker(GeneralTracker):
    """A custom tracker that keeps what it is given."""

    name = "list"
    requires_logging_directory = False

    def __init__(self, run_name, **kwargs):
        self.run_name, self.kwargs = run_name, kwargs
        self.started = self.finished = 0
        self.config, self.logged = None, []

    def start(self):
        self.started += 1

    @property
    def tracker(self):
        return self.logged

    def store_init_configuration(self, values):
        self.config = values

    def log(self, values, step=None, **kwargs):
        self.logged.append((step, dict(values)))

    def finish(self):
        self.finished += 1


@pytest.fixture
def list_tracker():
    register_tracker_class(ListTracker)
    yield ListTracker
    unregister_tracker_class("list")


def test_names():
    assert known_trackers() == BUILTIN
    assert get_tracker("JSONL") is JSONLTracker
    installed = available_trackers()
    assert "jsonl" in installed
    for name in BUILTIN:
        assert (name in installed) == get_tracker(name).is_available()


def test_enum_names_are_accepted(tmp_path):
    enum = pytest.importorskip("accel_state").LoggerType
    assert filter_trackers([enum.JSONL, "jsonl"], tmp_path) == ["jsonl"]


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="Unknown tracker 'wandbb'.*jsonl, tensorboard, wandb"):
        filter_trackers(["wandbb"])
    with pytest.raises(TypeError, match="tracker names"):
        filter_trackers([3])


def test_missing_library_names_the_extra():
    missing = [n for n in EXTRAS if not get_tracker(n).is_available()]
    if not missing:
        pytest.skip("every optional tracker library is installed")
    for name in missing:
        with pytest.raises(ImportError, match=rf"pip install accel-tracking\[{EXTRAS[name]}\]"):
            filter_trackers(name)
        with pytest.raises(ImportError, match=rf"pip install accel-tracking\[{EXTRAS[name]}\]"):
            get_tracker(name)("project")


def test_logging_dir_required():
    with pytest.raises(ValueError, match="Logging with `jsonl` requires a `logging_dir`"):
        filter_trackers("jsonl")
    with pytest.raises(ValueError, match="logging_dir"):
        filter_trackers("all")


def test_all_is_the_installed_trackers_plus_instances(tmp_path, list_tracker):
    mine = ListTracker("x")
    assert filter_trackers(None) == []
    result = filter_trackers([mine, "all", "jsonl", mine], tmp_path)
    assert result[0] is mine and len(result) == 1 + len(available_trackers())
    assert result[1:] == available_trackers() and "list" in result


def test_resolve_creates_starts_and_stores_config(tmp_path, list_tracker):
    instance = ListTracker("given")
    init_kwargs = {"list": {"color": "red"}, "jsonl": None}
    config = {"lr": 0.1, "nested": {"a": 1}}
    trackers = resolve_trackers(
        ["jsonl", "list", instance],
        "proj",
        logging_dir=tmp_path,
        init_kwargs=init_kwargs,
        config=config,
    )
    jsonl, by_name, given = trackers
    assert isinstance(jsonl, JSONLTracker) and jsonl.run_dir == tmp_path / "proj"
    assert isinstance(by_name, ListTracker) and by_name.run_name == "proj"
    assert by_name.kwargs == {"color": "red"} and given is instance
    assert by_name.started == given.started == 1
    assert by_name.config == given.config == config
    assert init_kwargs == {"list": {"color": "red"}, "jsonl": None}
    for t in trackers:
        t.log({"loss": 1.0}, step=3)
        t.finish()
    assert given.logged == [(3, {"loss": 1.0})]
    assert read_jsonl(tmp_path / "proj")[0]["values"] == {"loss": 1.0}


def test_init_kwargs_for_unused_tracker_warns(tmp_path):
    with pytest.warns(UserWarning, match="'wandb'"):
        (tracker,) = resolve_trackers("jsonl", "p", logging_dir=tmp_path, init_kwargs={"wandb": {}})
    tracker.finish()
    with pytest.raises(TypeError, match=r"init_kwargs\['jsonl'\]"):
        resolve_trackers("jsonl", "p", logging_dir=tmp_path, init_kwargs={"jsonl": 3})


def test_a_failing_tracker_finishes_those_already_started(tmp_path):
    class Broken(ListTracker):
        name = "broken"

        def start(self):
            raise RuntimeError("cannot reach the server")

    first = ListTracker("a")
    with pytest.raises(RuntimeError, match="cannot reach"):
        resolve_trackers([first, Broken("b")], "p")
    assert first.finished == 1


def test_register_rules(list_tracker):
    with pytest.raises(ValueError, match="already registered"):
        register_tracker_class(JSONLTracker, "list")
    with pytest.raises(ValueError, match="reserved"):
        register_tracker_class(ListTracker, "all")
    with pytest.raises(TypeError, match="requires_logging_directory"):
        register_tracker_class(object, "thing")
    register_tracker_class(ListTracker, "jsonl", overwrite=True)
    assert get_tracker("jsonl") is ListTracker
    unregister_tracker_class("jsonl")
    assert get_tracker("jsonl") is JSONLTracker
    with pytest.raises(ValueError, match="No custom tracker"):
        unregister_tracker_class("jsonl")


def test_base_defaults_warn_instead_of_raising():
    class Minimal(GeneralTracker):
        name = "minimal"

        def log(self, values, step=None, **kwargs):
            pass

    tracker = Minimal()
    tracker.start()
    tracker.store_init_configuration({"a": 1})
    with pytest.warns(UserWarning, match="'minimal' tracker has no log_images"):
        tracker.log_images({"img": None}, step=0)
    with pytest.warns(UserWarning, match="has no log_table"):
        tracker.log_table("t", ["a"], [[1]])
    tracker.finish()
    with pytest.raises(NotImplementedError, match="GeneralTracker does not implement log"):
        GeneralTracker().log({"a": 1})


def test_duck_typed_tracker_instance_is_accepted():
    class Foreign:  # e.g. a tracker written for another library, with the same shape
        name = "foreign"
        requires_logging_directory = False

        def __init__(self):
            self.logged = []

        def start(self):
            pass

        def log(self, values, step=None, **kwargs):
            self.logged.append(step)

        def finish(self):
            pass

    (tracker,) = resolve_trackers(Foreign(), "p")
    tracker.log({"a": 1}, step=5)
    assert tracker.logged == [5]


def test_tracker_classes_is_the_live_registry(list_tracker):
    from accel_tracking import TRACKER_CLASSES

    assert TRACKER_CLASSES["list"] is list_tracker
    assert list(TRACKER_CLASSES)[: len(BUILTIN)] == BUILTIN
    snapshot = dict(TRACKER_CLASSES)
    TRACKER_CLASSES.pop("list")
    assert "list" not in known_trackers()
    TRACKER_CLASSES.update(snapshot)
    assert get_tracker("list") is list_tracker


def test_missing_logging_directory_is_named():
    # jsonl needs no library, so this holds wherever accel-tracking is installed
    with pytest.raises(ValueError, match="Logging with `jsonl` requires a `logging_dir`"):
        filter_trackers("jsonl", None)
