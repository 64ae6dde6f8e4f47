"""`rlkube-operator` / `python -m rlkube_operator`: runs the controller."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
import sys

import kopf
from prometheus_client import start_http_server

from rlkube_operator import handlers
from rlkube_operator.kube import connect
from rlkube_operator.leader import Election, LeaderElector, Timings
from rlkube_operator.metrics import METRICS

log = logging.getLogger("rlkube_operator")
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rlkube-operator", description="The RLJob controller.")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (default)")
    parser.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port (0: off)")
    parser.add_argument("--health-port", type=int, default=8080, help="liveness endpoint port, /healthz")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    election = parser.add_argument_group("leader election (several replicas, one active)")
    election.add_argument("--leader-elect", action="store_true", help="reconcile only while holding the Lease")
    election.add_argument("--lease-name", default="rlkube-operator-leader", help="the Lease's name")
    election.add_argument(
        "--lease-namespace", default=None, help="the Lease's namespace (default: $POD_NAMESPACE, or the pod's own)"
    )
    election.add_argument("--identity", default=None, help="this replica's name in the Lease (default: $POD_NAME)")
    defaults = Timings()
    election.add_argument("--lease-duration", type=float, default=defaults.duration, help="seconds (take-over time)")
    election.add_argument("--renew-every", type=float, default=defaults.renew_every, help="seconds")
    election.add_argument("--retry-every", type=float, default=defaults.retry_every, help="seconds, while standing by")
    args = parser.parse_args(argv)
    if args.leader_elect and not args.renew_every < args.lease_duration:
        parser.error("--renew-every must be shorter than --lease-duration")
    return args


def _lease_namespace(args: argparse.Namespace) -> str:
    if args.lease_namespace:
        return str(args.lease_namespace)
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    with contextlib.suppress(OSError), open(SERVICE_ACCOUNT_NAMESPACE) as f:
        return f.read().strip()
    return "default"


def _identity(args: argparse.Namespace) -> str:
    return str(args.identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}")


async def _operate(args: argparse.Namespace, election: Election | None) -> None:
    # Losing the Lease stops the operator; its pod restarts as a standby. The stop flag is an
    # asyncio Event: kopf waits on a threading one in an executor thread that nothing wakes on
    # SIGTERM, and the process then hangs at exit (until the kubelet's SIGKILL, Lease held).
    stop = asyncio.Event()
    if election is not None:
        loop = asyncio.get_running_loop()
        election.on_lost = lambda: loop.call_soon_threadsafe(stop.set)
    # kopf runs standalone: its peering is not leader election (the Lease is).
    await kopf.operator(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz",
        memo=kopf.Memo(election=election),
        stop_flag=stop,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO)
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=METRICS.registry)
    assert handlers.job_changed  # the handlers register themselves with kopf on import
    election = None
    if args.leader_elect:
        timings = Timings(args.lease_duration, args.renew_every, args.retry_every)
        elector = LeaderElector(connect(pool_size=2), _lease_namespace(args), args.lease_name, _identity(args), timings)
        election = Election(elector)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            asyncio.run(_operate(args, election))
    finally:
        if election is not None:
            election.stop()
    if election is not None and election.lost.is_set():
        log.error("stopped: the Lease was lost, another replica may hold it now")
        sys.exit(1)


if __name__ == "__main__":
    main()
