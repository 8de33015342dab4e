"""accelerate's `estimate-memory` helper names. accel estimates offline from a local folder,
a .safetensors file or a model factory (`accel estimate-memory SOURCE`); the Hub look-ups of
accelerate's version are answered by `verify_on_hub` only."""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any

from accel_cli._estimate import table


def add_timm_hub_prefix(model_name: str) -> str:
    """`org/name` -> `hf-hub:org/name` (timm's Hub source); bare architecture names and
    names that already carry a source prefix are returned unchanged."""
    if ":" in model_name or "/" not in model_name:
        return model_name
    return f"hf-hub:{model_name}"


def verify_on_hub(repo: str, token: str | None = None) -> Any:
    """The Hub's model info for `repo`, or "gated" / "repo" when it cannot be read or does
    not exist."""
    from huggingface_hub import model_info
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

    try:
        return model_info(repo, token=token)
    except RepositoryNotFoundError:
        return "repo"
    except (OSError, GatedRepoError):
        return "gated"


def estimate_training_usage(
    bytes: int, mixed_precision: str, msamp_config: str | None = None
) -> dict[str, int]:
    """Bytes of Adam training at batch size 1 for a model of `bytes` fp32 weights, as
    accelerate reports them: {"model", "optimizer", "gradients", "step"}, -1 where
    `mixed_precision` (float32, float16, bfloat16, fp8) says nothing (int8, int4)."""
    if msamp_config is not None:
        raise NotImplementedError("MS-AMP is not supported by accel; pass msamp_config=None.")
    sizes = {"model": -1, "optimizer": -1, "gradients": -1, "step": -1}
    if mixed_precision == "float32":
        sizes.update(model=bytes, gradients=bytes, optimizer=2 * bytes, step=4 * bytes)
    elif mixed_precision in ("float16", "bfloat16", "fp8"):
        # fp32 master weights; a weight gradient plus a half-precision compute copy; Adam's
        # two states (fp8 through TransformerEngine saves nothing here)
        half = bytes // 2
        sizes.update(model=bytes, gradients=bytes + half, optimizer=2 * bytes, step=2 * bytes)
    return sizes


def create_ascii_table(headers: list[str], rows: list[list[str]], title: str) -> str:
    """An aligned text table with `title` above the header row."""
    return "\n".join([title, *table(headers, rows)])


def check_has_model(error: BaseException) -> str:
    """Which library raised `error` when a model could not be found: "timm",
    "transformers" or "unknown"."""
    message = str(error)
    if importlib.util.find_spec("timm") is not None and (
        (isinstance(error, RuntimeError) and "Unknown model" in message)
        or type(error).__name__ == "EntryNotFoundError"
        or (isinstance(error, KeyError) and "architecture" in message)
    ):
        return "timm"
    if (
        importlib.util.find_spec("transformers") is not None
        and isinstance(error, (OSError, ValueError))
        and (
            "does not appear to have a file named" in message or "Unrecognized model in" in message
        )
    ):
        return "transformers"
    return "unknown"


def create_empty_model(
    model_name: str,
    library_name: str | None,
    trust_remote_code: bool = False,
    access_token: str | None = None,
) -> Any:
    """`model_name`'s model (a Hub id, or a local folder with a config.json) built on the meta
    device in full precision, from `library_name` ("transformers" or "timm"; read from the
    Hub's metadata when None)."""
    import torch

    local = os.path.isdir(model_name)
    info = None if local else verify_on_hub(model_name, access_token)
    if info == "gated":
        raise OSError(
            f"Repo for model `{model_name}` is gated or out of reach. Authenticate with `hf auth "
            "login`, or pass a local folder with the model's config.json."
        )
    if info == "repo":
        raise OSError(
            f"Repo for model `{model_name}` does not exist on the Hub. For a private repo, "
            "authenticate with `hf auth login`; or pass a local folder with its config.json."
        )
    if library_name is None:
        library_name = "transformers" if local else getattr(info, "library_name", None)
        if not library_name:
            raise ValueError(
                f"Model `{model_name}` has no library metadata on the Hub: pass library_name "
                "(--library_name), e.g. transformers or timm."
            )
    if library_name == "transformers":
        transformers = _require("transformers", model_name)
        print(f"Loading pretrained config for `{model_name}` from `transformers`...")
        config = transformers.AutoConfig.from_pretrained(
            model_name, trust_remote_code=trust_remote_code, token=access_token
        )
        auto_map = getattr(config, "auto_map", None) or {}
        name = next((k for k in auto_map if k.startswith("AutoModelFor")), "AutoModel")
        new = tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 56)
        dtype = {"dtype" if new else "torch_dtype": torch.float32}  # not the config's dtype
        with torch.device("meta"):
            return getattr(transformers, name).from_config(
                config, trust_remote_code=trust_remote_code, **dtype
            )
    if library_name == "timm":
        timm = _require("timm", model_name)
        print(f"Loading pretrained config for `{model_name}` from `timm`...")
        with torch.device("meta"):
            return timm.create_model(add_timm_hub_prefix(model_name), pretrained=False)
    raise ValueError(
        f"library_name={library_name!r} is not supported; use 'transformers' or 'timm'."
    )


def gather_data(args: Any) -> list[list[Any]]:
    """[dtype, largest layer bytes, total bytes, training bytes] for each of `args.dtypes`,
    of the model `args.model_name` (accelerate's `estimate-memory` table rows)."""
    calculate_maximum_sizes = _require("accel_bigmodel", args.model_name).calculate_maximum_sizes

    try:
        model = create_empty_model(
            args.model_name,
            library_name=args.library_name,
            trust_remote_code=args.trust_remote_code,
        )
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        library = check_has_model(e)
        if library != "unknown":
            raise RuntimeError(
                f"Tried to load `{args.model_name}` with `{library}` but a possible model to "
                "load was not found inside the repo."
            ) from e
        raise
    total, (largest, _) = calculate_maximum_sizes(model)
    divisor = {"float16": 2, "int8": 4, "int4": 8}
    rows = []
    for dtype in args.dtypes:
        d = divisor.get(dtype, 1)
        training = estimate_training_usage(total, dtype)
        rows.append(
            [dtype, largest / d if d > 1 else largest, total / d if d > 1 else total, training]
        )
    return rows


def _require(library: str, model_name: str) -> Any:
    try:
        return importlib.import_module(library)
    except ImportError:
        dist = library.replace("_", "-")
        raise ImportError(
            f"To check `{model_name}`, `{library}` must be installed: pip install {dist}"
        ) from None
