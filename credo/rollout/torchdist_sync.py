"""Weight sync into vLLM over a torch.distributed process group (the ``credo_torchdist`` backend; docs/distributed.md,
"Weight sync into vLLM"): the trainer and vLLM's workers join one gloo group through a TCP rendezvous (a ``TCPStore`` the
trainer hosts, never the default process group), the update request carries only metadata (names, dtypes, shapes
per bucket) and the tensors go by broadcast from the trainer (rank 0), packed into one flat byte buffer per
fixed-size bucket. The worker side is :mod:`credo.rollout.vllm_torchdist_receiver`.

Shared by both sides and free of vLLM: bucket planning and packing (:func:`plan_buckets`, :func:`pack`,
:func:`unpack`), the group (:func:`open_group`), and the trainer's sender (:class:`TorchDistWeightSync`), which
drives vLLM's weight-transfer protocol through any client with the four methods of vLLM's
``VLLMWeightSyncClient`` (``init_weight_transfer_engine``, ``start_weight_update``, ``update_weights``,
``finish_weight_update``): :class:`credo.rollout.vllm_sync.LLMClient` in process, :class:`HTTPWeightSync` over HTTP.
The blocking ``update_weights`` call runs on a thread while this thread broadcasts.

Only changed tensors travel (:class:`ChangeTracker`): a position-weighted checksum per tensor, compared with what
the last finished sync sent; a changed tensor resends its whole vLLM layer (:func:`load_unit`: vLLM fuses q/k/v and
gate/up into one layer, and its layer-wise reload processes a layer only once all of its weights arrived).
"""
from __future__ import annotations

import datetime
import logging
import re
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Iterable, Protocol

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

BUCKET_BYTES = 32 << 20
TIMEOUT_S = 60.0
ALIGN = 64  # each tensor starts at a multiple of this many bytes in its bucket (any dtype's view is aligned)
GROUP = "credo_weight_sync"


# ============================================================================ buckets


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_buckets(items: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = BUCKET_BYTES) -> list[dict]:
    """The tensors, in order, as buckets of at most ``bucket_bytes`` (a larger single tensor goes alone): per
    bucket ``{"names", "dtypes", "shapes", "offsets", "nbytes"}`` (JSON-able; offsets are byte offsets into the
    bucket's flat buffer, each a multiple of :data:`ALIGN`; ``nbytes`` is the buffer's length)."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[dict] = []
    cur: dict | None = None
    for name, t in items:
        size = t.numel() * t.element_size()
        if cur is None or (cur["names"] and _aligned(cur["nbytes"]) + size > bucket_bytes):
            cur = {"names": [], "dtypes": [], "shapes": [], "offsets": [], "nbytes": 0}
            buckets.append(cur)
        off = _aligned(cur["nbytes"])
        cur["names"].append(name)
        cur["dtypes"].append(dtype_name(t.dtype))
        cur["shapes"].append(list(t.shape))
        cur["offsets"].append(off)
        cur["nbytes"] = off + size
    return buckets


def check_bucket(meta: dict) -> None:
    """A ValueError naming what is wrong when ``meta`` is no bucket :func:`plan_buckets` could have made."""
    keys = ("names", "dtypes", "shapes", "offsets")
    if any(not isinstance(meta.get(k), list) for k in keys) or not isinstance(meta.get("nbytes"), int):
        raise ValueError(f"a weight bucket needs lists {keys} and an int nbytes, got keys {sorted(meta)}")
    if len({len(meta[k]) for k in keys}) != 1:
        raise ValueError("a weight bucket's names, dtypes, shapes and offsets differ in length")
    for name, dt, shape, off in zip(*(meta[k] for k in keys)):
        dtype = getattr(torch, str(dt), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"weight bucket: {name}: unknown dtype {dt!r}")
        end = off + _numel(shape) * dtype.itemsize
        if off % ALIGN or off < 0 or end > meta["nbytes"]:
            raise ValueError(f"weight bucket: {name}: bytes {off}..{end} do not fit a buffer of {meta['nbytes']}")


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def pack(tensors: list[torch.Tensor], meta: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    """The bucket's tensors copied into one flat uint8 buffer (``out[:nbytes]`` when given, else a new one)."""
    buf = torch.empty(meta["nbytes"], dtype=torch.uint8) if out is None else out[: meta["nbytes"]]
    for t, off in zip(tensors, meta["offsets"]):
        flat = t.detach().reshape(-1)
        n = flat.numel() * flat.element_size()
        buf[off: off + n].view(t.dtype).copy_(flat)
    return buf


