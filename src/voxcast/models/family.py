"""What a model family registers: how to load it, its own settings, how to build test checkpoints.

A family is one module that defines ``FAMILY = ModelFamily(...)`` and imports its model code only
inside ``load`` (this module and the descriptors import no PyTorch: ``voxcast --help`` and
``EngineConfig.from_env`` stay light). :mod:`voxcast.models.registry` maps a checkpoint to its family.

Settings a family alone understands (Qwen3-TTS's CPU kernel choices, Chatterbox Turbo's streaming
windows) are declared here as :class:`Setting` s: the engine's configuration reads each from its
environment variable and checks it (an error names the variable), and the family receives its own,
checked and with its defaults filled, as one map (``LoadOptions.settings``). Nothing above
``models/`` names them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ModelFamily", "Setting", "TestCheckpoints", "int_in", "on_off_auto"]

_ON = {"1", "true", "yes", "on"}
_OFF = {"0", "false", "no", "off"}


def on_off_auto(raw: Any) -> bool | None:
    """``on`` (True), ``off`` (False) or ``auto`` (None: decided at load); any boolean spelling
    (1/0, true/false, yes/no) and Python's True/False/None too.

    Raises:
        ValueError: anything else.
    """
    if raw is None or isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text == "auto":
        return None
    if text in _ON or text in _OFF:
        return text in _ON
    raise ValueError(f"must be on, off or auto (or 1/0, true/false), not {raw!r}")


def int_in(lo: int, hi: int) -> Callable[[Any], int]:
    """A parser of integers within ``[lo, hi]`` (text or int)."""

    def parse(raw: Any) -> int:
        try:
            value = int(str(raw).strip()) if not isinstance(raw, int) or isinstance(raw, bool) else raw
        except ValueError:
            raise ValueError(f"must be an integer, not {raw!r}") from None
        if not lo <= value <= hi:
            raise ValueError(f"must be within [{lo}, {hi}], not {value}")
        return value

    return parse


@dataclass(frozen=True)
class Setting:
    """One family-specific setting.

    Attributes:
        name: its key in ``EngineConfig.settings`` and ``LoadOptions.settings``.
        env: its environment variable (``VOXCAST_...``; documented in docs/configuration.md).
        parse: text (or a value given in code) -> the value the family reads; raises ``ValueError``
            with a message that does not repeat the name (:meth:`check` adds it).
        default: the value when it is not given (None: the family decides).
        doc: one line for the documentation.
    """

    name: str
    env: str
    parse: Callable[[Any], Any]
    default: Any = None
    doc: str = ""

    def check(self, raw: Any) -> Any:
        """``raw`` parsed.

        Raises:
            ValueError: naming the environment variable and the field.
        """
        try:
            return self.parse(raw)
        except ValueError as e:
            raise ValueError(f"{self.env} ({self.name}) {e}") from None


@dataclass(frozen=True)
class TestCheckpoints:
    """How ``voxcast make-test-model`` and the test fixtures build random-weight checkpoints.

    Attributes:
        kinds: the ``--kind`` values this family builds (a checkpoint variant each).
        sizes: the ``--size`` values.
        builder: ``"module:function"`` called as ``function(out, kind, size, seed=..., ends_speech=...)
            -> Path``; imported only when a checkpoint is built (production code imports no test
            checkpoints, see docs/architecture.md).
        sources: modules whose code decides what a built checkpoint contains (the test fixtures
            rebuild a cached checkpoint when one changes).
    """

    kinds: tuple[str, ...]
    sizes: tuple[str, ...]
    builder: str
    sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelFamily:
    """A model family (see the module docstring).

    Attributes:
        name: the ``model_type`` of its checkpoints' ``config.json``.
        load: ``load(root: Path, options: LoadOptions) -> TTSModel`` (:mod:`voxcast.models.base`;
            imports the model code when called).
        settings: the family's own settings.
        markers: files that mark a checkpoint layout that ships no ``config.json``.
        test_checkpoints: how to build random-weight checkpoints (None: none).
    """

    name: str
    load: Callable[[Path, Any], Any]
    settings: tuple[Setting, ...] = ()
    markers: tuple[str, ...] = ()
    test_checkpoints: TestCheckpoints | None = None
    _by_name: dict[str, Setting] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {s.name: s for s in self.settings})

    def resolve(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """This family's settings: ``given``'s values of them checked, the defaults for the rest
        (settings of other families are ignored).

        Raises:
            ValueError: a value this family refuses (naming its variable).
        """
        return {s.name: s.check(given[s.name]) if s.name in given else s.default for s in self.settings}
