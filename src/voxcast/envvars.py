"""Reading typed settings from an environment mapping (shared by every ``from_env``).

Each reader takes the mapping explicitly (``os.environ`` or a dict in tests), treats an unset or
blank variable as "use the default", and raises ``ValueError`` naming the variable for a malformed
or out-of-range value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

__all__ = ["env_bool", "env_float", "env_int", "env_str"]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

N = TypeVar("N", int, float)


def env_str(env: Mapping[str, str], name: str) -> str | None:
    """The stripped value, or None when unset or blank."""
    return env.get(name, "").strip() or None


def env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    """1/0, true/false, yes/no, on/off (any case)."""
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw not in _TRUE | _FALSE:
        raise ValueError(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")
    return raw in _TRUE


def _number(
    env: Mapping[str, str],
    name: str,
    default: N,
    kind: Callable[[str], N],
    what: str,
    lo: float | None,
    hi: float | None,
    positive: bool,
) -> N:
    raw = env.get(name, "").strip()
    try:
        value = kind(raw) if raw else default
    except ValueError as e:
        raise ValueError(f"{name}={raw!r} is not {what}") from e
    if positive and value <= 0:
        raise ValueError(f"{name} must be positive")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise ValueError(f"{name}={value} is outside [{lo}, {hi}]")
    return value


def env_int(
    env: Mapping[str, str],
    name: str,
    default: int,
    *,
    lo: int | None = None,
    hi: int | None = None,
    positive: bool = False,
) -> int:
    """An integer, optionally bounded (inclusive) or required to be > 0."""
    return _number(env, name, default, int, "an integer", lo, hi, positive)


def env_float(
    env: Mapping[str, str],
    name: str,
    default: float,
    *,
    lo: float | None = None,
    hi: float | None = None,
    positive: bool = False,
) -> float:
    """A number, optionally bounded (inclusive) or required to be > 0."""
    return _number(env, name, default, float, "a number", lo, hi, positive)
