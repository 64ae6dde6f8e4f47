"""`rlkube-trainer convert verl-config.yaml`: the command's arguments and what it prints."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from rlkube_api.validation import InvalidSpec
from rlkube_api.verl.conversion import convert, to_rljob
from rlkube_api.verl.resolve import VerlConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", type=Path, help="verl's config YAML, as Hydra saves it beside a run (interpolations kept or resolved)"
    )
    parser.add_argument("-o", "--output", type=Path, help="write here instead of standard output")
    parser.add_argument("--rljob", metavar="NAME", help="write an RLJob of this name instead of a trainer YAML")
    parser.add_argument("--image", default="rlkube-trainer:0.1.0", help="the RLJob's trainer image")
    parser.add_argument(
        "--checkpoint-claim",
        metavar="CLAIM",
        help="the RLJob's checkpoints go on this PersistentVolumeClaim (ReadWriteMany: every pod writes to it);"
        " default NAME-checkpoints; not used when the config sets an object store",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="do not list the mapped and ignored keys")


def run(args: argparse.Namespace) -> int:
    try:
        raw = yaml.safe_load(args.config.read_text())
    except OSError as error:
        print(f"error: {args.config}: cannot read: {error.strerror}", file=sys.stderr)
        return 2
    except yaml.YAMLError as error:
        print(f"error: {args.config}: not valid YAML: {error}", file=sys.stderr)
        return 2
    if not isinstance(raw, dict):
        print(f"error: {args.config}: expected a mapping of verl's sections", file=sys.stderr)
        return 2
    try:
        conversion = convert(raw, str(args.config))
        document = (
            to_rljob(conversion.config, args.rljob, args.image, args.checkpoint_claim).to_wire()
            if args.rljob
            else conversion.config.to_config()
        )
    except (VerlConfigError, InvalidSpec) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    text = yaml.safe_dump(document, sort_keys=False)
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    if not args.quiet:
        print(conversion.report(), file=sys.stderr)
        volume = ((document.get("spec") or {}).get("checkpoint") or {}).get("volume") if args.rljob else None
        if volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            print(f"checkpoints: on PersistentVolumeClaim {claim} (create it, ReadWriteMany)", file=sys.stderr)
    return 0
