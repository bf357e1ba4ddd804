"""Reference backend of the rope family."""
from __future__ import annotations

import tskernels_ref.rope as ref

from ...registry import register
from .._common import REF, rope_result


@register("rope", "apply_rope", **REF)
def apply_rope(q, k, positions, cos_sin_cache, *, style, inplace):
    qo, ko = ref.apply_rope(q, k, positions, cos_sin_cache, style=style)
    return rope_result(q, k, qo, ko, inplace)
