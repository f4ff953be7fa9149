"""`make batch IDS="101 111"`: several targets in a row, each exactly `make <target>` (launch.run).

It goes on past a run that fails or is refused (an out-of-memory row is a result too) and stops at a
kill: a signal to make or to us ends the run in flight as `killed` (supervise.py, makeparent.py) and
no further run starts. One Python runs them all, in place of the recipe's shell (the Makefile execs
it), so that make's signals reach the run instead of a shell that would die and leave it running.
"""
from __future__ import annotations

import os
import sys

from megalab.core.catalog import CatalogError
from megalab.core.variables import LaunchError
from megalab.harness import launch, makeparent


def cli(argv: list[str], environ=os.environ) -> int:
    if argv:
        raise LaunchError('usage: make batch IDS="101 111"')
    ids = environ.get("IDS", "").split()
    if not ids:
        raise LaunchError('batch: no targets; fix: make batch IDS="101 111"')
    makeparent.follow()
    failed, refused = 0, []
    for n, target in enumerate(ids):
        try:
            rc = launch.run(target)
        except (CatalogError, LaunchError) as e:  # refused before it started: the next one may run
            print(f"megalab: {e}", file=sys.stderr, flush=True)
            rc = 2
            refused.append(target)
        except (SystemExit, KeyboardInterrupt) as stop:  # a kill: the launcher ended the run in flight
            code = (stop.code or 1) if isinstance(stop, SystemExit) else 130
            print(f"batch: stopped at {target} by a signal; {len(ids) - n - 1} target(s) not started", flush=True)
            raise SystemExit(code) from None
        failed += rc != 0
    print(f"batch: {failed} of {len(ids)} run(s) did not end ok")
    if refused:  # a run that failed is a result (an OOM row); a target refused, or a record lost, is not
        print(f"batch: {len(refused)} of {len(ids)} target(s) refused, or run without a record written "
              f"({' '.join(refused)}), each said why above; fix: correct those IDS (or free the disk) and run them "
              "again", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    try:
        sys.exit(cli(sys.argv[1:]))
    except (CatalogError, LaunchError) as e:
        print(f"megalab: {e}", file=sys.stderr)
        sys.exit(2)
