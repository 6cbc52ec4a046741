"""``VOXCAST_VOICE_ALIASES``: names a deployment gives its voices (e.g. OpenAI's voice names)."""

from __future__ import annotations

import pytest

from voxcast.service import ServiceConfig
from voxcast.voices.aliases import parse_aliases


def test_pairs_and_json_give_the_same_lower_case_map() -> None:
    want = {"alloy": "ryan", "support": "vx_0123abcd"}
    assert parse_aliases("Alloy=ryan, support = vx_0123abcd") == want
    assert parse_aliases('{"ALLOY": "ryan", "support": "vx_0123abcd"}') == want
    assert parse_aliases(None) == parse_aliases("  ") == {}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("alloy", "is not alias=voice"),
        ("alloy=", "voice ''"),
        ("al loy=ryan", "alias 'al loy'"),
        ("alloy=ryan,ALLOY=vivian", "given twice"),
        ("alloy=nova,nova=ryan", "no chains"),
        ('{"alloy": 3}', "must map names to voices"),
        ("{alloy", "not valid JSON"),
    ],
)
def test_bad_values_name_the_variable(value: str, says: str) -> None:
    with pytest.raises(ValueError, match="VOXCAST_VOICE_ALIASES") as err:
        parse_aliases(value)
    assert says in str(err.value)


def test_the_service_configuration_reads_them() -> None:
    assert ServiceConfig.from_env({"VOXCAST_VOICE_ALIASES": "nova=vivian"}).voice_aliases == {
        "nova": "vivian"
    }
    assert ServiceConfig.from_env({}).voice_aliases == {}
    with pytest.raises(ValueError, match="VOXCAST_VOICE_ALIASES"):
        ServiceConfig.from_env({"VOXCAST_VOICE_ALIASES": "nova"})
