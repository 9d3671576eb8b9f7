"""Benchmark suite: what PAP costs next to the attention calls it makes (``rpc-attention bench``).

* :mod:`.config` -- what a run measures (``full``, ``quick``, ``smoke``);
* :mod:`.measure` -- process set-up, timing, peak and saved-for-backward memory;
* :mod:`.ops` -- operator cases (:class:`OpCase`: sdpa, pap n, official n and the options);
* :mod:`.models` -- model cases by family (training step and inference throughput);
* :mod:`.targets` -- the performance targets, evaluated on a run's results;
* :mod:`.output` -- Markdown tables and the result files;
* :mod:`.suite` -- one run over :data:`CASE_GROUPS` (a new benchmark is one line there).
"""

from .config import Config, OpShape, config
from .measure import HeapControl, peak_bytes, saved_bytes, setup_process
from .ops import OpCase, official_pap
from .suite import CASE_GROUPS, CaseGroup, run_suite, to_markdown, write_results

__all__ = ["Config", "OpShape", "config", "HeapControl", "setup_process", "peak_bytes", "saved_bytes", "OpCase",
           "official_pap", "CaseGroup", "CASE_GROUPS", "run_suite", "to_markdown", "write_results"]
