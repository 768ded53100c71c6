"""The library's checks that read tensor values, marked to run eagerly under ``torch.compile``.

Imported only while torch.compile traces a model (``torch._dynamo``, which ``torch.compiler.disable``
needs, is loaded then anyway), so that ``import transformer_lib`` does not pay the second or more that
importing it takes.
"""

from __future__ import annotations

import torch

from ._validate import _validate_token_values

validate_token_values_eagerly = torch.compiler.disable(_validate_token_values)
