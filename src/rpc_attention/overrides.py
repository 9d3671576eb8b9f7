"""The one settings grammar of every command: ``KEY=VALUE`` with dotted keys and YAML values.

``rpc-attention train --set train.epochs=3``, ``eval --set pgd.eps=1:6/255``, ``reproduce --set
seeds=[0,1]``, ``analyze --set limit=4`` and ``eval-external --set model.kwargs.img_size=28`` all go
through :func:`parse_assignments` (syntax and values) and report a key nobody knows with
:func:`unknown_key` (one message, closest known keys). :func:`apply_assignments` sets the pairs in a
nested dict whose keys are fixed except below the "open" sections (free keyword dicts).

Values are YAML (``3`` is an int, ``[0, 1]`` a list, ``null`` None, ``true`` a bool), with one
correction: YAML 1.1 reads ``1e-3`` as a string, so a string that Python reads as a finite number
becomes that float. ``2/255`` stays a string; :func:`parse_number` turns it into a float wherever a
number (an ``eps``) is expected.
"""

from __future__ import annotations

import copy
import difflib
from fractions import Fraction
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import yaml

__all__ = ["parse_value", "parse_assignments", "unknown_key", "apply_assignments", "parse_number", "flatten_keys"]


def parse_value(text: str) -> Any:
    """The YAML value of ``text`` (``""`` stays ``""``; ``1e-3`` is a float; unparsable YAML is the text)."""
    if text.strip() == "":
        return ""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text.strip()
    if isinstance(value, str) and value.strip().lower() not in ("nan", "inf", "-inf", "+inf", "infinity"):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def parse_assignments(items: Optional[Iterable[str]], flag: str = "--set") -> List[Tuple[str, Any]]:
    """``["a.b=1", "c=[1,2]"]`` -> ``[("a.b", 1), ("c", [1, 2])]``; ValueError naming ``flag`` if malformed."""
    out = []
    for item in items or []:
        key, eq, text = str(item).partition("=")
        key = key.strip()
        if not eq:
            raise ValueError(f"{flag} expects KEY=VALUE, got {item!r}")
        if not key or any(not part.strip() for part in key.split(".")):
            raise ValueError(f"{flag} key {key!r} is not a dotted name like train.epochs")
        out.append((key, parse_value(text)))
    return out


def unknown_key(key: str, known: Iterable[str], what: str = "setting", flag: str = "--set",
                hint: str = "") -> ValueError:
    """The error for ``key`` that no one reads: names the closest known keys (or lists them all)."""
    known = sorted(set(known))
    close = difflib.get_close_matches(key, known, n=3)
    if close:
        tail = f"; did you mean {', '.join(close)}?"
    else:
        tail = f"; known: {', '.join(known)}" if len(known) <= 30 else ""
    return ValueError(f"{flag} {key}: unknown {what} {key!r}{tail}{hint}")


def flatten_keys(tree: Dict[str, Any], prefix: str = "") -> List[str]:
    """Every dotted key of a nested dict, sections included."""
    keys = []
    for k, v in tree.items():
        name = f"{prefix}{k}"
        keys.append(name)
        if isinstance(v, dict):
            keys.extend(flatten_keys(v, name + "."))
    return keys


def _is_open(section: str, open_sections: Sequence[str]) -> bool:
    return any(section == s or section.startswith(s + ".") for s in open_sections)


def apply_assignments(tree: Dict[str, Any], pairs: Iterable[Tuple[str, Any]], open_sections: Sequence[str] = (),
                      what: str = "config key", flag: str = "--set") -> Dict[str, Any]:
    """A copy of ``tree`` with each ``(dotted key, value)`` set.

    A key must exist in ``tree`` unless it lies below one of ``open_sections`` (where sections are
    created as needed); a section cannot be replaced by a value. Errors are ValueErrors naming the key.
    """
    tree = copy.deepcopy(tree)
    hint = f"; open sections taking new keys: {', '.join(open_sections)}" if open_sections else ""
    for key, value in pairs:
        parts = key.split(".")
        node = tree
        for i, part in enumerate(parts[:-1]):
            section = ".".join(parts[: i + 1])
            if node.get(part) is None:  # absent, or a null section (model.kwargs: null)
                if not _is_open(section, open_sections):
                    raise unknown_key(key, flatten_keys(tree), what, flag, hint)
                node[part] = {}
            if not isinstance(node[part], dict):
                raise ValueError(f"{flag} {key}: {section} is a value ({node[part]!r}), not a section")
            node = node[part]
        leaf = parts[-1]
        if leaf not in node and not _is_open(".".join(parts[:-1]), open_sections):
            raise unknown_key(key, flatten_keys(tree), what, flag, hint)
        if isinstance(node.get(leaf), dict) and not isinstance(value, dict):
            raise ValueError(f"{flag} {key}: {key} is a section; set one of its keys "
                             f"({', '.join(sorted(node[leaf])) or key + '.NAME'})")
        node[leaf] = value
    return tree


def parse_number(value: Any, name: str = "value") -> float:
    """A float from ``0.01``, ``"1e-3"``, ``"2/255"`` or ``"2.5/255"``; ValueError naming ``name`` if not."""
    if isinstance(value, bool):
        raise ValueError(f"{name}: expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    num, slash, den = text.partition("/")
    try:
        if slash:
            return float(Fraction(num.strip())) / float(Fraction(den.strip()))
        return float(text)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"{name}: {text!r} is not a number (use e.g. 0.01, 1e-3 or 2.5/255)") from None


def _split_list(value: Any) -> List[Any]:
    """A list setting from a YAML list, a comma list (``0,1,2``) or one value."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        return [parse_value(x.strip()) for x in value.split(",") if x.strip()]
    return [value]


def typed_value(key: str, value: Any, kind: Any, flag: str = "--set") -> Any:
    """``value`` (as :func:`parse_assignments` read it) checked against the annotated type ``kind``.

    ``kind`` is ``bool``, ``int``, ``float`` (fractions such as ``2/255`` allowed), ``str``,
    ``Optional[T]`` (``None`` allowed) or ``List[T]`` / ``Tuple[T, ...]`` (a YAML list, a comma list or
    one value; each item checked as ``T``). Anything else is returned unchanged. ValueError names ``key``.
    """
    import typing

    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        kind = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (list, tuple):
        items = [typed_value(key, v, args[0], flag) if args else v for v in _split_list(value)]
        return tuple(items) if origin is tuple else items
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{flag} {key}={value}: expected true or false")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{flag} {key}={value}: expected an integer")
        return value
    if kind is float:
        return parse_number(value, f"{flag} {key}")
    if kind is str:
        if value is None:
            raise ValueError(f"{flag} {key}: expected a value")
        return value if isinstance(value, str) else str(value)
    return value
