"""Evaluation suites: clean accuracy, adversarial attacks, common corruptions and OOD detection.

Use the registry in :mod:`rpc_attention.evaluate.suites` (``register_suite``, ``get_suite``,
``list_suites``, ``run_suite``, ``write_result``); suite modules in this package (``classification``,
``corruptions``, ``ood``, ``lm``, ``segmentation``) are listed in the registry and imported on its
first use.  Importing this package is cheap: torchattacks
and imagecorruptions are imported only when an attack or corruption runs.
"""

from ..extras import require

require('rpc_attention.evaluate', 'eval')  # one line naming the missing extra, before any import that needs it

from .suites import get_suite, list_suites, register_suite, run_suite, write_result

__all__ = ["register_suite", "get_suite", "list_suites", "run_suite", "write_result"]
