"""`WorkerSettings`: what a PD worker process starts with, as one JSON string."""

from __future__ import annotations

import pytest

from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.pd.routing import worker_cache_fields
from deepinfer.pd.worker import WorkerSettings


def test_round_trips_through_json() -> None:
    settings = WorkerSettings(
        "/models/tiny",
        "bfloat16",
        "cpu",
        {"block_size": 8, "num_blocks": 64},
        threads=2,
        cache=worker_cache_fields(PrefixCacheConfig(device_blocks=4), 1),
        speculative="dspark",
    )
    back = WorkerSettings.from_json(settings.to_json())
    assert back == settings
    assert back.cache is not None and back.cache["directory_suffix"] == "-pd-prefill-1"


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"dtype": "int8"}, "dtype"),
        ({"threads": 0}, "threads"),
        ({"cache": {"device_blocks": 4}}, "cache"),
    ],
)
def test_bad_settings_are_named(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        WorkerSettings("/models/tiny", **kwargs)  # type: ignore[arg-type]
