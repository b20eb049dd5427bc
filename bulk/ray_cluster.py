"""The Ray cluster as the driver sees it: started or joined (`connect`; `JoinError` says what to check where it
cannot be), its nodes' CPUs and how many workers of --threads they hold (`node_cpus`, `actors_that_fit`,
`threads_refusal`, `workers_note`), and the watches that end the job, saying what to do, when its own instance
or the cluster's head is lost as it runs (`watch_own_instance`, `watch_cluster`). Only this module,
bulk/on_ray.py, bulk/ray_actor.py and bulk/ray_reports.py import Ray, each inside the functions that use it.

Ray's usage statistics are turned off (RAY_USAGE_STATS_ENABLED=0) for the instance a job starts and for
its workers; a cluster started with `ray start` needs it in that command's environment too (docs/bulk.md)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import threading
import time
from pathlib import Path

from bulk import outputs

# A job's objects are part descriptions and results of a few kB: Ray's default store (30% of memory)
# would only take memory from the workers.
OBJECT_STORE_BYTES = 128 << 20
WORKER_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false"}


def connect(address: str, cpus: int) -> str | None:
    """Start (address "local") or join the Ray cluster. Returns the session directory of an instance this
    call started, which the job records in --out: a kill -9 leaves some of its processes, and the next run
    ends them (bulk/own_ray.py)."""
    import ray

    os.environ.update(WORKER_ENV)  # the instance `ray.init` starts reads it from our environment
    if ray.is_initialized():
        return None
    runtime_env = {"env_vars": WORKER_ENV}
    if address == "local":  # an instance of our own on this machine, ended with the job
        _token_where_home_is_unwritable()
        # No runtime_env: its workers inherit WORKER_ENV from the raylet, started from our environment. One
        # given (even these env_vars alone) keeps the job off the workers the raylet prestarts, and every
        # actor (the job's and Ray Data's own) waited for a new Python process that imports Ray.
        started = ray.init(address="local", num_cpus=cpus, object_store_memory=OBJECT_STORE_BYTES,
                           include_dashboard=False, log_to_driver=False)  # fmt: skip
        return started.address_info.get("session_dir")
    found, shown = _address_of(address)
    _check_reachable(found, shown)
    try:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    # ValueError: an address Ray reads otherwise than BulkConfig's check (which refuses the forms known
    # to reach it); still the cluster named cannot be joined, not a fault of the job.
    except (ConnectionError, ValueError) as e:
        raise JoinError(_join_failed(found, e, shown)) from None
    return None


def _token_where_home_is_unwritable() -> None:
    """Ray 2.60 guards an instance it starts with a token: RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH names,
    else ~/.ray/auth_token, which it writes when there is none. A home that cannot be written (a service
    user's HOME=/nonexistent, a read-only root file system) ended the job in a FileNotFoundError traceback
    from Ray. There the instance gets a token of the job's own, in the environment its processes inherit,
    and nothing is written; elsewhere Ray's own file stands (`ray status` reads it to look at the instance)."""
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        return  # the user turned authentication off
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    try:
        home = Path.home() / ".ray"
        if (home / "auth_token").is_file():
            return
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK):
            return
    except (OSError, RuntimeError):  # RuntimeError: no HOME and no home in the password database
        pass
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)


def cluster_cpus() -> int:
    """The CPUs of the cluster joined, all its nodes' (a head started with --num-cpus 0 counts none)."""
    import ray

    return int(ray.cluster_resources().get("CPU", 0))


def node_cpus() -> list[int]:
    """The CPUs of each live node of the cluster joined; the cluster's total as one node where Ray does not
    say (ray.nodes() through Ray Client, another version)."""
    import ray

    try:
        nodes = ray.nodes()
        cpus = [int(n.get("Resources", {}).get("CPU", 0)) for n in nodes if n.get("Alive")]
    except Exception:
        cpus = []
    return cpus or [cluster_cpus()]


