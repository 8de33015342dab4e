"""How a ZeRO checkpoint's data-parallel size is read from its files, and where its universal
copy goes. Nothing here imports deepspeed; the conversion itself is tested with real engines
in packages/accel/tests/test_deepspeed.py (2 processes saved, 1 and 4 resumed)."""

from __future__ import annotations

from pathlib import Path

from accel_parallel._deepspeed_reshard import _beside, saved_data_parallel_size


def _touch(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


def test_the_saved_size_is_the_number_of_zero_partitions(tmp_path: Path) -> None:
    zero2 = _touch(
        tmp_path / "zero2", "mp_rank_00_model_states.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    )  # fmt: skip
    assert saved_data_parallel_size(zero2) == 2
    # ZeRO-3: one model file per rank too; bf16 partitions carry a prefix
    zero3 = _touch(
        tmp_path / "zero3",
        *(f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(4)),
        *(f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(4)),
    )
    assert saved_data_parallel_size(zero3) == 4
    # two model-parallel ranks per data-parallel rank still make 2 partitions of each
    tp = _touch(
        tmp_path / "tp",
        *(f"zero_pp_rank_{d}_mp_rank_0{m}_optim_states.pt" for d in range(2) for m in range(2)),
    )
    assert saved_data_parallel_size(tp) == 2
    stage0 = _touch(tmp_path / "stage0", "mp_rank_00_model_states.pt")
    assert saved_data_parallel_size(stage0) is None


def test_the_universal_copy_never_lands_in_checkpoints(tmp_path: Path) -> None:
    """Beside a plain folder; for a folder in checkpoints/ (automatic naming), in the project
    folder, since both libraries read every folder of checkpoints/ as a checkpoint."""
    plain = _touch(tmp_path / "runs" / "ckpt")
    assert _beside(plain) == (tmp_path / "runs").resolve()
    automatic = _touch(tmp_path / "project" / "checkpoints" / "checkpoint_3")
    assert _beside(automatic) == (tmp_path / "project").resolve()
    named = _touch(tmp_path / "project" / "checkpoints" / "best")
    assert _beside(named) == (tmp_path / "project").resolve()
