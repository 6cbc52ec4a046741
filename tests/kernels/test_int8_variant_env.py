"""``VOXCAST_INT8_VARIANT`` forces the int8 kernel's variant where none is asked for (an AVX2-only
host's path, testable on an AVX-512 one); a variant the CPU cannot run, or an unknown one, is refused."""

from __future__ import annotations

import pytest

from voxcast.kernels import native

pytestmark = pytest.mark.skipif(not native.variants(), reason="the int8 kernel does not build here")


@pytest.mark.parametrize("variant", native.variants())
def test_the_variable_picks_the_variant(monkeypatch: pytest.MonkeyPatch, variant: str) -> None:
    monkeypatch.setenv(native.VARIANT_ENV, variant.upper())
    assert native.resolve(None) == variant
    other = [v for v in native.variants() if v != variant]
    for v in other:  # an explicit choice still wins
        assert native.resolve(v) == v


def test_without_it_the_fastest_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(native.VARIANT_ENV, raising=False)
    assert native.resolve(None) == native.variants()[0]


def test_a_bad_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.VARIANT_ENV, "avx9000")
    with pytest.raises(ValueError, match="avx9000"):
        native.resolve(None)
    unsupported = [v for v in native.VARIANTS if v not in native.variants()]
    for v in unsupported:
        monkeypatch.setenv(native.VARIANT_ENV, v)
        with pytest.raises(ValueError, match="does not run on this CPU"):
            native.resolve(None)
