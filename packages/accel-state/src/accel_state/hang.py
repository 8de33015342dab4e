"""The hang doctor: numbered collectives, a watchdog, and a diagnosis naming the first
divergence between ranks.

    doctor = HangDoctor(30, rank=rank, world_size=world, folder="hang_report").start()
    ...                  # every backward / optimizer step:  doctor.beat()

accel's collectives (gather, reduce, broadcast, pad_across_processes, the barrier of
wait_for_everyone, ...) are numbered in the order each rank issues them and kept in a ring
of the last N, with op, shapes, dtypes and the caller's file:line. When a step or a
collective runs past the timeout on one rank, every rank writes its stack and ring into the
folder, one diagnosis is printed ("rank 1 is in gather #57 (train.py:88) while rank 0 is in
reduce #57 (train.py:91)"), and every rank exits with `HANG_EXIT_CODE` (86).
`accel.Accelerator(hang_timeout=...)` and `accel launch --hang_timeout` set it up.

`diagnose`, `brief` (the diagnosis as printed: bounded at any number of ranks) and
`load_reports` are pure functions over the report folder (they import
neither torch nor accel), for the launcher and for tools.
"""

from accel_state._diagnosis import (
    DIAGNOSIS_FILE,
    REPORT_DIR_NAME,
    brief,
    diagnose,
    load_reports,
    report_path,
    where_in_stack,
)
from accel_state._ring import CollectiveRecord, CollectiveRing
from accel_state._watchdog import (
    COLLECTED_FILE,
    HANG_EXIT_CODE,
    HangDoctor,
    active_doctor,
    process_group_store,
)

__all__ = [
    "COLLECTED_FILE",
    "DIAGNOSIS_FILE",
    "HANG_EXIT_CODE",
    "REPORT_DIR_NAME",
    "CollectiveRecord",
    "CollectiveRing",
    "HangDoctor",
    "active_doctor",
    "brief",
    "diagnose",
    "load_reports",
    "process_group_store",
    "report_path",
    "where_in_stack",
]
