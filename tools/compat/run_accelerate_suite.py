"""Run HuggingFace Accelerate's own test suite against accel, beside accelerate's own figures.

    uv run python tools/compat/run_accelerate_suite.py            # the whole suite, both sides
    uv run python tools/compat/run_accelerate_suite.py --fast     # the subset `uv run pytest` runs
    uv run python tools/compat/run_accelerate_suite.py --side accel -k test_data_loader.py
    uv run python tools/compat/run_accelerate_suite.py --scripts            # only the scripts
    uv run python tools/compat/run_accelerate_suite.py --scripts test_ops.py --procs 2

What it does:
1. Fetches accelerate's source distribution (a fixed version) from the package registry into
   a cache (`$ACCEL_COMPAT_CACHE`, default `~/.cache/accel-compat`), once.
2. Lays out two work trees from its `tests/` and `src/accelerate/test_utils/`:
   - `accelerate/`: the files as they are, run against the installed accelerate (the baseline
     on this machine, needs accelerate installed: the dev group has it through peft);
   - `accel/`: every `accelerate` import and command rewritten to `accel`, as a user who
     switches would do. accelerate's test helpers (`test_utils`: its test scripts, regression
     models, decorators) move with the tests as the local package `accel_suite.test_utils`
     (their own imports rewritten too), so they drive accel, not accelerate.
3. Runs pytest on each side in a subprocess (one file at a time, so an import failure or a
   hang costs one file only) and prints a per-file table and one summary line.
4. Launches accelerate's distributed test scripts (`test_utils/scripts`, which its tests start
   only on several GPUs) on 1 and 2 CPU processes with `accelerate launch --cpu` / `accel
   launch --cpu`, and prints a table of both sides' results (`_scripts.py`). The whole run does
   this after the tests; `--scripts` does only this; `--fast` and `-k` leave it out.

Nothing of accelerate's is kept in this repository: it is fetched and rewritten at run time.
The tests that still fail on accel, each with its reason, are listed in
`tools/compat/expected_failures.toml`; `--check` fails when a test outside that list fails
(or an accel figure falls below the list's floor); scripts are listed under
`[script_failures]` there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

import tomllib

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _scripts  # the sibling module (this file runs as a script)

VERSION = "1.15.0"
SDIST = f"accelerate-{VERSION}.tar.gz"
HERE = Path(__file__).resolve().parent
EXPECTED = HERE / "expected_failures.toml"
# The fast subset `uv run pytest` runs (packages/accel/tests/test_accelerate_suite.py): files
# that together take well under two minutes here and cover the names users import first.
FAST_FILES = (
    "test_imports.py",
    "test_dataclasses.py",
    "test_data_loader.py",
    "test_hooks.py",
    "test_modeling_utils.py",
    "test_offload.py",
    "test_memory_utils.py",
    "test_logging.py",
    "test_optimizer.py",
    "test_utils.py",
)
FILE_TIMEOUT_S = 900
# the only accepted reasons for an accel failure (expected_failures.toml says what each means)
REASONS = ("hardware", "library", "network", "sdist", "difference", "bug")
_IMPORT = re.compile(r"\baccelerate\b")


def cache_dir() -> Path:
    return Path(os.environ.get("ACCEL_COMPAT_CACHE", Path.home() / ".cache" / "accel-compat"))


def fetch_sdist(cache: Path) -> Path:
    """The extracted sdist; downloads it from the package registry the first time."""
    root = cache / f"accelerate-{VERSION}"
    if (root / "tests").is_dir():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / SDIST
    if not archive.exists():
        _download(archive)
    tmp = cache / f".extract-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
    (tmp / f"accelerate-{VERSION}").rename(root)
    shutil.rmtree(tmp, ignore_errors=True)
    return root


def _download(archive: Path) -> None:
    """pip, through uv, knows this machine's registry settings (the project's venv has no pip)."""
    pip_args = ["download", f"accelerate=={VERSION}", "--no-binary", ":all:", "--no-deps"]
    pip_args += ["-d", str(archive.parent), "--quiet"]
    tries = []
    if shutil.which("uvx"):
        tries.append(["uvx", "pip", *pip_args])
    tries.append([sys.executable, "-m", "pip", *pip_args])
    for cmd in tries:
        if subprocess.run(cmd, capture_output=True).returncode == 0 and archive.exists():
            return
    raise SystemExit(
        f"could not download accelerate {VERSION}'s source distribution with {tries[0][0]}; "
        f"put {SDIST} into {archive.parent} by hand (pip download accelerate=={VERSION} "
        "--no-binary :all: --no-deps)"
    )


def rewrite(text: str) -> str:
    """accelerate's imports, module paths and command name, as a switching user writes them."""
    text = text.replace("accelerate.test_utils", "accel_suite.test_utils")
    # the helper that finds test scripts inside the package: they live beside the tests now
    text = text.replace("inspect.getfile(accelerate)", "inspect.getfile(accel_suite)")
    text = text.replace("import accelerate\n", "import accel\nimport accel_suite\n", 1)
    return _IMPORT.sub("accel", text)


