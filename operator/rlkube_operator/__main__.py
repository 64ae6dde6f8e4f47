"""`rlkube-operator` / `python -m rlkube_operator`: runs the controller."""

from __future__ import annotations

import argparse
import logging

import kopf
from prometheus_client import start_http_server

from rlkube_operator import handlers
from rlkube_operator.metrics import METRICS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rlkube-operator", description="The RLJob controller.")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (default)")
    parser.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port (0: off)")
    parser.add_argument("--health-port", type=int, default=8080, help="liveness endpoint port, /healthz")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO)
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=METRICS.registry)
    assert handlers.job_changed  # the handlers register themselves with kopf on import
    # One active replica: kopf's peering is not leader election (see the chart).
    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz",
    )


if __name__ == "__main__":
    main()
