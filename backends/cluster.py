"""The Ray connection every distributed run of the project shares (``goldens replay --cluster``, the upstream
survey's ``--cluster``): which cluster a ``ray[://HOST:PORT]`` spec names, and how many times a lost task is run
again. Ray is an optional extra (``pip install -e '.[cluster]'``)."""

from __future__ import annotations

import os

MAX_RETRIES = 3  # system failures (a node or worker lost) before a task is given up


class ClusterUsage(ValueError):
    """A spec that names no cluster, or Ray not installed (a usage error: one line)."""


class ClusterUnreachable(RuntimeError):
    """Ray could not connect to the cluster named (one line)."""


def parse(spec: str) -> str | None:
    """``ray`` -> None (Ray finds the cluster: $RAY_ADDRESS, a local ``ray start``, else a new one here);
    ``ray://HOST:PORT`` -> that address (the Ray client)."""
    if spec == "ray":
        return None
    if spec.startswith("ray://") and len(spec) > len("ray://"):
        return spec
    raise ClusterUsage(f"--cluster {spec!r}: expected ray or ray://HOST:PORT (the only engine supported)")


def connect(spec: str):
    """The ``ray`` module, connected to the cluster ``spec`` names (Ray's own logging kept off the driver)."""
    address = parse(spec)
    try:
        import ray
    except ImportError:
        raise ClusterUsage("--cluster ray needs Ray, an optional extra: pip install -e '.[cluster]'") from None
    if not ray.is_initialized():
        try:
            ray.init(address=address, log_to_driver=False, logging_level="WARNING",
                     **({} if address or os.environ.get("RAY_ADDRESS") else {"include_dashboard": False}))
        except Exception as exc:  # noqa: BLE001 (Ray's own connection errors)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise ClusterUnreachable(f"--cluster {spec}: cannot reach a Ray cluster ({first})") from None
    return ray


def node_label() -> str:
    """``<ip>/<node id prefix>`` of the node this Ray task runs on."""
    import ray

    return f"{ray.util.get_node_ip_address()}/{ray.get_runtime_context().get_node_id()[:8]}"


def finished(ray, pending: dict):
    """Yield ``(pending[ref], result, None)`` as each task of ``pending`` (Ray object ref -> the caller's key) ends,
    or ``(key, None, why)`` for one Ray gave up on (its node or worker lost MAX_RETRIES + 1 times)."""
    pending = dict(pending)
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            key = pending.pop(ref)
            try:
                result, lost = ray.get(ref), None
            except Exception as exc:  # noqa: BLE001 (Ray's own: the task's node(s) died under it every time)
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
                result, lost = None, f"the task was lost {MAX_RETRIES + 1} times: {first}"
            yield key, result, lost
