"""Run transformers' own Trainer tests (its `tests/trainer/`) against accelerate and against accel.

    uv run python tools/compat/run_transformers_trainer.py                  # both sides, table, diff
    uv run python tools/compat/run_transformers_trainer.py --check          # exit 1 on a regression
    uv run python tools/compat/run_transformers_trainer.py -k test_trainer_data.py --side accel
    uv run python tools/compat/run_transformers_trainer.py /other/copy --jobs 1

transformers' Trainer is accelerate's largest client, so its test suite is a specification for
accel: every test that passes with the real accelerate should pass with accel switched in
(`ACCEL_AS_ACCELERATE=1` makes `import accelerate` load accel, see accel/_as_accelerate.py).

Where the test files come from, and why they are not in this repository:
    transformers ships neither `tests/` in its wheel nor in its source distribution, so the files
    have to be copied from transformers' GitHub repository. They are another project's code: they
    live in a cache folder outside this repository (default `~/.cache/accel-compat/
    transformers-5.23.0`, or `$ACCEL_COMPAT_CACHE/transformers-5.23.0`, or the folder given as
    argument) and must never be committed here; the runner refuses a folder inside the repository.
    The folder holds `tests/__init__.py`, `tests/trainer/__init__.py`, `tests/trainer/
    trainer_test_utils.py` (the shared helpers every file imports), the `test_*.py` files, and a
    `MANIFEST.json` that names, for each file, the transformers commit (or stored-index id) it was
    copied from, its length and its sha256. The versions were picked to match the installed
    transformers (5.23.0): every import resolves against it and each file's tests agree with its
    behaviour, as far as the stored versions allowed; the remaining skew shows as tests that fail
    on both sides. The runner checks the copies against the manifest and says which differ.

What a run does:
1. Checks the switch: in a fresh interpreter, `accelerate.__version__` must contain "+accel" with
   `ACCEL_AS_ACCELERATE=1` and must not without it; every pytest session also reports which
   accelerate it imported (tools/compat/_transformers_suite_shim.py) and is checked again.
2. Runs pytest once per file and side, offline (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE,
   HF_DATASETS_OFFLINE), with `-p no:cacheprovider`, each in its own process and empty working
   folder (the tests write relative paths), `--jobs` at a time, and reads per-test outcomes from
   its JUnit report. The shim plugin gives placeholders for two names transformers 5.23.0 removed
   (`GlueDataset`, `GlueDataTrainingArguments`, used only by `@slow` tests) so that
   test_trainer_evaluation.py collects; it is loaded on both sides alike.
3. Prints a per-file table (pass/fail/error/skip per side), then every test that passes on
   accelerate but fails on accel with its one-line reason, the count of tests that fail on both,
   tests that pass only on accel, and the slowest tests.

`--check` exits 1 when a test passes on accelerate and fails on accel and is not listed, with its
reason, in `tools/compat/transformers_expected_failures.toml`, or when the switch did not take
effect; entries of that list that no longer fail are printed as stale.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

import tomllib

TRANSFORMERS_VERSION = "5.23.0"
HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
EXPECTED = HERE / "transformers_expected_failures.toml"
SHIM = "_transformers_suite_shim"
SIDES = ("accelerate", "accel")
FILE_TIMEOUT_S = 1800
SLOW_TEST_S = 30.0
REASON_WIDTH = 220


def default_dir() -> Path:
    cache = Path(os.environ.get("ACCEL_COMPAT_CACHE", Path.home() / ".cache" / "accel-compat"))
    return cache / f"transformers-{TRANSFORMERS_VERSION}"


# --------------------------------------------------------------------------------------------
# The copied tests
# --------------------------------------------------------------------------------------------


def check_folder(root: Path) -> list[str]:
    """The test files to run (names under tests/trainer); exits on an unusable folder."""
    root = root.resolve()
    if root == REPO_ROOT or REPO_ROOT in root.parents:
        raise SystemExit(
            f"{root} is inside the repository: transformers' tests must stay outside it "
            f"(default {default_dir()})"
        )
    trainer = root / "tests" / "trainer"
    if not (trainer / "trainer_test_utils.py").is_file():
        raise SystemExit(
            f"no transformers tests in {root}: expected tests/trainer/trainer_test_utils.py and "
            "tests/trainer/test_*.py there (see this script's docstring for where they come from)"
        )
    manifest_path = root / "MANIFEST.json"
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        for rel, info in sorted(manifest.get("files", {}).items()):
            path = root / rel
            if not path.is_file():
                print(f"warning: {rel} is listed in MANIFEST.json but missing", file=sys.stderr)
            elif (
                "sha256" in info and hashlib.sha256(path.read_bytes()).hexdigest() != info["sha256"]
            ):
                print(
                    f"warning: {rel} differs from the copy MANIFEST.json describes", file=sys.stderr
                )
        wanted = manifest.get("transformers")
        if wanted and wanted != _installed_transformers():
            print(
                f"warning: the tests are transformers {wanted}'s, the installed transformers is "
                f"{_installed_transformers()}",
                file=sys.stderr,
            )
    else:
        print(
            f"warning: {manifest_path} is missing; running every test_*.py found", file=sys.stderr
        )
    return sorted(p.name for p in trainer.glob("test_*.py"))


def _installed_transformers() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return "not installed"


# --------------------------------------------------------------------------------------------
# Running one side
# --------------------------------------------------------------------------------------------


def side_env(side: str, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("ACCEL_AS_ACCELERATE", None)
    if side == "accel":
        env["ACCEL_AS_ACCELERATE"] = "1"
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONDONTWRITEBYTECODE="1",
    )
    env.setdefault("OMP_NUM_THREADS", str(threads))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    return env


def accelerate_identity(side: str) -> str:
    """`accelerate.__version__ accelerate.__file__` as a fresh interpreter of that side sees it."""
    code = "import accelerate; print(accelerate.__version__, accelerate.__file__)"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=side_env(side, 1), capture_output=True, text=True
    )
    if proc.returncode:
        return f"import failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
    return proc.stdout.strip()


def switch_ok(side: str, identity: str) -> bool:
    if identity.startswith("import failed"):
        return False
    return ("+accel" in identity.split()[0]) == (side == "accel")


@dataclass
class Outcome:
    outcome: str  # passed, failed, error, skipped
    reason: str = ""
    seconds: float = 0.0


@dataclass
class FileRun:
    side: str
    name: str
    tests: dict[str, Outcome] = field(default_factory=dict)
    seconds: float = 0.0
    note: str = ""
    identity: str = ""

    def count(self, outcome: str) -> int:
        return sum(o.outcome == outcome for o in self.tests.values())


def run_file(root: Path, work: Path, side: str, name: str, threads: int, timeout: int) -> FileRun:
    run = FileRun(side, name)
    cwd = work / side / f"{name}.cwd"
    shutil.rmtree(cwd, ignore_errors=True)
    cwd.mkdir(parents=True)
    report = work / side / f"{name}.xml"
    log = work / side / f"{name}.log"
    ident = work / side / f"{name}.accelerate"
    for p in (report, ident):
        p.unlink(missing_ok=True)
    ini = work / "pytest.ini"
    env = side_env(side, threads)
    env["ACCEL_COMPAT_REPORT_ACCELERATE"] = str(ident)
    cmd = [sys.executable, "-m", "pytest", str(root / "tests" / "trainer" / name)]
    cmd += [
        "-p",
        "no:cacheprovider",
        "-p",
        SHIM,
        "-q",
        "-rA",
        "--rootdir",
        str(root),
        "-c",
        str(ini),
    ]
    cmd += ["-o", "junit_family=xunit1", f"--junitxml={report}"]
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            run.note = f"timed out after {timeout}s"
    run.seconds = time.perf_counter() - start
    run.identity = ident.read_text().strip() if ident.exists() else ""
    if report.exists():
        run.tests, collection = parse_junit(report, name)
        if collection:
            run.note = (run.note + "; " if run.note else "") + f"collection error: {collection}"
    elif not run.note:
        run.note = f"no JUnit report (pytest exit {proc.returncode}); see {log}"
    shutil.rmtree(cwd, ignore_errors=True)
    return run


def parse_junit(report: Path, name: str) -> tuple[dict[str, Outcome], str]:
    tests: dict[str, Outcome] = {}
    collection = ""
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        classname, test = case.get("classname", ""), case.get("name", "")
        seconds = float(case.get("time") or 0)
        problems = [c for c in case if c.tag in ("failure", "error")]
        skipped = [c for c in case if c.tag == "skipped"]
        if not classname and problems:  # the file itself did not import
            collection = one_line(problems[0])
            continue
        cls = classname.rsplit(".", 1)[-1] if "." in classname else classname
        node = (
            f"{name}::{cls}::{test}"
            if cls and cls != name.removesuffix(".py")
            else f"{name}::{test}"
        )
        if problems:
            kind = "failed" if any(p.tag == "failure" for p in problems) else "error"
            tests[node] = Outcome(kind, one_line(problems[0]), seconds)
        elif skipped:
            tests[node] = Outcome("skipped", one_line(skipped[0]), seconds)
        else:
            tests[node] = Outcome("passed", "", seconds)
    return tests, collection


def one_line(element: ElementTree.Element) -> str:
    """The first line of the message; failing that, the last `E ` line of the traceback."""
    message = (element.get("message") or "").strip()
    line = message.splitlines()[0] if message else ""
    if not line or line in ("AssertionError", "assert False"):
        text = (element.text or "").splitlines()
        text_lines = [t[1:].strip() for t in text if t.startswith("E ") and t[1:].strip()]
        if text_lines:
            line = text_lines[-1] if not line else f"{line}: {text_lines[0]}"
    return line[:REASON_WIDTH]


# --------------------------------------------------------------------------------------------
# Comparing and reporting
# --------------------------------------------------------------------------------------------

BAD = ("failed", "error")


def load_expected(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    return dict(tomllib.loads(path.read_text()).get("failures", {}))


def table(files: list[str], runs: dict[tuple[str, str], FileRun], sides: list[str]) -> str:
    head = f"{'file':36}" + "".join(f" | {s:^30}" for s in sides)
    sub = f"{'':36}" + "".join(f" | {'pass  fail   err  skip    time':>30}" for _ in sides)
    rows = [head, sub, "-" * len(sub)]
    totals = {s: [0, 0, 0, 0, 0.0] for s in sides}
    for name in files:
        row = f"{name:36}"
        for s in sides:
            r = runs.get((s, name))
            if r is None:
                row += f" | {'-':>30}"
                continue
            c = [r.count("passed"), r.count("failed"), r.count("error"), r.count("skipped")]
            for i, v in enumerate(c):
                totals[s][i] += v
            totals[s][4] += r.seconds
            row += f" | {c[0]:4d}  {c[1]:4d}  {c[2]:4d}  {c[3]:4d}  {r.seconds:5.0f}s"
        rows.append(row)
    rows.append("-" * len(sub))
    row = f"{'total':36}"
    for s in sides:
        t = totals[s]
        row += f" | {t[0]:4d}  {t[1]:4d}  {t[2]:4d}  {t[3]:4d}  {t[4]:5.0f}s"
    rows.append(row)
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "folder",
        nargs="?",
        type=Path,
        default=default_dir(),
        help=f"the copied transformers tests (default {default_dir()})",
    )
    parser.add_argument("--side", choices=("both", *SIDES), default="both")
    parser.add_argument(
        "-k",
        "--files",
        nargs="*",
        default=None,
        help="run only these test files (names under tests/trainer)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="pytest processes at a time (default: 2, or the CPU count if lower)",
    )
    parser.add_argument("--timeout", type=int, default=FILE_TIMEOUT_S, help="seconds per file")
    parser.add_argument("--expected", type=Path, default=EXPECTED)
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 on a test that passes on accelerate, fails on accel and is not listed",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every outcome here")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="also list the tests failing on both"
    )
    args = parser.parse_args(argv)

    root = args.folder.resolve()
    files = check_folder(root)
    if args.files:
        unknown = sorted(set(args.files) - set(files))
        if unknown:
            raise SystemExit(f"not in {root}/tests/trainer: {', '.join(unknown)}")
        files = [f for f in files if f in args.files]
    sides = list(SIDES) if args.side == "both" else [args.side]
    if args.check and len(sides) != 2:
        raise SystemExit("--check compares both sides; drop --side")

    problems: list[str] = []
    identities = {}
    for s in sides:
        identities[s] = accelerate_identity(s)
        state = "ok" if switch_ok(s, identities[s]) else "WRONG"
        print(f"{s:10} side imports accelerate {identities[s]}  [{state}]")
        if state != "ok":
            problems.append(f"the {s} side imports the wrong accelerate: {identities[s]}")
    if problems:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        return 2

    work = root / "runs"
    for s in sides:
        (work / s).mkdir(parents=True, exist_ok=True)
    (work / "pytest.ini").write_text("[pytest]\n")
    threads = max(1, (os.cpu_count() or 1) // max(1, args.jobs))
    # the largest files first, both sides of a file next to each other
    by_size = sorted(files, key=lambda f: -(root / "tests" / "trainer" / f).stat().st_size)
    tasks = [(s, f) for f in by_size for s in sides]
    runs: dict[tuple[str, str], FileRun] = {}
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {
            pool.submit(run_file, root, work, s, f, threads, args.timeout): (s, f) for s, f in tasks
        }
        for fut in concurrent.futures.as_completed(futures):
            r = fut.result()
            runs[(r.side, r.name)] = r
            if r.identity and not switch_ok(r.side, r.identity):
                r.note = (r.note + "; " if r.note else "") + f"imported accelerate {r.identity}"
                problems.append(f"{r.side} run of {r.name} imported accelerate {r.identity}")
            elif not r.identity and r.tests:
                problems.append(
                    f"{r.side} run of {r.name} did not report which accelerate it imported"
                )
            print(
                f"  {r.side:10} {r.name:36} {r.count('passed'):4d} passed {r.count('failed'):3d} failed "
                f"{r.count('error'):3d} errors {r.count('skipped'):3d} skipped  {r.seconds:5.0f}s"
                + (f"  ({r.note})" if r.note else ""),
                flush=True,
            )
    print(
        f"\nwall time {time.perf_counter() - started:.0f}s, {args.jobs} at a time; logs in {work}\n"
    )
    print(table(files, runs, sides))
    notes = [f"  {s}/{f}: {r.note}" for (s, f), r in sorted(runs.items()) if r.note]
    if notes:
        print("\nnotes:\n" + "\n".join(notes))

    outcomes = {s: {} for s in sides}
    for (s, _), r in runs.items():
        outcomes[s].update(r.tests)
    expected = load_expected(args.expected)
    slow = sorted(
        (
            (o.seconds, s, t)
            for s in sides
            for t, o in outcomes[s].items()
            if o.seconds >= SLOW_TEST_S
        ),
        reverse=True,
    )
    if slow:
        print(f"\ntests taking {SLOW_TEST_S:.0f}s or more:")
        for sec, s, t in slow:
            print(f"  {sec:6.0f}s  {s:10} {t}")

    status = 0
    if len(sides) == 2:
        acc, acl = outcomes["accelerate"], outcomes["accel"]
        # a file that did not collect or timed out on accel: its tests count as failing there
        for (s, f), r in runs.items():
            if s == "accel" and r.note and not r.tests:
                for t in acc:
                    if t.startswith(f + "::"):
                        acl.setdefault(t, Outcome("error", r.note))
        regressions = sorted(
            t
            for t, o in acc.items()
            if o.outcome == "passed" and acl.get(t, Outcome("missing")).outcome in (*BAD, "missing")
        )
        both = sorted(
            t for t, o in acc.items() if o.outcome in BAD and acl.get(t, Outcome("")).outcome in BAD
        )
        only_accel = sorted(
            t
            for t, o in acl.items()
            if o.outcome == "passed" and acc.get(t, Outcome("")).outcome in BAD
        )
        unlisted = [t for t in regressions if t not in expected]
        print(
            f"\n{len(regressions)} tests pass on accelerate and fail on accel ({len(unlisted)} not listed in {args.expected.name}):"
        )
        for t in regressions:
            o = acl.get(t, Outcome("missing", "not run on accel"))
            tag = f"  [listed: {expected[t]}]" if t in expected else ""
            print(f"  {t}\n      {o.outcome}: {o.reason}{tag}")
        print(f"\n{len(both)} tests fail on both sides (not accel's concern).")
        if args.verbose:
            for t in both:
                print(f"  {t}\n      accelerate: {acc[t].reason}")
        if only_accel:
            print(f"\n{len(only_accel)} tests pass on accel and fail on accelerate:")
            for t in only_accel:
                print(f"  {t}\n      accelerate: {acc[t].reason}")
        stale = sorted(t for t in expected if t in acl and acl[t].outcome not in BAD)
        if stale:
            print(
                f"\n{len(stale)} entries of {args.expected.name} no longer fail on accel (remove them):"
            )
            for t in stale:
                print(f"  {t}")
        if args.check and (unlisted or problems):
            status = 1
    if problems:
        print("\nproblems:\n" + "\n".join(f"  {p}" for p in problems))
        if args.check:
            status = 1
    if args.json:
        args.json.write_text(
            json.dumps(
                {s: {t: o.__dict__ for t, o in sorted(outcomes[s].items())} for s in sides},
                indent=1,
            )
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
