"""Reading suite rows out of a study's collected results (one helper for every per-setting table)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple


def gather_rows(per_model: Dict[str, Dict[str, Any]], label_of: Callable[[dict], Optional[str]],
                value_key: str) -> Tuple[List[str], Dict[str, Dict[str, List[float]]]]:
    """For every model, the numeric ``value_key`` of each suite row, grouped by ``label_of(row)``.

    ``per_model`` maps a model key to its per-seed suite records (each with ``rows``). Rows whose label
    is None or whose value is not a number are skipped. Returns the labels in first-seen order and
    ``{model: {label: [value per seed]}}`` (models without any value are left out).
    """
    labels: List[str] = []
    data: Dict[str, Dict[str, List[float]]] = {}
    for key, per_seed in per_model.items():
        for record in per_seed.values():
            for row in record.get("rows", []):
                label, value = label_of(row), row.get(value_key)
                if label is None or not isinstance(value, (int, float)):
                    continue
                if label not in labels:
                    labels.append(label)
                data.setdefault(key, {}).setdefault(label, []).append(float(value))
    return labels, data