def unpack(buf: torch.Tensor, meta: dict) -> list[tuple[str, torch.Tensor]]:
    """The bucket's ``(name, tensor)`` pairs as views of ``buf`` (no copy)."""
    out = []
    for name, dt, shape, off in zip(meta["names"], meta["dtypes"], meta["shapes"], meta["offsets"]):
        dtype = getattr(torch, dt)
        n = _numel(shape) * dtype.itemsize
        out.append((name, buf[off: off + n].view(dtype).view(shape)))
    return out


# ============================================================================ only changed tensors

_INDEXED = re.compile(r"^(.*?\.)?(\d+)(\.|$)")


def load_unit(name: str) -> str:
    """The unit a changed tensor resends whole: its decoder layer (the name up to its first integer segment,
    ``model.layers.3``), else its parent module (``model.embed_tokens``, ``lm_head``)."""
    m = _INDEXED.match(name)
    if m:
        return name[: m.end(2)]
    return name.rsplit(".", 1)[0] if "." in name else name


ROW_WORDS = 1021  # a prime: the row-weighted sum sees a word that moved to another row


def checksum(t: torch.Tensor) -> tuple:
    """``(dtype, shape, sum, row-weighted sum, xor, tail)`` of the tensor's bytes read as int64 words (sums wrap;
    the bytes past the last whole word as they are), on the tensor's device: about 0.1 s per GB on one thread of
    this machine's CPU, where a whole sync moves ~0.65 GB/s (docs/distributed.md, "Weight sync into vLLM"). Equal
    content gives equal sums; an update that leaves all three equal must permute words within one row of
    :data:`ROW_WORDS` or add and subtract matching amounts at once while keeping their xor."""
    flat = t.detach().contiguous().reshape(-1)
    raw = flat.view(torch.uint8)
    whole = raw.numel() - raw.numel() % 8
    try:
        words = raw[:whole].view(torch.int64)
    except RuntimeError:  # a view whose bytes do not start at a multiple of 8
        words = raw[:whole].clone().view(torch.int64)
    s1 = s2 = xor = 0
    if whole:
        s1 = int(words.sum())
        rows = words.numel() // ROW_WORDS
        if rows:
            r = words[: rows * ROW_WORDS].view(rows, ROW_WORDS).sum(1)
            s2 = int((r * torch.arange(1, rows + 1, dtype=torch.int64, device=r.device)).sum())
        hash_tensor = getattr(torch, "hash_tensor", None)  # xor of the words (torch >= 2.8)
        xor = int(hash_tensor(words).view(torch.int64)) if hash_tensor is not None else 0
    return (dtype_name(t.dtype), tuple(t.shape), s1, s2, xor, bytes(raw[whole:].tolist()))


class ChangeTracker:
    """What the engine holds, as checksums of the tensors the last finished sync sent, and the version it
    finished with. :meth:`select` names the tensors to send; :meth:`commit` records them once the engine has them;
    :meth:`forget` (a failed sync, or another client syncing the same engine) makes the next sync a full one."""

    def __init__(self) -> None:
        self.sums: dict[str, tuple] = {}
        self.version: str | None = None

    def select(self, state: dict[str, torch.Tensor], *, served_version: str | None = None
               ) -> tuple[list[str], dict[str, tuple]]:
        """The names to send (state order: every name of a load unit where one changed) and every name's new
        checksum (pass to :meth:`commit`). All of them when nothing was sent yet or ``served_version`` is not the
        version this tracker last finished (someone else synced the engine)."""
        sums = {name: checksum(t) for name, t in state.items()}
        if not self.sums or (served_version is not None and served_version != self.version):
            return list(state), sums
        dirty = {load_unit(n) for n, s in sums.items() if self.sums.get(n) != s}
        return [n for n in state if load_unit(n) in dirty], sums

    def commit(self, sums: dict[str, tuple], version: str) -> None:
        self.sums, self.version = dict(sums), version

    def forget(self) -> None:
        self.sums, self.version = {}, None


