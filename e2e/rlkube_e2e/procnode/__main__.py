"""python -m rlkube_e2e.procnode --kubeconfig PATH --name NAME [...]: run a process node until Ctrl-C."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from rlkube_e2e.errors import ClusterError
from rlkube_e2e.procnode.node import DEFAULT_PODS, ProcessNode


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlkube_e2e.procnode",
        description="A Kubernetes node that runs its pods as local processes (needs root).",
    )
    parser.add_argument("--kubeconfig", type=Path, required=True, help="admin kubeconfig of the cluster")
    parser.add_argument("--name", default="proc-0", help="node name (default proc-0)")
    parser.add_argument("--label", type=_label, action="append", default=[], help="extra node label KEY=VALUE")
    parser.add_argument("--cpu", help="CPU capacity to report (default: this machine's CPUs)")
    parser.add_argument("--memory", help="memory capacity to report, e.g. 16Gi (default: this machine's)")
    parser.add_argument("--pods", type=int, default=DEFAULT_PODS, help=f"pod capacity (default {DEFAULT_PODS})")
    parser.add_argument("--state-dir", type=Path, help="pod files and logs (default: beside the kubeconfig)")
    parser.add_argument(
        "--delete-node-on-exit",
        action="store_true",
        help="delete the Node on exit (its pods are then garbage-collected) instead of leaving it NotReady",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    node = ProcessNode(
        args.kubeconfig,
        args.name,
        dict(args.label),
        args.state_dir,
        cpu=args.cpu,
        memory=args.memory,
        pods=args.pods,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        node.start()
    except ClusterError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"node {node.name} Ready; state in {node.state_dir}, log {node.node_log}; Ctrl-C stops it", flush=True)
    try:
        stop.wait()
    finally:
        node.stop(delete_node=args.delete_node_on_exit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
