"""Starting or joining Ray for `study run` and `study tune`: an embedded Ray on loopback only, or a
cluster's address checked before it is joined; and a SIGTERM to the driver turned into Ctrl-C."""
from __future__ import annotations

import contextlib
import os
import re
import sys

# the directory that holds the installed project's packages (study/, store/, ...): the source tree of an
# editable install, site-packages otherwise
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@contextlib.contextmanager
def workers_import_the_project():
    """Ray puts the driver's working directory first on every worker's sys.path (ray.init records it in the
    job's config): a folder there named like one of the project's packages (a results folder `store`)
    shadows the package, and every trial fails on import. While ray.init runs, the driver stands in
    PROJECT_ROOT instead, so that is what the workers put first; the working directory comes back after.
    (Tune moves each trial into its own trial directory anyway: no trial reads the driver's.)"""
    here = os.getcwd()
    os.chdir(PROJECT_ROOT)
    try:
        yield
    finally:
        os.chdir(here)


def _loopback_only() -> None:
    """Make a Ray started by this process bind 127.0.0.1 only (checked with `ss -ltnp` in the tests).

    Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when `ray._private.ray_constants` is imported:
    if ray was imported before (by a test, by Tune), the module constant is set too. The env
    var also reaches the GCS, raylet and workers that `ray.init` spawns.
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if "ray._private.ray_constants" in sys.modules:
        sys.modules["ray._private.ray_constants"].ENABLE_RAY_CLUSTER = False


def check_address(address: str | None) -> None:
    """None (embedded Ray), auto, HOST:PORT or ray://HOST:PORT; anything else is an error."""
    host_port = r"(ray://)?([^\s:/\[\]]+|\[[0-9a-fA-F:.]+\]):\d{1,5}"  # IPv6 hosts in brackets
    if address is None or address == "auto" or re.fullmatch(host_port, address):
        return
    raise ValueError(f"--address {address!r}: use auto, HOST:PORT or ray://HOST:PORT")


START_ATTEMPTS = 3  # embedded Ray starts tried before `study run` gives up


def init_ray(address: str | None, num_cpus: int | None = None, store=None, echo=print):
    """Join `address` (auto, HOST:PORT, ray://HOST:PORT), or start an embedded Ray on loopback only.

    With `store` (the study's, its lease held), an embedded start first ends the Ray processes a killed
    driver of the study left, then records its own (study/engine/rayprocs.py).
    Returns (ray, started): `started` says whether this call started Ray (and should shut it down).
    """
    if address is None:
        _loopback_only()  # an open Ray port runs anyone's code
    import ray

    if ray.is_initialized():
        return ray, False
    kw = dict(include_dashboard=False, log_to_driver=False, configure_logging=True, logging_level="ERROR")
    if address is None:
        from study.engine import rayprocs

        address_space_or_refuse()
        if store is not None:
            rayprocs.end_left_over(store, echo)
        # no RAY_ADDRESS leaking in from the environment: embedded means embedded
        os.environ.pop("RAY_ADDRESS", None)
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                # "local": a new Ray, never a `ray start` cluster that ray.init(address=None) would join
                # (it reads /tmp/ray/ray_current_cluster) and that refuses num_cpus
                with workers_import_the_project():
                    ray.init(address="local", num_cpus=num_cpus or os.cpu_count(), **kw)
                break
            except KeyboardInterrupt:  # a Ctrl-C during the start: nothing of it is left behind
                rayprocs.end_own(ray.shutdown)
                raise
            except Exception as e:
                # Ray gives a raylet a hard-coded 30 s to register; a crowded machine can miss it.
                # Nothing has run yet: shut down what this attempt started and start again.
                rayprocs.end_own(ray.shutdown)  # and what the shutdown of a half-started node leaves
                if "timed out during startup" not in str(e) or attempt == START_ATTEMPTS:
                    raise
                print(f"ray: the local node timed out during startup (attempt {attempt}/{START_ATTEMPTS}); "
                      "starting it again", file=sys.stderr)
        if store is not None:
            rayprocs.record(store)
    else:
        check_address(address)
        reachable(address)
        try:
            with workers_import_the_project():
                _join(ray, address, kw)
        except (ConnectionError, TimeoutError) as e:
            raise ClusterError(f"--address {address}: could not join the Ray cluster ({_first_line(e)})") from None
    return ray, True


WORKER_AS_BYTES = 4 << 30  # a trial worker's address space besides the object store it maps (3.5-4 GiB measured)


