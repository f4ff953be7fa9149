"""`python -m megalab.harness.data ...`, the same as `python -m megalab prepare-data ...`."""
import sys

from megalab.harness.data.command import cli

sys.exit(cli())
