"""mmfeed.loaders.observe: where a training step's time goes, seen from the loop.

:class:`~mmfeed.loaders.observe.timing.StepTimer` splits each step into the input wait, the copy, compute and
exposed communication (:mod:`~mmfeed.loaders.observe.comm`), adds the workers' stage seconds (measured by the
worker-side clock, :mod:`mmfeed.loaders.clock`), names the bottleneck (:mod:`~mmfeed.loaders.observe.diagnosis`),
computes MFU (:mod:`~mmfeed.loaders.observe.flops`) and writes Chrome traces (:mod:`~mmfeed.loaders.observe.trace`).
"""

from __future__ import annotations

from mmfeed._lazy import lazy_exports

_EXPORTS = {
    "StepTimer": "mmfeed.loaders.observe.timing",
    "count_flops": "mmfeed.loaders.observe.flops",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