def address_space_or_refuse() -> None:
    """Refuse (ClusterError) to start Ray under an address-space limit (`ulimit -v`, `prlimit --as`) below
    what its processes map: the raylet and every worker map the whole object store (30% of the free memory
    by Ray's default) and a worker holds torch besides. Ray's own failure is an mmap error in raylet.out,
    seen on the terminal as a node that "timed out during startup" three times over (220 s)."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return
    from ray._private.utils import estimate_available_memory, resolve_object_store_memory

    store = resolve_object_store_memory(estimate_available_memory())
    if limit < store + WORKER_AS_BYTES:
        raise ClusterError(
            f"this process's address-space limit (ulimit -v) is {limit / 2**30:.1f} GiB, below the "
            f"{(store + WORKER_AS_BYTES) / 2**30:.1f} GiB a Ray worker maps ({store / 2**30:.1f} GiB of object store, "
            f"Ray's default of 30% of the free memory, and about 4 GiB of its own): Ray's mmap of the object store "
            f"would fail; raise the limit (`ulimit -v unlimited`) or shrink the store "
            f"(RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION=0.05)")


def _join(ray, address: str, kw: dict) -> None:
    """ray.init(address=...), interruptible: Ray's join blocks in C++ for 30 s and more (a port that
    accepts TCP but is no Ray), where Python never sees a Ctrl-C. The join runs in a thread; the main
    thread waits on it, so Ctrl-C ends the process at once, saying so (nothing has run yet)."""
    import signal
    import threading

    box: dict = {}

    def join():
        try:
            ray.init(address=address, **kw)
        except BaseException as e:  # handed to the main thread
            box["error"] = e

    t = threading.Thread(target=join, name="ray-join", daemon=True)
    t.start()
    try:
        while t.is_alive():
            t.join(0.1)
    except KeyboardInterrupt:
        print(f"interrupted while joining the Ray cluster at {address}; nothing was run", file=sys.stderr,
              flush=True)
        sys.stdout.flush()
        os._exit(130)  # the join thread cannot be stopped, and Ray's exit hooks would wait on it
    if "error" in box:
        raise box["error"]
    if threading.current_thread() is threading.main_thread():  # what ray.init does on the main thread
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))


class ClusterError(ValueError):
    """The cluster cannot be reached, or cannot ever place what the grid asks for."""


REACH_TIMEOUT_S = 10.0  # TCP connect to --address; Ray's own join retries for minutes


def reachable(address: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """A HOST:PORT (or ray://HOST:PORT) address accepts TCP connections, checked within `timeout_s`."""
    import socket

    shown = address
    if address == "auto":  # the GCS address Ray would join (RAY_ADDRESS, `ray start`'s file, a local GCS),
        address = _auto_address()  # checked like HOST:PORT: a stale one would hang ray.init for minutes
        shown = f"auto ({address})"
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise ClusterError(f"--address {shown}: cannot reach the Ray cluster ({why} after at most "
                           f"{timeout_s:g}s); is it started (`ray start --head`) and is the port open?") from None


def _auto_address() -> str:
    """The HOST:PORT `--address auto` joins (ClusterError if none): $RAY_ADDRESS, else the cluster the last
    `ray start` recorded (<RAY_TMPDIR>/ray/ray_current_cluster), else the one Ray cluster running here.

    Ray itself prefers a single running GCS to the recorded file; we always take the file when there is
    one, so what `auto` joins does not depend on which other Ray instances happen to run on this machine."""
    import logging

    from ray._private.services import (canonicalize_bootstrap_address, canonicalize_bootstrap_address_or_die,
                                       find_bootstrap_address)

    if not os.environ.get("RAY_ADDRESS"):
        recorded = find_bootstrap_address(None)
        if recorded:
            try:
                return canonicalize_bootstrap_address(recorded)
            except ValueError as e:
                raise ClusterError(f"--address auto: {_first_line(e)}") from None

    log = logging.getLogger("ray._private.services")
    level = log.level
    log.setLevel(logging.ERROR)  # its "found multiple Ray instances" warning: the address chosen is named below
    try:
        return canonicalize_bootstrap_address_or_die("auto")
    except (ConnectionError, ValueError) as e:
        raise ClusterError(f"--address auto: {_first_line(e)}") from None
    finally:
        log.setLevel(level)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def sigterm_as_ctrl_c() -> None:
    """A SIGTERM to the driver (`kill PID`, a scheduler stopping a job) does what Ctrl-C does: it calls the
    SIGINT handler of the moment (Tune's during a sweep: the trials stop, their checkpoints stay, the
    "interrupted" line is printed and the exit code is Ctrl-C's; elsewhere KeyboardInterrupt)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def term(signum, frame):
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, term)