# ============================================================================ the process group


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def open_group(host: str, port: int, *, rank: int, world_size: int, timeout_s: float, store: Any = None,
               name: str = GROUP, cancelled: threading.Event | None = None) -> Any:
    """A gloo process group of ``world_size`` ranks through the ``TCPStore`` at ``host:port`` (rank 0 hosts it
    unless ``store`` is given), apart from torch.distributed's default group: the group and each collective fail
    after ``timeout_s`` instead of waiting for a peer forever. Rank 0 first waits in Python for every other rank
    to announce itself in the store (so ``cancelled``, when set, ends its wait at once: no thread is left inside
    gloo's rendezvous), then all build the group."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout, wait_for_workers=False)
    if rank == 0:
        keys = [f"{name}/arrived/{r}" for r in range(1, world_size)]
        deadline = time.monotonic() + timeout_s
        while not store.check(keys):
            if cancelled is not None and cancelled.is_set():
                raise RuntimeError("the rendezvous was called off")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{world_size - 1} peer(s) did not arrive within {timeout_s:g} s")
            time.sleep(0.02)
    else:
        store.set(f"{name}/arrived/{rank}", "1")
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    return dist.ProcessGroupGloo(dist.PrefixStore(name, store), rank, world_size, opts)


def broadcast(group: Any, buf: torch.Tensor) -> Any:
    """Start broadcasting ``buf`` from rank 0 (asynchronous: the returned work's ``wait()`` ends it)."""
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    return group.broadcast([buf], opts)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


# ============================================================================ the trainer's sender


def in_thread(fn: Any, *args: Any) -> Future:
    """``fn(*args)`` on a daemon thread: a call stuck in a collective that failed on this side never holds up the
    interpreter's exit (a ThreadPoolExecutor's threads are joined then)."""
    done: Future = Future()

    def run() -> None:
        try:
            done.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter
            done.set_exception(exc)

    threading.Thread(target=run, name="credo-weight-request", daemon=True).start()
    return done


class WeightSyncClient(Protocol):
    """vLLM's ``VLLMWeightSyncClient`` (in process or over HTTP), plus the version the engine reports."""

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None: ...

    def start_weight_update(self) -> None: ...

    def update_weights(self, update_info: Any) -> None: ...

    def finish_weight_update(self, weight_version: str | None = None) -> None: ...

    def served_version(self) -> str | None: ...


@dataclass
class SyncStats:
    """The last sync: tensors and bytes sent of the state's, buckets, seconds."""

    tensors: int = 0
    tensors_total: int = 0
    bytes: int = 0
    bytes_total: int = 0
    buckets: int = 0
    seconds: float = 0.0


def host_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor whole (a DTensor shard gathered) on the CPU."""
    full = getattr(t, "full_tensor", None)
    return (full() if callable(full) else t).detach().to("cpu")


class TorchDistWeightSync:
    """The trainer (rank 0) of the ``credo_torchdist`` backend. :meth:`init` hosts the rendezvous on ``host``
    (a free port) and has the engine's ``workers`` join through ``client.init_weight_transfer_engine``;
    :meth:`sync` sends a state dict (only what changed when ``only_changed``) in buckets of ``bucket_bytes``,
    versioned. ``advertise`` overrides the ``(host, port)`` the workers are told to dial (a NAT or a tunnel;
    tests use it to give a wrong one). A rendezvous or a transfer that does not complete within ``timeout_s``
    fails with a one-line RuntimeError."""

    def __init__(self, client: WeightSyncClient, *, workers: int = 1, host: str = "127.0.0.1",
                 bucket_bytes: int = BUCKET_BYTES, timeout_s: float = TIMEOUT_S, only_changed: bool = True,
                 advertise: tuple[str, int] | None = None) -> None:
        self.client, self.workers, self.host = client, workers, host
        self.bucket_bytes, self.timeout_s, self.only_changed = bucket_bytes, timeout_s, only_changed
        self.advertise = advertise
        self.group: Any = None
        self.store: Any = None
        self.tracker = ChangeTracker()
        self.stats = SyncStats()
        self._buffers: list[torch.Tensor] = []

    def init(self) -> None:
        """Host the rendezvous, have the workers join (``init_weight_transfer_engine`` on this thread, the
        trainer's side of the group on another: both block until all ranks are in) and hold the group."""
        self.close()
        port = free_port(self.host)
        world = 1 + self.workers
        timeout = datetime.timedelta(seconds=self.timeout_s)
        self.store = dist.TCPStore(self.host, port, world, True, timeout=timeout, wait_for_workers=False)
        host, dial = self.advertise or (self.host, port)
        info = {"master_address": host, "master_port": dial, "world_size": world, "rank_offset": 1,
                "timeout_s": self.timeout_s}
        made: dict[str, Any] = {}
        cancel = threading.Event()

        def join() -> None:
            try:
                made["group"] = open_group(self.host, port, rank=0, world_size=world, timeout_s=self.timeout_s,
                                           store=self.store, cancelled=cancel)
            except Exception as exc:  # noqa: BLE001 - reported by init
                made["error"] = exc

        joiner = threading.Thread(target=join, name="credo-weight-group", daemon=True)
        joiner.start()
        where = f"the process group at {host}:{dial}"
        try:
            self.client.init_weight_transfer_engine(info)
        except Exception as exc:  # noqa: BLE001 - one line: the workers' own error
            cancel.set()
            joiner.join(5.0)
            self.close()
            raise RuntimeError(f"torchdist weight sync: vLLM's worker(s) did not join {where} within "
                               f"{self.timeout_s:g} s ({first_line(exc)})") from None
        joiner.join(self.timeout_s + 5.0)
        if "group" not in made:
            self.close()
            why = first_line(made["error"]) if "error" in made else "no answer"
            raise RuntimeError(f"torchdist weight sync: {where} did not form within {self.timeout_s:g} s ({why})")
        self.group = made["group"]

    def sync(self, state: dict[str, torch.Tensor], *, version: int | str) -> SyncStats:
        """Send ``state`` (Hugging Face names) and have the engine serve it as ``version`` once this returns."""
        if self.group is None:
            raise RuntimeError("torchdist weight sync: init() first")
        t0 = time.perf_counter()
        host = {name: host_tensor(t) for name, t in state.items()}
        if self.only_changed:
            served = self.client.served_version() if self.tracker.sums else None
            names, sums = self.tracker.select(host, served_version=served)
        else:
            names, sums = list(host), {}
        buckets = plan_buckets(((n, host[n]) for n in names), self.bucket_bytes)
        self.client.start_weight_update()
        self.tracker.forget()  # until this one finishes, the engine holds a mix
        if buckets:
            self._send(buckets, host)
        self.client.finish_weight_update(weight_version=str(version))
        if self.only_changed:
            self.tracker.commit(sums, str(version))
        self.stats = SyncStats(tensors=len(names), tensors_total=len(host), buckets=len(buckets),
                               bytes=sum(b["nbytes"] for b in buckets),
                               bytes_total=sum(t.numel() * t.element_size() for t in host.values()),
                               seconds=time.perf_counter() - t0)
        return self.stats

    def _send(self, buckets: list[dict], host: dict[str, torch.Tensor]) -> None:
        """``update_weights`` (the workers receive) on a thread while this one packs and broadcasts each bucket
        (packing bucket k+1 while bucket k is on the wire)."""
        request = in_thread(self.client.update_weights, {"buckets": buckets})
        try:
            self._fail_early(request)
            need = max(b["nbytes"] for b in buckets)
            if len(self._buffers) != 2 or self._buffers[0].numel() < need:
                self._buffers = [torch.empty(need, dtype=torch.uint8) for _ in range(2)]
            pending = None
            for i, meta in enumerate(buckets):
                buf = pack([host[n] for n in meta["names"]], meta, self._buffers[i % 2])
                if pending is not None:
                    self._wait(pending, request)
                pending = broadcast(self.group, buf)
            self._wait(pending, request)
            request.result(timeout=self.timeout_s)
        except BaseException:
            self.tracker.forget()
            raise

    def _fail_early(self, request: Future) -> None:
        if request.done() and request.exception() is not None:
            raise request.exception()  # type: ignore[misc]

    def _wait(self, work: Any, request: Future) -> None:
        try:
            work.wait()
        except Exception as exc:  # noqa: BLE001 - the request's own error says more when it failed first
            why = first_line(request.exception(timeout=1.0) or exc) if request.done() else first_line(exc)
            raise RuntimeError(f"torchdist weight sync: a broadcast failed ({why})") from None
        self._fail_early(request)

    def close(self) -> None:
        """Leave the group (the engine's workers leave theirs at their next init or when they stop)."""
        group, self.group, self.store = self.group, None, None
        self.tracker.forget()
        if group is not None:
            try:
                group.shutdown()
            except Exception:  # noqa: BLE001 - best effort
                pass
