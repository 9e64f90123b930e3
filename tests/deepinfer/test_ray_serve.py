"""`deepinfer serve` with replicas as Ray actors, on a real local Ray (``ray.init(num_cpus=2)``,
a 200 MB object store), one server shared by the module (Ray and actor start-up are slow).

Covers: each replica is an actor in its own process, placed in the pool's placement group;
greedy HTTP output equals ``LLM.generate``; load, free blocks and prefix-block events reach the
router through actor calls; an actor killed mid-run ends its streamed request with a clear
error, the request queued there without tokens is retried on the other replica, and Ray
restarts the actor (``max_restarts``), which rejoins and serves again; past ``max_restarts``
the front replaces a dead actor with a fresh one.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from ray_helpers import complete, open_stream, ray_server, sse_events, sse_text
from serve_helpers import health, tiny_model, wait_for

from deepinfer.engine.cache_setup import PrefixCacheConfig
from deepinfer.engine.config import EngineConfig
from deepinfer.engine.sampling_params import SamplingParams
from deepinfer.serve import RayOptions, ServeConfig, ServeService

ray = pytest.importorskip("ray")
pytest.importorskip("fastapi")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

ENGINE = EngineConfig(block_size=8, num_blocks=96, max_model_len=256, max_num_seqs=16)


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("ray-model"))


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(
        address="local",  # a new instance, never another test's or engineer's cluster
        num_cpus=2,
        object_store_memory=200 * 1024 * 1024,
        include_dashboard=False,
        namespace="deepinfer-tests",
        log_to_driver=False,
    )
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def server(
    local_ray: None, gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Any]]:
    config = ServeConfig(
        model=str(gguf),
        served_model_name="tiny",
        replicas=2,
        router="round_robin",
        engine=ENGINE,
        prefix_cache=PrefixCacheConfig(device_blocks=24, host_bytes=1 << 22, disk_bytes=0),
        cache_dir=str(tmp_path_factory.mktemp("ray-cache")),
        ray=RayOptions(num_cpus=0.5, max_restarts=2),  # half the CPUs: room for one more
    )
    with ray_server(config) as (base, service):
        yield base, service


def test_replicas_are_placed_actors_and_greedy_equals_llm_generate(
    server: tuple[str, Any], gguf: Path, tmp_path: Path
) -> None:
    from deepinfer.llm import LLM
    from deepinfer.serve.ray_handle import RayReplicaHandle

    base, service = server
    reps = health(base)["replicas"]
    assert [r["status"] for r in reps] == ["up", "up"]
    pids = {r["pid"] for r in reps}
    assert len(pids) == 2 and os.getpid() not in pids  # two actor processes, not threads here
    for handle in service.replicas:
        assert isinstance(handle, RayReplicaHandle)
        where = ray.get(handle.actor.where.remote())
        assert where["pid"] == handle.pid
        assert where["incarnation"] == handle.info["incarnation"]
        # A poller following another incarnation is told so, and nothing is consumed.
        assert ray.get(handle.actor.poll.remote(0.0, "another-incarnation")) == "stale"
    # Both replicas sit in one placement group (the "both" pool), one bundle each.
    (group, bundle) = service._ray.groups["both"]
    assert bundle == {"CPU": 0.5} and len(group.bundle_specs) == 2

    prompts = [
        [(13 * i + 5 * j + 4) % 200 + 3 for j in range(n)] for i, n in enumerate((6, 19, 41))
    ]
    params = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)
    with LLM(
        str(gguf), engine_config=ENGINE, enable_prefix_caching=False, cache_dir=tmp_path
    ) as llm:
        offline = [o.text for o in llm.generate(prompts, params)]
    served = set()
    for prompt, expected in zip(prompts * 2, offline * 2):
        r = complete(base, prompt, 9)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == expected
        served.add(int(r.headers["x-deepinfer-replica"]))
    assert served == {0, 1}

    # Load and prefix-cache events reached the router through actor calls: both replicas
    # report cached blocks of the 41-token prompt and all their blocks free again.
    def settled() -> bool:
        return all(
            h.view.held and h.view.free_blocks == h.view.capacity_blocks and not h.view.num_running
            for h in service.replicas
        )

    wait_for(settled, 20.0, "both replicas to report their cached blocks and free pools")


def test_killed_actor_retries_queued_fails_streamed_and_comes_back(
    server: tuple[str, Any],
) -> None:
    base, service = server
    expected = complete(base, "queued here", 16).json()["choices"][0]["text"]
    reps = health(base)["replicas"]
    pids = {r["index"]: r["pid"] for r in reps}

    c_mid, mid = open_stream(base, "the long answer", 200)
    victim = int(mid.headers["x-deepinfer-replica"])
    lines = mid.iter_lines()
    assert next(line for line in lines if line.startswith("data: {"))
    old_incarnation = service.replicas[victim].info["incarnation"]
    os.kill(pids[victim], signal.SIGSTOP)  # frozen: it cannot finish nor start the next one
    queued = None
    for _ in range(4):
        c_q, r_q = open_stream(base, "queued here", 16)
        if int(r_q.headers["x-deepinfer-replica"]) == victim:
            queued = (c_q, r_q)
            break
        sse_events(r_q.iter_lines())
        c_q.close()
    assert queued is not None, "round robin never routed to the frozen replica"
    os.kill(pids[victim], signal.SIGKILL)  # the actor's process dies; Ray restarts it

    rest = sse_events(lines)
    assert rest[-1] == "[DONE]"
    errors = [e for e in rest if isinstance(e, dict) and "error" in e]
    assert errors and "streamed" in errors[0]["error"]["message"]
    assert "actor died" in errors[0]["error"]["message"]
    c_mid.close()
    retried = sse_events(queued[1].iter_lines())
    queued[0].close()
    assert not [e for e in retried if isinstance(e, dict) and "error" in e]
    assert sse_text(retried) == expected  # re-run from scratch on the other replica

    handle = service.replicas[victim]

    def rejoined() -> bool:
        rep = health(base)["replicas"][victim]
        return rep["status"] == "up" and rep["pid"] not in (None, pids[victim])

    wait_for(rejoined, 120.0, "Ray to restart the killed actor and the replica to rejoin")
    assert handle.deaths == 1  # restarted by Ray (max_restarts=2), not replaced
    assert handle.info["incarnation"] != old_incarnation
    assert health(base)["replicas"][victim]["restarts"] == 1
    served = set()
    for _ in range(4):
        r = complete(base, "queued here", 16)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected
        served.add(int(r.headers["x-deepinfer-replica"]))
    assert victim in served
    assert health(base)["in_flight"] == 0


def test_past_max_restarts_a_fresh_actor_replaces_the_dead_one(
    local_ray: None, gguf: Path, tmp_path: Path
) -> None:
    """``max_restarts=0``: Ray does not restart the killed actor; the front creates a new one in
    the same placement-group bundle, and it serves."""
    config = ServeConfig(
        model=str(gguf),
        served_model_name="tiny",
        replicas=1,
        engine=ENGINE,
        prefix_cache=None,
        cache_dir=str(tmp_path),
        ray=RayOptions(num_cpus=0.5, max_restarts=0),
    )
    with ray_server(config) as (base, service):
        handle = service.replicas[0]
        first_actor, pid = handle.actor, handle.pid
        expected = complete(base, [4, 5, 6], 5).json()["choices"][0]["text"]
        os.kill(pid, signal.SIGKILL)

        def replaced() -> bool:
            rep = health(base)["replicas"][0]
            return rep["status"] == "up" and rep["pid"] not in (None, pid)

        wait_for(replaced, 120.0, "a fresh actor to replace the dead one")
        assert handle.actor is not first_actor and handle.deaths == 0
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(first_actor.where.remote(), timeout=30)  # the old one stays dead
        r = complete(base, [4, 5, 6], 5)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected


def test_a_pool_the_cluster_cannot_hold_fails_at_start_naming_it(
    local_ray: None, gguf: Path, tmp_path: Path
) -> None:
    config = ServeConfig(
        model=str(gguf),
        replicas=1,
        engine=ENGINE,
        prefix_cache=None,
        cache_dir=str(tmp_path),
        ray=RayOptions(num_cpus=0.5, resources={"no_such_node": 1}, placement_timeout_s=3),
    )
    service = ServeService(config)
    with pytest.raises(RuntimeError, match=r"could not place the both pool .*no_such_node"):
        asyncio.run(service.start())
    assert not service.replicas  # no actor was created for a pool that was never placed


def test_a_replica_that_fails_to_build_reports_its_own_error(
    local_ray: None, gguf: Path, tmp_path: Path
) -> None:
    """The replica's own start-up error reaches the caller, and its actor is removed."""
    config = ServeConfig(
        model=str(gguf),
        replicas=1,
        device="cuda:7",  # no such device here: the engine refuses to build
        engine=ENGINE,
        prefix_cache=None,
        cache_dir=str(tmp_path),
        ray=RayOptions(num_cpus=0.5, num_gpus=0),
    )
    service = ServeService(config)

    async def start() -> None:
        try:
            await service.start()
        finally:
            await service.close()

    with pytest.raises(RuntimeError, match=r"replica 0: \w+Error") as err:
        asyncio.run(start())
    assert "ended inside" not in str(err.value)
    assert service.replicas[0].actor is None  # stopped and killed by close()


