"""One way to write a command: every command group is one module of gpuprov/cli/ whose
`add_parser(commands)` adds its commands and registers each one's handler, listed once in
`COMMAND_GROUPS`; every command `gpuprov --help` lists has exactly one handler."""

from __future__ import annotations

import argparse
import inspect

from gpuprov.cli import main


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [subparsers] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subparsers.choices)


def test_every_command_has_one_handler_from_its_group_module() -> None:
    commands = _commands(main.build_parser())
    assert len(commands) == 24  # docs/cli.md lists them
    for name, parser in commands.items():
        handler = parser.get_default("handler")
        standalone = parser.get_default("standalone")
        assert (handler is None) != (standalone is None), name
        if handler is not None:
            assert inspect.iscoroutinefunction(handler), name
            owner = inspect.getmodule(handler)
            assert owner in main.COMMAND_GROUPS, f"{name}: handled in {owner}"


def test_each_group_module_adds_its_commands_and_nothing_else_does() -> None:
    seen: dict[str, str] = {}
    for group in main.COMMAND_GROUPS:
        parser = argparse.ArgumentParser()
        group.add_parser(parser.add_subparsers())
        for name in _commands(parser):
            assert name not in seen, f"{name}: added by {seen.get(name)} and {group.__name__}"
            seen[name] = group.__name__
    assert sorted(seen) == sorted(_commands(main.build_parser()))
