"""Trace loaders on small sample files written here, including bad rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepinfer_sched.traces import (
    SyntheticTraceConfig,
    load_azure,
    load_burstgpt,
    load_mooncake,
    load_trace,
    save_jsonl,
    synthetic_trace,
)


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _mooncake_line(ts: object, inp: object, out: object, ids: object) -> str:
    return json.dumps({"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": ids})


def test_mooncake_sample(tmp_path: Path) -> None:
    # block_size 4: 9 tokens = 2 full blocks; Mooncake lists ceil(9/4) = 3 ids.
    p = _write(
        tmp_path / "m.jsonl",
        "\n".join(
            [
                _mooncake_line(0, 9, 5, [1, 2, 3]),
                _mooncake_line(2500, 8, 1, [1, 2]),
                "",
                _mooncake_line(1000, 3, 2, [7]),
            ]
        )
        + "\n",
    )
    t = load_mooncake(p, block_size=4)
    assert [r.arrival_s for r in t] == [0.0, 1.0, 2.5]
    assert [r.request_id for r in t] == [0, 2, 1]
    assert t[0].block_hashes == (1, 2) and t[2].block_hashes == (1, 2)
    assert t[1].block_hashes == () and t[1].input_len == 3 and t[1].output_len == 2
    assert t.stats().reusable_tokens == 8
    assert len(load_mooncake(p, block_size=4, limit=2)) == 2
    assert load_trace(p, block_size=4) == t


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "invalid JSON"),
        ('{"timestamp": 1, "input_length": 4, "output_length": 1}', "missing key 'hash_ids'"),
        (_mooncake_line("x", 4, 1, [1]), "timestamp"),
        (_mooncake_line(1, -4, 1, []), "input_length"),
        (_mooncake_line(1, 4, 0, [1]), "output_length"),
        (_mooncake_line(1, 4, 1, "abc"), "hash_ids"),
        (_mooncake_line(1, 12, 1, [1]), "expected 3 or 3"),
        ("[1, 2]", "JSON object"),
        (_mooncake_line(1, 4, 1, [1])[:-1] + ', "tenant": 5}', "tenant: expected a string"),
        (_mooncake_line(1, 4, 1, [1])[:-1] + ', "priority": "hi"}', "priority"),
    ],
)
def test_mooncake_bad_rows_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    good = _mooncake_line(0, 4, 1, [1])
    p = _write(tmp_path / "bad.jsonl", good + "\n" + line + "\n")
    with pytest.raises(ValueError, match=message) as exc:
        load_mooncake(p, block_size=4)
    assert "bad.jsonl:2:" in str(exc.value)


def test_save_jsonl_round_trip(tmp_path: Path) -> None:
    t = synthetic_trace(SyntheticTraceConfig(num_requests=200, seed=9, block_size=1024))
    p = tmp_path / "syn.jsonl"
    save_jsonl(t, p)
    back = load_trace(p, block_size=1024)
    assert len(back) == len(t)
    for a, b in zip(t, back):
        assert b.arrival_s == pytest.approx(a.arrival_s, rel=1e-12, abs=1e-12)
        assert (b.request_id, b.input_len, b.output_len, b.block_hashes) == (
            a.request_id,
            a.input_len,
            a.output_len,
            a.block_hashes,
        )
        assert (b.tenant, b.conversation_id, b.kind, b.priority) == (
            a.tenant,
            a.conversation_id,
            a.kind,
            a.priority,
        )
    assert back.stats().reusable_tokens == t.stats().reusable_tokens


AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,4808,10
2023-11-16 18:15:50.9951690,3180,0
2023-11-16 18:15:47.0000000,9,3
"""


def test_azure_sample(tmp_path: Path) -> None:
    p = _write(tmp_path / "azure.csv", AZURE)
    t = load_azure(p, block_size=512)
    assert len(t) == 3
    assert t[0].arrival_s == 0.0
    assert t[1].arrival_s == pytest.approx(0.31941, abs=1e-5)
    assert t[2].arrival_s == pytest.approx(4.314579, abs=1e-5)
    assert t[2].output_len == 1  # 0 generated tokens -> 1
    assert len(t[0].block_hashes) == 4808 // 512
    assert t.stats().reusable_tokens == 0  # no prefix data: every block is fresh
    assert load_trace(p) == t
    numeric = _write(
        tmp_path / "n.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n5,10,2\n7.5,3,1\n"
    )
    assert [r.arrival_s for r in load_azure(numeric)] == [0.0, 2.5]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("not-a-date,10,1", "TIMESTAMP"),
        ("2023-11-16 18:15:47,ten,1", "ContextTokens"),
        ("2023-11-16 18:15:47,10,-1", "GeneratedTokens"),
        ("2023-11-16 18:15:47,10", "expected 3 fields"),
    ],
)
def test_azure_bad_rows(tmp_path: Path, row: str, message: str) -> None:
    p = _write(tmp_path / "a.csv", AZURE + row + "\n")
    with pytest.raises(ValueError, match=message) as exc:
        load_azure(p)
    assert "a.csv:5:" in str(exc.value)


def test_azure_missing_column(tmp_path: Path) -> None:
    p = _write(tmp_path / "a.csv", "TIMESTAMP,Context\n1,2\n")
    with pytest.raises(ValueError, match=r"a.csv:1: missing columns \['ContextTokens'"):
        load_azure(p)


BURST = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,GPT-4,1087,0,1087,API log
46,ChatGPT,1200,300,1500,Conversation log
"""


def test_burstgpt_sample(tmp_path: Path) -> None:
    p = _write(tmp_path / "burst.csv", BURST)
    t = load_burstgpt(p, block_size=256)
    assert [r.arrival_s for r in t] == [5.0, 45.0, 46.0]
    assert [r.tenant for r in t] == ["ChatGPT", "GPT-4", "ChatGPT"]
    assert [r.kind for r in t] == ["chat", "api", "chat"]
    assert t[1].output_len == 1
    assert len(t[2].block_hashes) == 1200 // 256
    only = load_burstgpt(p, model="ChatGPT")
    assert len(only) == 2 and {r.tenant for r in only} == {"ChatGPT"}
    assert load_trace(p, block_size=256) == t


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("x,ChatGPT,1,1,2,Conversation log", "Timestamp"),
        ("50,ChatGPT,1,1,3,Conversation log", "Total tokens"),
        ("50,,1,1,2,Conversation log", "Model"),
        ("50,ChatGPT,1.5,1,2,Conversation log", "Request tokens"),
    ],
)
def test_burstgpt_bad_rows(tmp_path: Path, row: str, message: str) -> None:
    p = _write(tmp_path / "b.csv", BURST + row + "\n")
    with pytest.raises(ValueError, match=message) as exc:
        load_burstgpt(p)
    assert "b.csv:5:" in str(exc.value)


def test_load_trace_detection_errors(tmp_path: Path) -> None:
    p = _write(tmp_path / "x.csv", "a,b\n1,2\n")
    with pytest.raises(ValueError, match="cannot detect"):
        load_trace(p)
    with pytest.raises(ValueError, match="format"):
        load_trace(p, format="parquet")
