"""`deepinfer serve --ray` across two Ray nodes on this machine (`ray.cluster_utils.Cluster`:
one CPU and a 100 MB object store each, custom resources ``node_a`` / ``node_b``), one cluster
shared by the module.

- ``--pd 1:1`` with the prefill pool pinned to ``node_a`` and the decode pool to ``node_b``: KV
  pages cross nodes through Ray's object store, greedy output (streamed or not) equals
  ``LLM.generate``, no page object is left held; killing the decode actor mid-stream ends that
  stream with a clear error, and Ray brings the actor back, which then decodes correctly again.
- ``deepinfer serve --ray --ray-address ADDRESS`` (a subprocess joining the cluster) with two
  replicas spread over the two nodes (one ``slot`` resource per node): the router's prefix
  affinity sends a conversation's second turn to the node whose replica caches its prefix.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray_helpers import complete, open_stream, ray_server, sse_events, sse_text
from serve_helpers import health, process_server, tiny_model, wait_for

from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.serve import RayOptions, ServeConfig

ray = pytest.importorskip("ray")
pytest.importorskip("fastapi")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

ENGINE = EngineConfig(block_size=8, num_blocks=96, max_model_len=256, max_num_seqs=16)
STORE = 100 * 1024 * 1024


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("ray-cluster-model"))


@pytest.fixture(scope="module")
def nodes() -> Iterator[dict[str, str]]:
    """Two Ray nodes; yields custom resource name -> node id."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"node_a": 1, "slot": 1},
            "object_store_memory": STORE,
            "include_dashboard": False,
        },
    )
    try:
        cluster.add_node(num_cpus=1, resources={"node_b": 1, "slot": 1}, object_store_memory=STORE)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="deepinfer-tests", log_to_driver=False)
        ids = {}
        for node in ray.nodes():
            for name in ("node_a", "node_b"):
                if node["Alive"] and name in node["Resources"]:
                    ids[name] = node["NodeID"]
        assert len(ids) == 2
        yield ids
    finally:
        ray.shutdown()
        cluster.shutdown()


def _config(gguf: Path, cache: Path, **kw: Any) -> ServeConfig:
    return ServeConfig(
        model=str(gguf),
        served_model_name="tiny",
        engine=ENGINE,
        prefix_cache=PrefixCacheConfig(device_blocks=16, host_bytes=1 << 22, disk_bytes=0),
        cache_dir=str(cache),
        **kw,
    )


def test_pd_across_nodes_equals_llm_generate_and_survives_a_decode_kill(
    nodes: dict[str, str], gguf: Path, tmp_path: Path
) -> None:
    from deepinfer.llm import LLM

    prompts = [[(7 * i + 5 * j + 3) % 200 + 3 for j in range(n)] for i, n in enumerate((3, 9, 33))]
    params = SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True)
    with LLM(
        str(gguf), engine_config=ENGINE, enable_prefix_caching=False, cache_dir=tmp_path
    ) as llm:
        offline = [o.text for o in llm.generate(prompts, params)]
    config = _config(
        gguf,
        tmp_path / "kv",
        replicas=2,
        pd=(1, 1),
        ray=RayOptions(
            num_cpus=1,
            prefill_resources={"node_a": 1},
            decode_resources={"node_b": 1},
            max_restarts=1,
        ),
    )
    with ray_server(config) as (base, service):
        prefill, decode = service.replicas
        assert [r["role"] for r in health(base)["replicas"]] == ["prefill", "decode"]
        assert prefill.info["node_id"] == nodes["node_a"]
        assert decode.info["node_id"] == nodes["node_b"]
        for prompt, expected in zip(prompts, offline):
            r = complete(base, prompt, 7)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == expected
            assert r.headers["x-deepinfer-replica"] == "1"  # streamed by the decode replica
            c, s = open_stream(base, prompt, 7)
            assert sse_text(sse_events(s.iter_lines())) == expected
            c.close()
        # Every page object was imported and released on both sides.
        for handle in (prefill, decode):
            assert ray.get(handle.actor.where.remote())["kv_refs_held"] == 0

        # The decode actor dies mid-stream: that stream ends with an error, nothing hangs.
        pid = decode.pid
        client, stream = open_stream(base, prompts[2], 200)
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: {"))
        os.kill(pid, signal.SIGKILL)
        rest = sse_events(lines)
        client.close()
        assert rest[-1] == "[DONE]"
        errors = [e for e in rest if isinstance(e, dict) and "error" in e]
        assert errors and "streamed" in errors[0]["error"]["message"]

        def back() -> bool:
            rep = health(base)["replicas"][1]
            return rep["status"] == "up" and rep["pid"] not in (None, pid)

        wait_for(back, 120.0, "Ray to restart the decode actor")
        assert decode.deaths == 1 and decode.info["node_id"] == nodes["node_b"]
        r = complete(base, prompts[1], 7)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == offline[1]
        assert health(base)["in_flight"] == 0


def test_cli_prefix_affinity_holds_across_nodes(
    nodes: dict[str, str], gguf: Path, tmp_path: Path
) -> None:
    """``deepinfer serve --ray --ray-address ADDRESS`` as a subprocess joining the cluster: two
    replicas, one per node (``slot`` resource, ``STRICT_SPREAD``); a conversation's second turn
    goes to the node whose replica caches its first turn; SIGTERM drains and releases Ray."""
    args = [
        str(gguf),
        "--served-model-name",
        "tiny",
        "--replicas",
        "2",
        "--router",
        "prefix_affinity",
        "--num-blocks",
        "96",
        "--block-size",
        "8",
        "--max-model-len",
        "256",
        "--cache-dir",
        str(tmp_path / "kv"),
        "--ray",
        "--ray-address",
        ray.get_runtime_context().gcs_address,
        "--ray-resources",
        '{"slot": 1}',
        "--ray-strategy",
        "STRICT_SPREAD",
    ]
    with process_server(args, {}, timeout=240.0) as (base, proc):
        # Where each replica runs, asked of its actor through Ray.
        node_of_pid = {}
        for entry in ray.util.list_named_actors(all_namespaces=True):
            if entry["namespace"] == "deepinfer" and entry["name"].startswith("deepinfer-"):
                where = ray.get(ray.get_actor(entry["name"], "deepinfer").where.remote())
                node_of_pid[where["pid"]] = where["node_id"]
        node = {r["index"]: node_of_pid[r["pid"]] for r in health(base)["replicas"]}
        assert set(node.values()) == set(nodes.values())  # one replica per node

        def convo(tag: int) -> list[int]:
            return [(tag * 31 + 7 * j) % 200 + 3 for j in range(40)]

        # Two first turns in flight together (no shared blocks): spread over both nodes by load.
        first = {}
        streams = []
        for tag in (1, 2):
            c, s = open_stream(base, convo(tag), 48)  # long enough to still run at the second
            first[tag] = int(s.headers["x-deepinfer-replica"])
            streams.append((c, s))
        for c, s in streams:
            assert sse_text(sse_events(s.iter_lines()))
            c.close()
        assert node[first[1]] != node[first[2]]
        for tag in (1, 2):
            turn2 = [*convo(tag), 9, 10, 11, 12, 13, 14, 15, 16, 17]
            r = complete(base, turn2, 2)
            assert r.status_code == 200, r.text
            assert int(r.headers["x-deepinfer-replica"]) == first[tag]
            assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 32
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0
