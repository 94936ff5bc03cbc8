"""Every option of every command says what it is for in --help."""

from __future__ import annotations

import click

from prorsa.cli import main


def commands(cmd: click.Command, path: str = "prorsa"):
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from commands(sub, f"{path} {name}")


def test_every_option_has_help_text():
    missing = [f"{path} {'/'.join(p.opts)}" for path, cmd in commands(main) for p in cmd.params
               if isinstance(p, click.Option) and not p.help]
    assert missing == []
    assert all(cmd.help for _, cmd in commands(main)), "a command without a docstring"
