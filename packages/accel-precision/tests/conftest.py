"""Test setup for accel-precision.

torch sets TORCHINDUCTOR_CACHE_DIR in os.environ when torch._dynamo is first imported, which
the first optimizer step does. Importing it here, before any test runs, keeps the workspace's
leak check from blaming whichever test happens to step an optimizer first.
"""

import torch._dynamo  # noqa: F401
