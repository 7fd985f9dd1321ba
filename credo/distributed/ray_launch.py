"""``distributed.backend=ray``: Ray places the trainer ranks; the ranks run the recipe (SPMD, as under torchrun).

The driver (the ``credo train`` process) joins or starts a Ray cluster (:func:`connect`: bounded by
``distributed.ray_connect_timeout_s``, on 127.0.0.1 for a private instance or a loopback address), prepares the
run directory, and starts ``distributed.world_size`` :class:`TrainerRank` actors. The ranks join one
torch.distributed process group (gloo on CPU, nccl on GPU; rank 0's node address and a free port as the
rendezvous) and each runs the same recipe function
the single-process path runs, with its :class:`DataParallel`. Rank 0 is the leader: it builds the Ray rollout and
reward pools (:mod:`credo.distributed.ray_pools`), collects each step's rollouts and evaluations through them,
and broadcasts them to the other ranks (:func:`credo.distributed.rollout.from_leader`); every rank then computes
the update on its share of the rows and the gradients are summed (:mod:`credo.train.data_parallel`).
After each update the leader ships the new weights to the rollout workers with the policy version.

Paths are resolved on the driver and the ranks work in the driver's directory, so relative paths in the config
mean what they mean on the command line (on several nodes they must name a shared file system).
"""
from __future__ import annotations

import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from credo.config import ConfigError
from credo.train.data_parallel import DataParallel
from credo.http_auth import is_loopback
from credo.procs import mark_stuck_thread, reap_when_gone

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
# Ray rewrites a loopback address (127.0.0.1, localhost) to the machine's external address before it connects
# (ray._private.services.resolve_ip_for_localhost) unless its cluster mode is off; this variable turns it off
CLUSTER_MODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"

Entry = Callable[[Any, Path, bool, DataParallel], Path]


def connect(cfg) -> bool:
    """Join ``distributed.ray_address`` or start a private local instance (on 127.0.0.1); True if this call
    connected (and the caller disconnects at the end). An address that does not answer within
    ``distributed.ray_connect_timeout_s``, or ``auto`` without a cluster, raises :class:`RayUnreachable`."""
    from credo.distributed.ray_pools import _ray

    ray = _ray()
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    d = cfg.distributed
    if d.ray_address is None:
        needed = d.worker_cpus * (d.world_size + d.rollout_workers + d.reward_workers)
        start_local(ray, num_cpus=max(os.cpu_count() or 1, math.ceil(needed)), log_to_driver=True)
        return True
    address = resolve_address(d.ray_address)
    host, port = host_port(address)
    probe(host, port, d.ray_connect_timeout_s, shown=d.ray_address)
    # "auto" goes to Ray as "auto": only then does Ray turn on token authentication by itself
    kwargs: dict[str, Any] = dict(address=d.ray_address if d.ray_address == "auto" else address, log_to_driver=True)
    if is_loopback(host):
        keep_on_loopback()
        kwargs["_node_ip_address"] = LOOPBACK
    _init_within(ray, d.ray_connect_timeout_s, d.ray_address, **kwargs)
    return True


class RayUnreachable(ConfigError):
    """``distributed.ray_address`` cannot be used; the message is one line naming the address (exit code 2)."""


def keep_on_loopback() -> None:
    """Keep this process and the Ray processes it starts on 127.0.0.1 (see :data:`CLUSTER_MODE_ENV`); for a
    private instance or a cluster started with ``ray start --head --node-ip-address 127.0.0.1``."""
    os.environ[CLUSTER_MODE_ENV] = "0"
    try:  # Ray reads the variable when it is imported: the imported copy is switched off too
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False
    except (ImportError, AttributeError):  # pragma: no cover - another Ray layout
        pass


def start_local(ray, **kwargs: Any) -> None:
    """``ray.init`` of a private one-node instance bound to 127.0.0.1 (no dashboard); tests use it too. Its
    processes (found by its session directory) are killed once this process is gone
    (:func:`credo.procs.reap_when_gone`)."""
    keep_on_loopback()
    ray.init(_node_ip_address=LOOPBACK, include_dashboard=False, **kwargs)
    try:
        session = ray._private.worker._global_node.get_session_dir_path()
    except AttributeError:  # not the Ray this was written for (or a test double): Ray's own fate sharing only
        return
    reap_when_gone(os.path.join(session, ""))  # with the separator: session_..._123 is no prefix of ..._1234


def resolve_address(address: str) -> str:
    """``auto`` to the running cluster's HOST:PORT (``RAY_ADDRESS``, the last ``ray start``, a running GCS), as
    Ray resolves it but without rewriting 127.0.0.1; any other address as given."""
    if address != "auto":
        return address
    from ray._private import services

    try:
        return services.get_ray_address_from_environment("auto", None)
    except ConnectionError:
        raise RayUnreachable("distributed.ray_address=auto: no running Ray cluster found on this machine (start "
                             "one with `ray start --head --node-ip-address 127.0.0.1`, or give HOST:PORT)") from None