def _absolute_imports(text: str, depth: int) -> str:
    """Relative imports that climb out of test_utils (`from ..state`) name accel instead."""

    def fix(m: re.Match) -> str:
        dots, rest = m[1], m[2]
        return f"from accel{'.' + rest if rest else ''} import" if len(dots) > depth else m[0]

    return re.sub(r"^from (\.+)([\w.]*) import", fix, text, flags=re.M)


def lay_out(sdist: Path, work: Path, side: str) -> Path:
    """The work tree of one side. Files are written only where their text changed, so runs
    that share the tree (several at once) never pull a file from under each other."""
    utils = sdist / "src" / "accelerate" / "test_utils"
    files = {
        work / "tests" / p.relative_to(sdist / "tests"): p for p in (sdist / "tests").rglob("*")
    }
    if side == "accel":
        files.update(
            {
                work / "accel_suite" / "test_utils" / p.relative_to(utils): p
                for p in utils.rglob("*")
            }
        )
    for dest, src in files.items():
        if src.is_dir():
            continue
        if src.suffix != ".py" or side != "accel":
            _write_if_changed(dest, src.read_bytes())
            continue
        text = src.read_text()
        if "test_utils" in dest.parts:
            depth = len(dest.relative_to(work / "accel_suite" / "test_utils").parts)
            text = _absolute_imports(text, depth)
        _write_if_changed(dest, rewrite(text).encode())
    if side == "accel":
        _write_if_changed(work / "accel_suite" / "__init__.py", b"")
    _write_if_changed(work / "pytest.ini", b"[pytest]\naddopts = -p no:cacheprovider\n")
    return work


def _write_if_changed(path: Path, data: bytes) -> None:
    if path.exists() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(data)
    tmp.replace(path)


@dataclass
class FileResult:
    name: str
    counts: dict[str, int] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    note: str = ""


