"""`ReplicaView`: one live replica as `deepinfer_sched` sees an instance (`InstanceView`).

It is fed by the replica's ``state`` messages (load, step-time fit, prefix-cache store/evict
events) and by the front itself between two messages: a request just routed here counts as
queued and its prompt blocks as soon-to-be held, so back-to-back routing decisions do not all
see the same stale picture. A ``state`` message lists the requests the replica received since
its previous one (``seen``); a request routed here and not yet listed still counts as queued on
top of the reported load, so a report the replica sent before the request reached it does not
make the replica look idle.
"""

from __future__ import annotations

from typing import Any

from deepinfer_cache import DEFAULT_KEY_HASH


class ReplicaView:
    """The `InstanceView` of one replica, plus the bookkeeping that keeps it current."""

    def __init__(self, index: int) -> None:
        self.instance_id = index
        self.block_size = 16
        self.max_batched_tokens = 2048
        self.capacity_blocks = 0
        self.free_blocks = 0
        self.num_waiting = 0
        self.waiting_tokens = 0
        self.num_running = 0
        self.kv_used_tokens = 0
        self.step_overhead_s = 0.005
        self.step_s_per_token = 0.0005
        self.held: set[int] = set()  # block hashes the replica reported as cached
        self.hash_model = b""  # key material the replica's cache folds into block hashes
        self.key_hash = DEFAULT_KEY_HASH  # the block-key scheme of the replica's cache
        self._routed: dict[str, tuple[int, ...]] = {}  # in flight here: its prompt blocks
        self._expiring: list[str] = []  # finished; dropped at the next authoritative report
        # Routed here, not yet in a report's ``seen``: request id -> its new prompt tokens.
        self._unseen: dict[str, int] = {}

    @property
    def kv_capacity_tokens(self) -> int:
        return self.capacity_blocks * self.block_size

    # ------------------------------------------------------------------ InstanceView
    def cached_prefix_blocks(self, block_hashes: tuple[int, ...]) -> int:
        n = 0
        for h in block_hashes:
            if h not in self.held and not any(h in hs for hs in self._routed.values()):
                break
            n += 1
        return n

    def reachable_prefix_blocks(self, block_hashes: tuple[int, ...]) -> int:
        # Each replica's disk tier is its own; nothing beyond the local cache is reachable.
        return self.cached_prefix_blocks(block_hashes)

    def estimated_queue_time_s(self) -> float:
        """Time until a request queued now starts prefilling: the queued prompt tokens at the
        fitted per-token cost, plus one step overhead per batch they take."""
        steps = -(-self.waiting_tokens // self.max_batched_tokens) if self.waiting_tokens else 0
        return steps * self.step_overhead_s + self.waiting_tokens * self.step_s_per_token

    # ------------------------------------------------------------------ updates
    def on_ready(self, info: dict[str, Any]) -> None:
        self.block_size = int(info["block_size"])
        self.capacity_blocks = int(info["capacity_blocks"])
        self.free_blocks = self.capacity_blocks
        self.max_batched_tokens = int(info.get("max_batched_tokens", self.max_batched_tokens))
        self.hash_model = bytes.fromhex(str(info.get("hash_model", "")))
        self.key_hash = str(info.get("key_hash", DEFAULT_KEY_HASH))
        self._unseen.clear()  # a new incarnation of the replica: nothing is in flight to it

    def on_state(self, state: dict[str, Any]) -> None:
        self.num_waiting = int(state["num_waiting"])
        self.waiting_tokens = int(state["waiting_tokens"])
        self.num_running = int(state["num_running"])
        self.kv_used_tokens = int(state["kv_used_tokens"])
        self.free_blocks = int(state["free_blocks"])
        self.step_overhead_s = float(state["step_overhead_s"])
        self.step_s_per_token = float(state["step_s_per_token"])
        if state.get("reset"):
            self.held.clear()
        self.held.difference_update(state.get("evicted", ()))
        self.held.update(state.get("stored", ()))
        for rid in self._expiring:
            self._routed.pop(rid, None)
        self._expiring.clear()
        for rid in state.get("seen", ()):
            self._unseen.pop(str(rid), None)
        self.num_waiting += len(self._unseen)
        self.waiting_tokens += sum(self._unseen.values())

    def on_routed(self, request_id: str, block_hashes: tuple[int, ...], new_tokens: int) -> None:
        self._routed[request_id] = block_hashes
        self._unseen[request_id] = new_tokens
        self.num_waiting += 1
        self.waiting_tokens += new_tokens

    def on_finished(self, request_id: str) -> None:
        self._unseen.pop(request_id, None)  # ended before a report listed it (an error, abort)
        if request_id in self._routed:
            self._expiring.append(request_id)
