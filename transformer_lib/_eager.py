"""Calls that run eagerly under ``torch.compile``: the library's checks that read tensor values.

Imported only while torch.compile traces a model (``torch._dynamo``, which ``torch.compiler.disable``
needs, is loaded then anyway), so that ``import transformer_lib`` does not pay the second or more that
importing it takes. It imports nothing from the package, so that no import circle runs through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


@torch.compiler.disable
def eagerly(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, run eagerly between the compiled graphs: torch.compile traces neither it nor what it calls."""
    return fn(*args)
