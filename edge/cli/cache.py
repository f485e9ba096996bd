"""`edge cache fetch|publish`: one build per engine identity (edge/model/engine_cache.py); `edge cache bundle`:
a release's files packed once into the shared store for the devices to fetch (edge/fleet/bundle.py).

    edge cache fetch --config C --engine CACHE     exit 0: installed from the cache; 1: miss or corrupt (build);
                                                   2: a cache or destination that cannot be used (one line)
    edge cache publish --config C --engine CACHE   after the build and its gate passed on a canary of this type
    edge cache bundle STORE --add NAME=PATH ...    prints the bundle's sha256 last (<STORE>/bundle/<sha256>.tar)

CACHE is a folder (NFS, a synced share) or, for fetch, an https:// URL serving one (user:password in it is sent
as basic auth, never shown); a plain http:// one only with --digest, the entry's digest publish printed.
"""

import argparse
from dataclasses import dataclass
from typing import Any, List

from edge.cli.build import ArtifactOptions
from edge.cli.common import add_command, add_config_flags, config_from_args
from edge.errors import EXIT_FAIL, EXIT_OK, EdgeError
from edge.fields import add_flags, options_from, setting


@dataclass(frozen=True)
class CacheOptions:
    """`edge cache`'s own flags, declared once (edge.fields); --engine is edge rollback's."""

    add: List[str] = setting([], "bundle: a file or folder, under NAME in the bundle (repeat)", flag="--add",
                             metavar="NAME=PATH")
    digest: str = setting("", "fetch: the entry's digest (printed by publish); required over plain http://",
                          flag="--digest", metavar="SHA256")


def cmd_cache(args: argparse.Namespace) -> int:
    from edge.model import engine_cache
    from edge.model.plan import check_inputs

    opts = options_from(args, CacheOptions)
    if args.action == "bundle":
        from edge.fleet import bundle

        pairs = [tuple(spec.split("=", 1)) for spec in opts.add]
        if not pairs or any(len(p) != 2 or not p[1] for p in pairs):
            raise EdgeError("edge cache bundle: give each file or folder as --add NAME=PATH")
        print(bundle.pack(args.cache, pairs))
        return EXIT_OK
    engine = options_from(args, ArtifactOptions).engine
    plan = check_inputs(config_from_args(args), None, engine=engine, show_progress=False)
    if args.action == "publish":
        engine_cache.publish(plan, args.cache)
        return EXIT_OK
    return EXIT_OK if engine_cache.fetch(plan, args.cache, digest=opts.digest or None) else EXIT_FAIL


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("fetch", "publish", "bundle"),
                   help="fetch: install the cached artifact (exit 1 on a miss); publish: add the installed one; "
                        "bundle: pack a release's files (--add) into the store")
    p.add_argument("cache", help="cache folder, or an https:// URL serving one (fetch only)")
    add_flags(p, CacheOptions, "add")
    add_config_flags(p, "model.path")
    add_flags(p, ArtifactOptions, "engine")
    add_flags(p, CacheOptions, "digest")


def register(subparsers: Any) -> None:
    add_command(subparsers, "cache", "fetch or publish a built artifact in a cache shared by boards of one type",
                __doc__, add_arguments, cmd_cache)
