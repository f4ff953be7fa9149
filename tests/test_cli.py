"""`python -m megalab`: one argparse tree, a subcommand per command, each module imported only when its
command runs."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megalab import __main__ as cli
from megalab.__main__ import main
from megalab.core import catalog

ROOT = Path(__file__).resolve().parent.parent


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m megalab [-h] COMMAND ...")
    for name in cli.COMMANDS:
        assert f"\n    {name}" in out, name
    assert main([]) == 0 and capsys.readouterr().out == out


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_command_declares_its_arguments_and_has_help(command, capsys):
    if cli.COMMANDS[command].passthrough:  # its module parses its own argv: asked with no argument here
        return
    assert main([command, "--help"]) == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m megalab {command} [-h]")


@pytest.mark.parametrize("typo,closest", [("tabels", "tables"), ("show-comand", "show-command"), ("xyzzy", None)])
def test_an_unknown_command_is_one_line_with_the_closest(typo, closest, capsys):
    assert main([typo]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"megalab: unknown command '{typo}'")
    assert (f"(closest: {closest})" in err) == bool(closest) and "; fix: python -m megalab --help" in err


def test_a_command_given_what_it_does_not_take_says_so_in_its_usage(capsys):
    assert main(["list", "extra"]) == 2
    assert "python -m megalab list: error: unrecognized arguments: extra" in capsys.readouterr().err
    assert main(["run"]) == 2
    assert "the following arguments are required: target" in capsys.readouterr().err


def test_targets_prints_every_catalog_id_one_per_line(capsys):
    assert main(["targets"]) == 0
    assert capsys.readouterr().out.splitlines() == list(catalog.catalog())


@pytest.mark.parametrize("argv,forbidden", [(["variables"], ("pandas", "matplotlib", "torch")),
                                            (["--help"], ("pandas", "matplotlib", "torch", "yaml")),
                                            (["list"], ("pandas", "matplotlib", "torch"))])
def test_commands_import_only_their_own_modules(argv, forbidden):
    """make help runs `variables`, and `list` is everyday: neither loads pandas, matplotlib or torch."""
    code = ("import sys; from megalab.__main__ import main; rc = main(sys.argv[1:]); "
            f"print(sorted(m for m in {forbidden!r} if m in sys.modules)); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_passthrough_command_gets_its_argv_in_order(monkeypatch):
    seen = []
    from megalab.harness import docker

    monkeypatch.setattr(docker, "cli", lambda argv: seen.append(argv) or 0)
    assert main(["docker-run", "--print"]) == 0 and seen == [["--print"]]
