"""One driver per study: a lease in the store, held with a heartbeat (docs/DESIGN.md, "One driver per study",
gives the protocol and its argument; docs/guide/store.md what a user sees).

`study run` and `study tune` take their study's lease before they write anything; read-only commands never
take it. Layout, in `<root>/<study>/lease/`:

    g<generation>.json            the holder of that generation (created exclusively: local disk, S3)
    g<generation>.<token>.json    other object stores: one claim per contender; the smallest token holds

The current holder is the newest generation; a holder that finds a newer one has lost the lease (`fence`).
"""
from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

import pyarrow.fs as pafs

import atomicio

BEAT_ENV, TTL_ENV, SETTLE_ENV, POLL_ENV = ("RMDM_LEASE_BEAT_S", "RMDM_LEASE_TTL_S", "RMDM_LEASE_SETTLE_S",
                                           "RMDM_LEASE_POLL_S")
DEFAULTS = {BEAT_ENV: 10.0, TTL_ENV: 60.0, SETTLE_ENV: 2.0, POLL_ENV: 5.0}
DIR = "lease"
_NAME = re.compile(r"g(\d{10})(?:\.([0-9a-f]{32}))?\.json")
MAX_WITHDRAWALS = 5  # object-store claims withdrawn for slowness before giving up


def setting(env: str) -> float:
    """A timing of the lease in seconds, from the environment (tests make them short)."""
    raw = os.environ.get(env)
    if raw is None or not raw.strip():
        return DEFAULTS[env]
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not (v > 0 and v < 1e7):
        raise ValueError(f"${env} = {raw!r}: give a positive number of seconds")
    return v


def timings() -> tuple[float, float, float]:
    """(beat, ttl, settle), checked: a heartbeat must come well inside the timeout."""
    beat, ttl, settle = setting(BEAT_ENV), setting(TTL_ENV), setting(SETTLE_ENV)
    if ttl < 2 * beat:
        raise ValueError(f"${TTL_ENV} = {ttl:g} must be at least twice ${BEAT_ENV} = {beat:g}")
    return beat, ttl, settle


class LeaseHeld(Exception):
    """Another live driver holds the study's lease."""


class LeaseLost(RuntimeError):
    """This driver's lease was taken over (it sent no heartbeat for the timeout)."""


# ---- who and where -------------------------------------------------------------------------------
def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def machine() -> dict:
    """What makes two processes' PIDs comparable: the host name, the kernel's boot and the PID namespace
    (containers share a boot id, never a PID namespace)."""
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = ""
    return {"host": socket.gethostname(), "boot": _read("/proc/sys/kernel/random/boot_id"), "pidns": ns}


def proc_start(pid: int) -> str | None:
    """The process's start time (clock ticks after boot) if it lives (not a zombie), else None."""
    stat = _read(f"/proc/{int(pid)}/stat")
    if not stat:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return fields[19] if len(fields) > 19 else "?"


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


@dataclass
class Holder:
    """One generation's holder, as its file says."""
    gen: int
    path: str
    info: dict
    mtime: float | None = None

    def process_alive(self) -> bool | None:
        """True / False on this machine (see `machine`); None when the holder ran elsewhere (only its
        heartbeat tells)."""
        me = machine()
        if not me["boot"] or any(self.info.get(k) != me[k] for k in ("host", "boot", "pidns")) \
                or not self.info.get("pid"):
            return None
        start = proc_start(int(self.info["pid"]))
        return start is not None and (start == self.info.get("start") or self.info.get("start") is None)

    def age(self, now: float | None = None) -> float | None:
        """Seconds since its last heartbeat (its own clock), or since the file changed if unreadable."""
        now = time.time() if now is None else now
        beat = self.info.get("beat", self.mtime)
        return None if beat is None else max(0.0, now - float(beat))

    def state(self, ttl: float, now: float | None = None) -> str:
        """held | released | dead (its process ended, on this machine) | stale (no heartbeat for `ttl`)."""
        if self.info.get("state") == "released":
            return "released"
        alive = self.process_alive()
        if alive is False:
            return "dead"
        if alive is None:
            age = self.age(now)
            if age is not None and age > ttl:
                return "stale"
        return "held"

    def describe(self, now: float | None = None) -> str:
        i = self.info
        if not i:
            return f"an unreadable lease file {self.path}"
        age = self.age(now)
        beat = f"last heartbeat {age:.0f}s ago" if age is not None else "no heartbeat"
        if i.get("state") == "released":
            beat = f"released {_utc(float(i.get('released', i.get('beat', 0))))}"
        return (f"`study {i.get('command', '?')}` on {i.get('host', '?')} pid {i.get('pid', '?')} "
                f"since {_utc(float(i.get('since', 0)))} ({beat})")