# The replica actor filters this warning: scatter only reads the read-only object-store view.
@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_object_store_transport_round_trips_pages_and_refuses_bad_handles(
    local_ray: None, dtype: torch.dtype
) -> None:
    """Pages put by one transport come out bit-identical in another pool's blocks (bfloat16
    too: the buffer is raw bytes); a handle that does not fit the pool, or pages never
    received, are refused with a clear error and the pool is left untouched."""
    from deepinfer.models.kv_pool import KVPool
    from deepinfer.serve.ray_transport import ObjectStoreTransport

    src = KVPool(2, 8, 4, 2, 8, dtype=dtype)
    src.tensor.copy_(torch.randn(src.tensor.shape).to(dtype))
    dst = KVPool(2, 8, 4, 2, 8, dtype=dtype)
    sender, receiver = ObjectStoreTransport(), ObjectStoreTransport()
    handle = sender.export_pages(src, [5, 1, 6])
    assert handle["nbytes"] == src.tensor[:, :, :3].numel() * src.tensor.element_size()
    receiver.receive(handle["ray"], sender.take(handle["ray"]))
    assert sender.held() == 0 and receiver.held() == 1
    receiver.import_pages(dst, handle, [0, 2, 3])
    assert receiver.held() == 0
    assert torch.equal(dst.tensor[:, :, [0, 2, 3]], src.tensor[:, :, [5, 1, 6]])

    before = dst.tensor.clone()
    cases = [
        ({**handle, "dtype": "torch.int8"}, [0, 2, 3], "KV dtype"),
        ({**handle, "shape": [2, 2, 2, 4, 2, 8]}, [0, 2, 3], "shaped"),
        (handle, [0, 2], "shaped"),
    ]
    for bad, blocks, message in cases:
        again = sender.export_pages(src, [5, 1, 6])
        receiver.receive(again["ray"], sender.take(again["ray"]))
        with pytest.raises(ValueError, match=message):
            receiver.import_pages(dst, {**bad, "ray": again["ray"]}, blocks)
        assert receiver.held() == 0  # a refused handle does not leak its object
    with pytest.raises(ValueError, match="never received"):
        receiver.import_pages(dst, handle, [0, 2, 3])
    assert torch.equal(dst.tensor, before)
    lost = sender.export_pages(src, [0])
    assert sender.discard(lost) and not sender.discard(lost)