def actors_that_fit(cpus: list[int], threads: int) -> int:
    """How many actors of `threads` CPUs each the nodes hold: an actor runs on one node, so two nodes of 3
    CPUs hold two actors of 2 threads, not three."""
    return sum(c // threads for c in cpus)


def threads_refusal(cpus: list[int], threads: int, address: str) -> str | None:
    """Why no actor of --threads CPUs can start on these nodes (each actor asks num_cpus=--threads, on one
    node), or None. Ray keeps such an actor pending for ever: the job hung, and a SIGTERM then waited for a
    part that never started."""
    largest = max(cpus, default=0)
    if threads <= largest:
        return None
    if largest == 0:
        return (f"the Ray cluster at {address} (--ray) has no CPU for a worker (its head was started with "
                "--num-cpus 0 and no node with CPUs has joined): start one (ray start --address ... "
                "--num-cpus N), or leave --ray out to score here")  # fmt: skip
    return (f"--threads {threads} is more than any node of the Ray cluster at {address} (--ray) has: its "
            f"largest has {largest} CPU(s), and a worker runs on one node, so none could start (Ray would "
            f"wait for one for ever). Give --threads {largest} or fewer, or add a node with {threads} CPUs "
            f"or more (ray start --num-cpus {threads})")  # fmt: skip


def workers_note(cpus: list[int], threads: int, workers: int, address: str) -> str | None:
    """What to know when --workers asks more actors than the cluster's nodes hold: Ray Data runs the job
    on those that fit (it did not wait for the rest: measured on a 2-CPU head with --workers 6), and starts
    more only as nodes join; None where they all fit."""
    fit = actors_that_fit(cpus, threads)
    if fit >= workers:
        return None
    return (
        f"note: the Ray cluster at {address} holds {fit} worker(s) of {threads} thread(s), not --workers "
        f"{workers}: the job runs on those, and on more as nodes with free CPUs join (ray start --address ...)"
    )


def watch_own_instance(signalled, out, every_s: float = 0.1) -> threading.Event:
    """For a job on an instance of its own (--ray without an address), whose GCS and raylet share the
    job's process group: a SIGTERM sent to the whole group (systemd's default) ends them with the job, and
    the driver would wait a minute for them, then exit 1. Once a signal came and one of them is gone, say
    so and exit at once, with the signal's status. A race: Ray ends its driver with status 1 when it sees
    its raylet gone first. Returns the event that ends the watch."""
    done = threading.Event()

    def instance_gone() -> bool:
        try:  # Ray's node handle: no public API says whether the processes it started still run
            import ray._private.worker as ray_worker

            node = ray_worker._global_node
            return node is not None and any(
                kind in ("gcs_server", "raylet") for kind, _ in node.dead_processes()
            )
        except Exception:  # another Ray version: no watch, as before it
            return False

    def watch() -> None:
        while not done.wait(every_s):
            signum = signalled()
            if signum and instance_gone() and not done.is_set():  # not once the job has ended its own way
                with contextlib.suppress(OSError):  # on the way out: nothing to say of a failure here
                    outputs.remove_figures(out)
                os.write(2, f"\nbulk: {signal.Signals(signum).name} ended this job's own Ray instance too (it "
                            "reached the whole process group): the finished parts are kept, the running ones are "
                            "scored again by the next run; run the same command again\n".encode())  # fmt: skip
                os._exit(128 + signum)  # Ray's exit handlers would wait a minute for the instance

    threading.Thread(target=watch, name="ray-instance-watch", daemon=True).start()
    return done


# Ray ends a driver whose cluster's head (its GCS) has not answered for this long, with status 1 and only
# its own errors; the job says so first, at LOST_AFTER of it (a head that comes back sooner is waited for).
RECONNECT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"
LOST_AFTER = 0.75


def watch_cluster(address: str, failed_status: int, every_s: float = 2.0) -> threading.Event:
    """For a job on a cluster it joined (--ray ADDRESS): once the head has not answered for LOST_AFTER of
    Ray's own reconnect timeout (60 s unless RAY_gcs_rpc_server_reconnect_timeout_s says), say that the
    cluster is lost, that the finished parts are kept and that the same command resumes, and exit with
    `failed_status`, before Ray's own exit (status 1, a minute of raw errors). Returns the event that
    ends the watch."""
    import ray

    done = threading.Event()
    target = _host_port(address)
    if target is None:  # `auto`: the head the job found
        with contextlib.suppress(Exception):
            target = _host_port(ray.get_runtime_context().gcs_address)
    if target is None:
        return done
    try:
        grace = LOST_AFTER * float(os.environ.get(RECONNECT_ENV, "60"))
    except ValueError:
        grace = LOST_AFTER * 60
    # The head is asked at least ten times within the grace: the job says so between the grace and Ray's
    # own exit, which is only a quarter of the timeout later. At 2 s a look, a timeout set to 8 s (a grace
    # of 6) had the job look again at 8 s, when Ray may already have ended it. The default's 45 s grace
    # keeps its look every 2 s.
    if grace > 0:
        every_s = min(every_s, grace / 10)
    grace = max(grace, 3 * every_s)  # a timeout set to 0 or less: still more than one missed answer

    def answers() -> bool:
        try:
            socket.create_connection(target, timeout=every_s).close()
            return True
        except OSError:
            return False

    def watch() -> None:
        lost_since = None
        while not done.wait(every_s):
            if answers():
                lost_since = None
                continue
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since >= grace and not done.is_set():
                os.write(2, f"\nbulk: lost the Ray cluster at {address} (--ray): its head ({target[0]}:{target[1]}) "
                            f"has not answered for {grace:.0f} s. The finished parts are kept (manifest.jsonl); the "
                            "parts that were running are scored again by the next run. Once the cluster is back "
                            "(ray start), run the same command again to resume\n".encode())  # fmt: skip
                os._exit(failed_status)  # Ray's exit handlers would wait for the head until its own timeout

    threading.Thread(target=watch, name="ray-cluster-watch", daemon=True).start()
    return done


def joined_address(address: str) -> str:
    """The address messages name once joined: --ray auto's as Ray resolved it (the head to look at)."""
    if address != "auto":
        return address
    import ray

    with contextlib.suppress(Exception):  # not joined, or a runtime without it: "auto" as given
        if ray.is_initialized():
            return ray.get_runtime_context().gcs_address
    return address


def _host_port(address: str) -> tuple[str, int] | None:
    host, _, port = address.rpartition("://")[2].rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


class JoinError(ConnectionError):
    """The cluster named by --ray could not be joined; the message says what to check."""


def _address_of(address: str) -> tuple[str, str]:
    """The HOST:PORT `address` leads to, and how to name it in a message. "auto" as Ray resolves it
    (RAY_ADDRESS, the head `ray start` last started here, a head running here), which it does again with
    no check: a head that died leaving its address behind was retried for minutes."""
    if address != "auto":
        return address, f"{address} (--ray)"
    try:
        from ray._private.services import get_ray_address_from_environment
    except ImportError:  # another Ray's layout: ray.init resolves it, unchecked
        return address, "auto (--ray)"
    try:
        found = get_ray_address_from_environment("auto", None)
    except ConnectionError:
        raise JoinError("--ray auto: no Ray cluster runs on this machine (none `ray start --head` started, no "
                        "RAY_ADDRESS): start one, or give its head's HOST:PORT") from None  # fmt: skip
    return found, f"{found} (--ray auto)"


def _check_reachable(address: str, shown: str, timeout_s: float = 10.0) -> None:
    """HOST:PORT must answer, as a gRPC server does (a head's GCS port is one), before ray.init is asked:
    where nothing listens, or a server of another kind does (a web server), it retries for minutes."""
    if (target := _host_port(address)) is None:  # a form Ray reads its own way
        return
    try:
        conn = socket.create_connection(target, timeout=timeout_s)
    except OSError as e:
        raise JoinError(f"nothing answers at {shown}: {e.strerror or e}. Start the cluster's head there "
                        f"(ray start --head --port {target[1]}), or give the address `ray start` printed") from None  # fmt: skip
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        conn.close()  # under TLS the head's first bytes are the handshake's: Ray's own errors say the rest
        return
    with conn:
        head, closed = _first_frame(conn)
    if len(head) == 9 and head[3] == 4:  # a SETTINGS frame: gRPC
        if _grpc_but_no_gcs(address):
            raise JoinError(_not_the_head(shown))
        return
    # A TLS server closes on the hello, saying nothing (a silent one, not closing, is no head either).
    if not head and closed and _speaks_tls(target, timeout_s):
        raise JoinError(f"{shown} answers with TLS, and the job has no RAY_USE_TLS: give it the cluster's TLS "
                        "settings (RAY_USE_TLS=1, RAY_TLS_SERVER_CERT, RAY_TLS_SERVER_KEY, RAY_TLS_CA_CERT)")  # fmt: skip
    raise JoinError(f"{shown} answers, but not as a Ray cluster's head does (its GCS port speaks gRPC, this one "
                    "does not): give the address `ray start --head` printed (HOST:PORT, its --port, 6379 by default)")  # fmt: skip


# HTTP/2's connection preface and an empty SETTINGS frame: a gRPC server answers with a SETTINGS frame of its own
# (type 4, the frame header's fourth byte), a web server with "HTTP/1.1 400", a silent one not at all.
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _speaks_tls(target: tuple[str, int], timeout_s: float) -> bool:
    """Whether a TLS handshake there gets as far as the server's answer: done, or refused by an alert (a
    client certificate wanted, as a Ray cluster with TLS does); a server of plain bytes fails the record."""
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # asked what it speaks, not trusted
    try:
        with socket.create_connection(target, timeout=timeout_s) as raw, context.wrap_socket(raw):
            return True
    except ssl.SSLError as e:
        return "ALERT" in (e.reason or "")
    except OSError:
        return False


def _first_frame(conn: socket.socket) -> tuple[bytes, bool]:
    """The first 9 bytes the server answers the hello with (fewer where it closes, none where it is silent),
    and whether it closed the connection (or reset it) rather than let it wait."""
    head = b""
    try:
        conn.sendall(_HTTP2_HELLO)
        while len(head) < 9:
            if not (chunk := conn.recv(9 - len(head))):
                return head, True
            head += chunk
    except TimeoutError:  # no answer within the connection's timeout
        return head, False
    except OSError:  # reset
        return head, True
    return head, False


def _grpc_but_no_gcs(address: str) -> bool:
    """Whether the gRPC server there answers a GCS call with UNIMPLEMENTED, as another port of a Ray node
    does (a node manager's, a worker's): ray.init retried there for about 20 s before its error. Any other
    answer (the head's, a refusal of the job's token) is ray.init's to meet."""
    try:
        from ray._raylet import GcsClient
        from ray.exceptions import RpcError
    except ImportError:  # another Ray's layout: ray.init finds it out, slowly
        return False
    saved = os.dup(2)  # Ray's C++ client logs the failed call to stderr; the job's message says it
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
        GcsClient(address=address).internal_kv_get(b"electra-serve-probe", None, timeout=5)
    except RpcError as e:
        return getattr(e, "rpc_code", None) == 12  # gRPC's UNIMPLEMENTED
    except Exception:  # noqa: BLE001 - a probe: whatever else went wrong, ray.init says it its own way
        return False
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    return False


def _not_the_head(shown: str) -> str:
    return (f"{shown} answers, but not as a Ray cluster's head (its GCS server): give the address `ray start "
            "--head` printed (HOST:PORT, its --port, 6379 by default), not another port of a node (a node "
            "manager's, a worker's)")  # fmt: skip


def _join_failed(address: str, e: BaseException, shown: str | None = None) -> str:
    """What to do about a ray.init that failed. Ray 2.60 raises the same ConnectionError ("Failed to connect
    to Ray cluster at ...") whatever went wrong; the error it chains says which: an AuthenticationError
    (InvalidAuthToken: a token missing or not the cluster's), or another (an RpcError with code 12, an
    address that answers but is no head's GCS port: a node manager's, a worker's). `shown`: the address as
    the message names it (--ray auto's, resolved)."""
    msg = f"could not join the Ray cluster at {shown or f'{address} (--ray)'}"
    if _auth_error(e):
        if not os.environ.get("RAY_AUTH_TOKEN"):
            return msg + (": the cluster wants a token, and the job was given none. Ray 2.60 clusters use token "
                          "authentication: give the job the cluster's token, RAY_AUTH_MODE=token RAY_AUTH_TOKEN=... "
                          "(a head started without one keeps it in ~/.ray/auth_token)")  # fmt: skip
        return msg + (": the cluster refused the job's token (RAY_AUTH_TOKEN, set here): it may not be this "
                      "cluster's; compare it with the head's (RAY_AUTH_TOKEN where `ray start --head` ran, else "
                      "~/.ray/auth_token on the head)")  # fmt: skip
    return f"{msg}: {_not_the_head(address)}. Ray said: {_last_line(e)}"


def _chain(e: BaseException | None) -> list[str]:
    """The messages of `e` and of the errors it was raised from, outermost first."""
    said, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        said.append(f"{type(e).__name__}: {e}".strip())
        e = e.__cause__ or e.__context__
    return said


def _last_line(e: BaseException) -> str:
    """The innermost error's last line (Ray chains a whole traceback as text)."""
    lines = [line.strip() for line in _chain(e)[-1].splitlines() if line.strip()]
    return (lines[-1] if lines else str(e))[:300]


def _auth_error(e: BaseException) -> bool:
    text = "\n".join(_chain(e))
    return any(word in text for word in ("AuthenticationError", "InvalidAuthToken", "Unauthenticated",
                                         "UNAUTHENTICATED"))  # fmt: skip