# ---- the lease directory -------------------------------------------------------------------------
def lease_dir(store) -> str:
    return f"{store.dir}/{DIR}"


def _listing(store) -> dict[int, list[tuple[str | None, pafs.FileInfo]]]:
    """generation -> [(token or None, file info)] of every lease file."""
    out: dict[int, list] = {}
    for info in store.fs.get_file_info(pafs.FileSelector(lease_dir(store), allow_not_found=True)):
        m = _NAME.fullmatch(info.base_name)
        if m and info.type == pafs.FileType.File:
            out.setdefault(int(m.group(1)), []).append((m.group(2), info))
    return out


def current(store) -> Holder | None:
    """The newest generation's holder, or None when the study never had a lease."""
    files = _listing(store)
    if not files:
        return None
    gen = max(files)
    # local: the one untokened file; object store: the smallest token's claim
    _, info = min(files[gen], key=lambda f: (f[0] is not None, f[0] or ""))
    data = store.read_bytes(info.path)
    try:
        parsed = atomicio.loads_json(data) if data else {}
        parsed = parsed if isinstance(parsed, dict) else {}
    except ValueError:
        parsed = {}
    return Holder(gen, info.path, parsed, info.mtime.timestamp() if info.mtime else None)


def successor(store, gen: int) -> Holder | None:
    """The holder of a generation newer than `gen` (the holder of `gen` lost the lease to it), or None."""
    h = current(store)
    return h if h is not None and h.gen > gen else None


def status_line(store, now: float | None = None) -> str:
    """`study status`'s line about the lease: who holds it and whether its heartbeat is fresh."""
    try:
        _, ttl, _ = timings()
    except ValueError:
        ttl = DEFAULTS[TTL_ENV]
    h = current(store)
    if h is None:
        return "lease: free (no driver has run this study)"
    st = h.state(ttl, now)
    if st == "released":
        return f"lease: free (last held by {h.describe(now)})"
    return f"lease: held by {h.describe(now)}" + {
        "dead": ", but that process has ended: the next driver takes over",
        "stale": f": heartbeat stale (over {ttl:g}s): the next driver takes over",
        "held": ": heartbeat fresh"}[st]


# ---- conditional writes (S3 through boto3) -----------------------------------------------------------
def _cas_put(client, path: str, data: bytes, etag: str | None = None) -> str | None:
    """put_object with If-None-Match: * (create) or If-Match: etag (rewrite): its ETag, None when the condition
    fails."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, key = path.split("/", 1)
    try:
        return client.put_object(Bucket=bucket, Key=key, Body=data,
                                 **({"IfMatch": etag} if etag else {"IfNoneMatch": "*"}))["ETag"]
    except ClientError as e:  # 412: the condition failed; 409: a concurrent conditional write won
        if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412):
            return None
        raise OSError(f"{path}: {e}") from e
    except BotoCoreError as e:
        raise OSError(f"{path}: {e}") from e


def conditional_writes(store):
    """A boto3 client of an s3:// store whose server honours If-None-Match (probed: see _cas_put), else None."""
    if not str(store.root).lower().startswith("s3://"):
        return None
    try:
        import boto3
    except ImportError:
        return None
    from urllib.parse import parse_qsl, urlsplit

    q = dict(parse_qsl(urlsplit(store.root).query))
    kw = {"endpoint_url": f"{q.get('scheme', 'https')}://{q['endpoint_override']}"} if "endpoint_override" in q else {}
    kw.update({"region_name": q["region"]} if "region" in q else {})
    if "access_key" in q:
        kw.update(aws_access_key_id=q["access_key"], aws_secret_access_key=q.get("secret_key"))
    cas = boto3.client("s3", **kw)
    probe = f"{lease_dir(store)}/.probe-{uuid.uuid4().hex}"
    try:
        honoured = _cas_put(cas, probe, b"1") is not None and _cas_put(cas, probe, b"2") is None
        store.fs.delete_file(probe)
    except OSError:
        return None
    return cas if honoured else None