def host_port(address: str) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT`` or ``ray://HOST:PORT``; :class:`RayUnreachable` if it is neither."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        raise RayUnreachable(f"distributed.ray_address={address!r} is not HOST:PORT (or auto, or null)")
    return host.strip("[]"), int(port)


def probe(host: str, port: int, timeout_s: float, *, shown: str) -> None:
    """Connect to ``host:port`` over TCP, retrying until ``timeout_s``; :class:`RayUnreachable` if it never
    answers (a cluster still starting gets the whole time)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.05, deadline - time.monotonic())):
                return
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
        if time.monotonic() + 0.25 >= deadline:
            raise RayUnreachable(f"distributed.ray_address={shown}: nothing answered at {host}:{port} within "
                                 f"{timeout_s:g} s ({reason}); is the Ray cluster running there?")
        time.sleep(0.25)


def _init_within(ray, timeout_s: float, shown: str, **kwargs: Any) -> None:
    """``ray.init(**kwargs)``, given up after ``timeout_s`` (a port that accepts TCP but is no Ray GCS makes Ray
    retry for many minutes). It runs in a helper thread, so Ray's SIGTERM handler is installed here."""
    failure: list[BaseException] = []

    def init() -> None:
        try:
            ray.init(**kwargs)
        except BaseException as exc:  # reported by the caller
            failure.append(exc)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # what ray.init does on this thread
    thread = threading.Thread(target=init, daemon=True, name="credo-ray-init")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        mark_stuck_thread("ray.init")  # the CLI leaves with os._exit: finalizing under it can abort (credo.procs)
        raise RayUnreachable(f"distributed.ray_address={shown}: it accepts connections but no Ray cluster "
                             f"answered within {timeout_s:g} s")
    if failure:
        first = (str(failure[0]).strip().splitlines() or [""])[0][:300]
        raise RayUnreachable(f"distributed.ray_address={shown}: could not join the Ray cluster: "
                             f"{type(failure[0]).__name__}: {first} (a cluster with token authentication, the "
                             f"default of `ray start`, joined by HOST:PORT needs RAY_AUTH_MODE=token)")


def train_on_ray(cfg, run_dir: Path, resume: bool, entry: Entry) -> Path:
    """Run ``entry(cfg, run_dir, resume, dp)`` on every trainer rank; returns rank 0's run directory."""
    from credo.distributed.ray_pools import _ray, scheduling

    ray = _ray()
    d = cfg.distributed
    connected = connect(cfg)
    ranks: list[Any] = []
    try:
        actor = ray.remote(num_cpus=d.worker_cpus, num_gpus=d.trainer_gpus, max_restarts=0,
                           **scheduling(d.ray_placement))(TrainerRank)
        ranks = [actor.remote(r, d.world_size) for r in range(d.world_size)]
        addr, port = ray.get(ranks[0].rendezvous.remote())
        log.info("ray: %d trainer ranks (rendezvous %s:%d) on nodes %s, %d rollout workers, %d reward workers "
                 "(placement %s)", d.world_size, addr, port, ray.get([a.node_id.remote() for a in ranks]),
                 d.rollout_workers, d.reward_workers, d.ray_placement)
        runs = [a.run.remote(entry, cfg, str(Path(run_dir).resolve()), resume, addr, port, os.getcwd())
                for a in ranks]
        return Path(_first_failure_or_all(ray, runs)[0])
    finally:
        for a in ranks:
            ray.kill(a, no_restart=True)
        if connected:
            ray.shutdown()


def _first_failure_or_all(ray, refs: list[Any]) -> list[Any]:
    """Every result; the first rank that raised fails the run at once (its peers would wait on it forever)."""
    pending, results = list(refs), {}
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        results[done[0]] = ray.get(done[0])  # raises the rank's exception (a RayTaskError wrapping it)
    return [results[r] for r in refs]


class TrainerRank:
    """One data-parallel trainer rank in a Ray actor."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def node_id(self) -> str:
        """The Ray node this rank runs on (logged by the driver)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a free port for the process group's TCP store (called on rank 0)."""
        import ray

        addr = ray.util.get_node_ip_address()  # 127.0.0.1 on a loopback-only instance
        with socket.socket() as s:
            s.bind((addr, 0))
            port = s.getsockname()[1]
        return addr, port

    def run(self, entry: Entry, cfg, run_dir: str, resume: bool, addr: str, port: int, cwd: str) -> str:
        import torch
        import torch.distributed as dist

        os.chdir(cwd)
        logging.basicConfig(level=logging.INFO if self.rank == 0 else logging.WARNING,
                            format=f"%(levelname)s [rank {self.rank}] %(name)s: %(message)s")
        comm = cfg.distributed.comm
        comm = comm if comm != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(comm, init_method=f"tcp://{addr}:{port}", rank=self.rank,
                                world_size=self.world_size)
        try:
            return str(entry(cfg, Path(run_dir), resume, DataParallel(self.rank, self.world_size)))
        finally:
            dist.destroy_process_group()
