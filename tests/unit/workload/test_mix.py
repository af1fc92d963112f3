from __future__ import annotations

import pytest

from evenserve.core.errors import ConfigError
from evenserve.workload import mix_rates, parse_mix


def test_parse_mix() -> None:
    assert parse_mix("resnet50=0.85, bert-base=0.15") == {"resnet50": 0.85, "bert-base": 0.15}
    assert parse_mix("a") == {"a": 1.0}


@pytest.mark.parametrize(
    ("text", "needle"),
    [("a=x", "not a number"), ("a=-1", ">= 0"), ("=1", "MODEL=WEIGHT"), ("a=0", "zero"), ("", "")],
)
def test_parse_mix_errors(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match="--mix") as e:
        parse_mix(text)
    assert needle in str(e.value)


def test_mix_rates_split_the_rate_in_model_order() -> None:
    rates = mix_rates(100.0, {"z": 1.0, "a": 3.0, "off": 0.0})
    assert list(rates) == ["a", "z"]
    assert rates == {"a": 75.0, "z": 25.0}