# ---- taking and holding it -----------------------------------------------------------------------
@dataclass
class Lease:
    store: object
    gen: int
    token: str
    info: dict
    path: str
    beat_s: float
    ttl_s: float
    on_lost: object = None  # called once (from the heartbeat thread) with the newer Holder
    cas: object = None  # S3 with conditional writes (a boto3 client): each rewrite If-Match `etag`
    etag: str | None = None
    lost: Holder | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _last_ok: float = field(default_factory=time.monotonic)
    _sigterm: object = None

    @property
    def fence(self) -> dict:
        """What a trial needs to check that its driver still holds the lease (see `fence`)."""
        return {"gen": self.gen, "token": self.token}

    def _write(self) -> bool:
        """Rewrite the lease file; False when a conditional rewrite finds it replaced (the lease is lost)."""
        data = json.dumps(self.info, sort_keys=True).encode()
        if self.cas is not None:
            self.etag = _cas_put(self.cas, self.path, data, self.etag)
            return self.etag is not None
        if self.store.local:
            atomicio.write_bytes(self.path, data)
        else:
            with self.store.fs.open_output_stream(self.path) as f:  # a PUT replaces the object whole
                f.write(data)
        return True

    def beat(self) -> bool:
        """One heartbeat: False (and `lost` set) when a newer generation exists or renewals failed for
        the whole timeout."""
        try:
            newer = successor(self.store, self.gen)
            if newer is None:
                self.info["beat"] = time.time()
                if self._write():
                    self._last_ok = time.monotonic()
                    return True
                newer = current(self.store) or Holder(self.gen, self.path, {}, None)
        except OSError:
            if time.monotonic() - self._last_ok < self.ttl_s:
                return True  # the store did not answer: try again at the next beat
            newer = Holder(self.gen, self.path, {}, None)
        self.lost = newer
        if self.on_lost is not None:
            self.on_lost(newer)
        return False

    def start(self) -> None:
        def loop():
            while not self._stop.wait(self.beat_s):
                if not self.beat():
                    return

        self._thread = threading.Thread(target=loop, name="study-lease", daemon=True)
        self._thread.start()
        if threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            # a SIGTERM ends the driver as Ctrl-C does, so the lease is released on the way out
            self._sigterm = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, _sigterm_as_interrupt)

    def release(self) -> None:
        """Stop the heartbeat and mark the lease released (unless it was lost to a newer driver)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.beat_s + 30)
        if self._sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
        if self.lost is not None:
            return
        try:
            if successor(self.store, self.gen) is None:
                self.info.update(state="released", beat=time.time(), released=time.time())
                try:
                    self._write()
                except OSError as e:
                    if not (self.store.local and e.errno == errno.ENOSPC):
                        raise
                    self._write_in_place()
        except OSError:
            pass  # the store is gone: the heartbeat's timeout frees the lease

    def _write_in_place(self) -> None:
        """A full local disk has no block for the temp file of an atomic write, but the lease file's own
        block is there: the released state is written over it. Not atomic: a reader that catches the write
        half done sees an unreadable lease file (held until the heartbeat's timeout, as any unreadable one)."""
        with open(self.path, "r+b") as f:
            f.write(json.dumps(self.info, sort_keys=True).encode())
            f.truncate()

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt


def acquire(store, command: str, wait: bool = False, echo=print, on_lost=None) -> Lease:
    """Take the study's lease for `command` ("run", "tune"), started with its heartbeat.

    A live holder: LeaseHeld (one line naming it) or, with `wait`, poll until it is free. A holder
    that released it, died, or sent no heartbeat for the timeout: taken over (said through `echo`)."""
    beat_s, ttl_s, settle_s = timings()
    poll_s = setting(POLL_ENV)
    waited, withdrawn = False, 0
    while True:
        h = current(store)
        gen = 1 if h is None else h.gen + 1
        st = None if h is None else h.state(ttl_s)
        if st == "held":
            if not wait:
                raise LeaseHeld(_held_message(store, h))
            if not waited:
                echo(f"lease: study {store.study} is being run by {h.describe()}; waiting for it to end (--wait)")
                waited = True
            time.sleep(poll_s)
            continue
        token = uuid.uuid4().hex
        now = time.time()
        info = {"token": token, "gen": gen, "command": command, "pid": os.getpid(),
                "start": proc_start(os.getpid()), "since": now, "beat": now, "state": "held", **machine()}
        cas = None if store.local else conditional_writes(store)
        if not store.local and cas is None and not withdrawn:
            echo(f"lease: {store.root.split('?')[0]} takes no conditional writes here (boto3 missing: pip install "
                 f"'rmdm-study[s3]'; or the store ignores them): claim, wait {settle_s:g}s, list again")
        got = _claim(store, cas, gen, token, info, settle_s)
        if got is None:  # withdrawn: the store answered too slowly for a safe claim
            withdrawn += 1
            if withdrawn >= MAX_WITHDRAWALS:
                raise OSError(f"{lease_dir(store)}: the store answered too slowly to take the study's lease "
                              f"safely ({MAX_WITHDRAWALS} tries; raise ${SETTLE_ENV}, now {settle_s:g}s)")
            time.sleep(settle_s)
            continue
        if not got:
            continue  # another driver took this generation first: look again
        path, etag = got
        if st in ("dead", "stale"):
            why = "its process has ended" if st == "dead" else f"no heartbeat for over {ttl_s:g}s"
            echo(f"lease: took over study {store.study} from {h.describe()}: {why}")
        _forget_old(store, gen)
        lease = Lease(store, gen, token, info, path, beat_s, ttl_s, on_lost, cas=cas, etag=etag)
        lease.start()
        return lease


def _held_message(store, h: Holder) -> str:
    return (f"study {store.study} is being run by {h.describe()}; a second driver would train its runs "
            f"twice: wait for it to end, stop it, or pass --wait to start when it does (lease: {h.path})")


def held_by(store) -> str | None:
    """The refusal a driver would get now (a live driver holds the study), or None: a read-only check."""
    _, ttl_s, _ = timings()
    h = current(store)
    return _held_message(store, h) if h is not None and h.state(ttl_s) == "held" else None


def _claim(store, cas, gen: int, token: str, info: dict, settle_s: float):
    """Claim generation `gen` (docs/DESIGN.md): created exclusively (local disk: a complete file hard-linked
    into place; S3 with conditional writes `cas`: If-None-Match) or, on other object stores, a claim of its
    own token settled: (its path, its ETag or None), False (another taker holds it) or None (withdrawn: the
    store answered too slowly, or a conditional taker met a settle claim of its generation)."""
    d, settle = lease_dir(store), not store.local and cas is None
    path = f"{d}/g{gen:010d}{'.' + token if settle else ''}.json"
    t0 = time.monotonic()
    if max(_listing(store), default=0) >= gen:
        return False
    data, etag = json.dumps(info, sort_keys=True).encode(), None
    if store.local:
        os.makedirs(d, exist_ok=True)
        tmp = f"{d}/.g{gen:010d}.{token}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
    elif cas is not None:
        etag = _cas_put(cas, path, data)
        if etag is None:
            return False
    else:
        with store.fs.open_output_stream(path) as f:
            f.write(data)
        if time.monotonic() - t0 >= settle_s / 2:
            store.fs.delete_file(path)
            return None
        time.sleep(settle_s)
    # a generation older than the newest can be free again (removed by a newer holder): then it is no lease
    files = _listing(store)
    newer, claims = max(files, default=0) > gen, [t for t, _ in files.get(gen, [])]
    rival = not store.local and (any(t is not None for t in claims) if cas is not None else
                                 (None in claims or min(claims, default=token) != token))
    if newer or rival:
        store.fs.delete_file(path)
        return False if newer or settle else None
    return path, etag


def _forget_old(store, gen: int) -> None:
    """Delete the files of generations before the previous one (the previous one names who we replaced)."""
    for g, files in _listing(store).items():
        if g < gen - 1:
            for _, info in files:
                try:
                    store.fs.delete_file(info.path)
                except OSError:
                    pass


# ---- trials --------------------------------------------------------------------------------------
def fence(store, held: dict | None):
    """A check for a trial of the driver that holds `held` (Lease.fence): raises LeaseLost once a newer
    generation exists (its driver lost the lease, or died and was replaced). Lists the lease directory at
    most once per heartbeat interval."""
    if not held:
        return lambda: None
    every = setting(BEAT_ENV)
    last = {"at": -float("inf")}

    def check() -> None:
        if time.monotonic() - last["at"] < every:
            return
        last["at"] = time.monotonic()
        h = successor(store, int(held["gen"]))
        if h is not None:
            raise LeaseLost(f"study {store.study}: this trial's driver no longer holds the lease (now held by "
                            f"{h.describe()}): stopping")

    return check