def run_files(work: Path, names: list[str], extra: list[str]) -> dict[str, FileResult]:
    """One pytest process over `names`; per-test outcomes from its JUnit report."""
    env = dict(os.environ, PYTHONPATH=str(work), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    # MLflow 3 refuses the ./mlruns file store the tracking tests use unless told it may
    env.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    env.pop("ACCEL_AS_ACCELERATE", None)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    tag = names[0] if len(names) == 1 else f"batch-{os.getpid()}"
    report = logs / f"{tag}.{os.getpid()}.xml"
    cmd = [sys.executable, "-m", "pytest", *(f"tests/{n}" for n in names), "-q", "-rfE"]
    cmd += ["--rootdir", str(work), "-c", str(work / "pytest.ini"), "-o", "junit_family=xunit1"]
    cmd += ["--continue-on-collection-errors", f"--junitxml={report}", *extra]
    start = time.perf_counter()
    results = {n: FileResult(n) for n in names}
    try:
        proc = subprocess.run(
            cmd, cwd=work, env=env, capture_output=True, text=True, timeout=FILE_TIMEOUT_S
        )
        out = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        for res in results.values():
            res.note = f"timed out after {FILE_TIMEOUT_S} s"
    (logs / f"{tag}.log").write_text(out)
    if report.exists():
        _read_junit(report, results)
        report.unlink()
    seconds = time.perf_counter() - start
    for res in results.values():
        res.seconds = seconds / len(names)
        if not res.counts:  # nothing reported: the file did not even load
            res.counts["error"] = 1
            res.failed = [f"tests/{res.name}"]
            res.note = res.note or "no test reported (see the log)"
    return results


def _read_junit(report: Path, results: dict[str, FileResult]) -> None:
    for case in ElementTree.parse(report).iter("testcase"):
        file = case.get("file") or ""
        classname = case.get("classname") or ""
        parts = classname.split(".")
        name = Path(file).name or (parts[1] + ".py" if len(parts) > 1 else "")
        if name not in results:  # pytest's own INTERNALERROR: the file's count says it
            continue
        cls = classname.split(".")[2:]
        test_id = "::".join([f"tests/{name}", *cls, case.get("name", "")])
        kinds = {child.tag for child in case}
        kind = "error" if "error" in kinds else "failed" if "failure" in kinds else None
        kind = kind or ("skipped" if "skipped" in kinds else "passed")
        res = results[name]
        res.counts[kind] = res.counts.get(kind, 0) + 1
        if kind in ("error", "failed"):
            res.failed.append(test_id)


def load_expected() -> dict:
    if not EXPECTED.exists():
        return {"failures": {}}
    with open(EXPECTED, "rb") as f:
        data = tomllib.load(f)
    data.setdefault("failures", {})
    data.setdefault("script_failures", {})
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--side", choices=("both", "accel", "accelerate"), default="both")
    ap.add_argument("--fast", action="store_true", help="only the subset pytest runs")
    ap.add_argument("-k", "--files", nargs="*", help="only these test files (test_x.py)")
    ap.add_argument("--check", action="store_true", help="fail on an unlisted accel failure")
    ap.add_argument(
        "--scripts",
        nargs="*",
        metavar="SCRIPT",
        help="only accelerate's distributed test scripts (all, or these: test_ops.py, "
        "external_deps/test_metrics.py)",
    )
    ap.add_argument(
        "--procs",
        nargs="+",
        type=int,
        default=list(_scripts.PROCESS_COUNTS),
        help="process counts the scripts are launched with (default: 1 2)",
    )
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("pytest_args", nargs="*", help="passed on to pytest (after --)")
    args = ap.parse_args(argv)

    sdist = fetch_sdist(cache_dir())
    names = sorted(p.name for p in (sdist / "tests").glob("test_*.py"))
    if args.fast:
        names = [n for n in names if n in FAST_FILES]
    if args.files:
        names = [n for n in names if n in args.files]
    if args.scripts is not None:
        names = []
    sides = ["accelerate", "accel"] if args.side == "both" else [args.side]
    if "accelerate" in sides and not _has_accelerate():
        print("accelerate is not installed here: running the accel side only", file=sys.stderr)
        sides.remove("accelerate")
    results: dict[str, dict[str, FileResult]] = {}
    for side in sides:
        work = lay_out(sdist, cache_dir() / "work" / side, side)
        results[side] = {}
        batches = [names] if args.fast else [[n] for n in names]
        for batch in batches:
            if not batch:
                continue
            for name, res in run_files(work, batch, args.pytest_args).items():
                results[side][name] = res
                print(f"  {side:10} {name:52} {_fmt(res.counts)}  {res.seconds:5.0f}s", flush=True)
    if names:
        _report(names, results)
    script_results = {}
    if args.scripts is not None or not (args.fast or args.files):
        script_results = _run_scripts(sdist, sides, args.scripts or [], tuple(args.procs))
    if args.json:
        data = {s: {n: vars(r) for n, r in rs.items()} for s, rs in results.items()}
        data["scripts"] = {
            s: {k: vars(r) | {"log": ""} for k, r in rs.items()} for s, rs in script_results.items()
        }
        args.json.write_text(json.dumps(data, indent=1))
    if args.check and "accel" in results:
        status = _check(results["accel"]) if names else 0
        if "accel" in script_results:
            status |= _check_scripts(script_results["accel"])
        return status
    return 0


def _run_scripts(
    sdist: Path, sides: list[str], only: list[str], counts: tuple[int, ...]
) -> dict[str, dict[str, _scripts.Launch]]:
    """Launch the test scripts on each side; print each launch, then the table."""
    installed = sdist / "src" / "accelerate" / "test_utils" / "scripts"
    names = _scripts.script_names(installed)
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise SystemExit(f"no such script: {unknown}; the scripts are {names}")
        names = [n for n in names if n in only]
    results = {}
    for side in sides:
        work = cache_dir() / "work" / side
        rewritten = work / "accel_suite" / "test_utils" / "scripts"
        scripts_dir = installed if side == "accelerate" else rewritten

        def echo(res: _scripts.Launch, side: str = side) -> None:
            print(f"  {side:10} {res.key:56} {_scripts.cell(res)}", flush=True)

        results[side] = _scripts.run_side(side, scripts_dir, work, names, counts, echo)
    print("\n" + _scripts.report(names, counts, results))
    return results


def _check_scripts(rs: dict[str, _scripts.Launch]) -> int:
    problems = _scripts.check(rs, load_expected()["script_failures"], REASONS, EXPECTED.name)
    for line in problems:
        print(line)
    for key in sorted(k for k, r in rs.items() if r.outcome in ("fail", "timeout")):
        if any(key in p for p in problems):
            print(f"\n--- {key}: the end of its log ---\n{_scripts.log_tail(rs[key])}")
    return 1 if problems else 0


def _has_accelerate() -> bool:
    code = "import importlib.util,sys; sys.exit(importlib.util.find_spec('accelerate') is None)"
    return subprocess.run([sys.executable, "-c", code]).returncode == 0


def _fmt(c: dict[str, int]) -> str:
    return " ".join(f"{c.get(k, 0):3d} {k}" for k in ("passed", "failed", "error", "skipped"))


def _total(rs: dict[str, FileResult], kind: str) -> int:
    return sum(r.counts.get(kind, 0) for r in rs.values())


def _report(names: list[str], results: dict[str, dict[str, FileResult]]) -> None:
    sides = list(results)
    head = f"{'file':48}" + "".join(f" | {s:>26}" for s in sides)
    print("\n" + head + "\n" + "-" * len(head))
    for n in names:
        row = f"{n:48}"
        for s in sides:
            c = results[s][n].counts
            fails = c.get("failed", 0) + c.get("error", 0)
            row += f" | {c.get('passed', 0):4d} pass {fails:4d} fail {c.get('skipped', 0):4d} skip"
        print(row)
    print()
    for s in sides:
        rs = results[s]
        fails = _total(rs, "failed") + _total(rs, "error")
        print(
            f"{s}: {_total(rs, 'passed')} passed, {fails} failed, {_total(rs, 'skipped')} skipped"
            f" ({len(rs)} files, accelerate {VERSION}'s suite)"
        )


def _check(rs: dict[str, FileResult]) -> int:
    """Every accel failure must be listed with its reason; a listed test that passes now is
    reported too, so the list does not go stale (it does not fail the check)."""
    listed = load_expected()["failures"]
    bad = {t: why for t, why in listed.items() if why.split(":")[0] not in REASONS}
    for t, why in sorted(bad.items()):
        print(f"{EXPECTED.name}: {t}: the reason must start with one of {REASONS}: {why!r}")
    failed = {t for r in rs.values() for t in r.failed}
    ran = {f"tests/{name}" for name in rs}
    for t in sorted(t for t in listed if t.split("::")[0] in ran and t not in failed):
        print(f"listed but passing now (remove it from {EXPECTED.name}): {t}")
    unlisted = sorted(failed - set(listed))
    for t in unlisted:
        print(f"unlisted failure: {t}  (fix accel, or list it with its reason in {EXPECTED.name})")
    return 1 if unlisted or bad else 0


if __name__ == "__main__":
    sys.exit(main())
