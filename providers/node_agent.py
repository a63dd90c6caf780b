"""The node agent on a machine that boots with cloud-init: the files it needs, where they go, the
SHA-256 the agent is pinned to, and the systemd unit that runs it.

The agent is gpuprov/agent.py with its prose blanked out (comments, docstrings, its command
line's help texts), its signatures' annotations left out and one space a level of indentation
instead of four (`agent_source`), line for line: one standard-library file, no secret in it. The
create call's user data (providers/userdata.py) installs, through cloud-init's write_files:

    /usr/local/lib/gpuprov/agent.py            0644  the agent, its comments and docstrings
                                                     blanked (gzip+base64 in the user data)
    /etc/gpuprov/join.env                      0600  GPUPROV_API_URL, GPUPROV_JOIN_TOKEN, GPUPROV_VM
    /etc/gpuprov/api-ca.pem                    0644  the API's CA, with `[api] ca_file`
    /etc/systemd/system/gpuprov-agent.service  0644  the unit below

and runcmd enables and starts the unit, so the agent runs from the first boot on and again
after every reboot:

    ExecStartPre  sha256sum checks the agent against the hash written into the unit itself: a
                  file changed after cloud-init wrote it, or a broken decode, never runs
    ExecStart     /usr/bin/python3 -I -S <agent> run --url <api> --token-file <join.env>
                  --state-dir /var/lib/gpuprov [--ca-file <ca>]
    Restart       on failure, every 15 s (an API that is down, a network not up yet), but not
                  after the agent's exit 2 (refused for good: a used or expired token)
    KillMode      process: the job's work, which the agent starts, outlives a restart of the
                  agent, which then follows it again
    Delegate      yes: the agent runs each work in a cgroup of its own below the unit's

`-I -S`: the system interpreter, isolated from PYTHON* variables, the user's site directory
and site-packages; the agent needs nothing but the standard library. The join token is read
from the root-only file, never from the command line or the unit's environment.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import tokenize
from importlib import resources

AGENT_PATH = "/usr/local/lib/gpuprov/agent.py"
JOIN_ENV_PATH = "/etc/gpuprov/join.env"
CA_PATH = "/etc/gpuprov/api-ca.pem"
STATE_DIR = "/var/lib/gpuprov"
UNIT_NAME = "gpuprov-agent.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
PYTHON = "/usr/bin/python3"
SHA256SUM = "/usr/bin/sha256sum"
RESTART_SECONDS = 15
EXIT_REFUSED = 2  # gpuprov/agent.py: an error that retrying cannot fix


@functools.cache
def agent_source() -> bytes:
    """The node agent as this worker ships it to a node: gpuprov/agent.py with its comments,
    docstrings and help texts blanked out, its functions' annotations left out and its
    indentation narrowed, line for line (so a traceback's line numbers still match the
    repository's file). EC2 takes 16 KB of user data, compressed or not; the agent's prose is
    a third of its size, its signatures' annotations (never evaluated: `from __future__ import
    annotations`) a thirtieth; compressed, its help texts and three of every four spaces of
    indentation take 300 and 400 bytes. The code the node runs is the same, but for what
    `--help` says."""
    source = resources.files("gpuprov").joinpath("agent.py").read_text("utf-8")
    shipped = without_signature_annotations(without_prose(source).decode("utf-8"))
    return narrower(without_help(shipped.decode("utf-8")).decode("utf-8"))


def without_prose(source: str) -> bytes:
    """`source` with every comment and docstring blanked, keeping every line where it was
    (a docstring becomes `""` on its first line: a body never ends up empty)."""
    lines = source.splitlines(keepends=True)
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if not isinstance(node, _WITH_DOCSTRING) or not body:
            continue
        first = body[0]
        docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        if docstring and isinstance(first.value.value, str) and first.end_lineno is not None:
            start, end = first.lineno - 1, first.end_lineno
            indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
            lines[start] = f'{indent}""\n'
            for index in range(start + 1, end):
                lines[index] = "\n"
    text = "".join(lines)
    cut: dict[int, int] = {}  # line (0-based) -> column where its comment starts
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT and not token.string.startswith("#!"):
            cut[token.start[0] - 1] = token.start[1]
    lines = text.splitlines(keepends=True)
    for index, column in cut.items():
        kept = lines[index][:column].rstrip()
        lines[index] = f"{kept}\n"
    return "".join(lines).encode("utf-8")


_WITH_DOCSTRING = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def without_signature_annotations(source: str) -> bytes:
    """`source` with the annotations of every function's parameters and return value left out
    (`def f(a: int = 1) -> str:` becomes `def f(a = 1):`), each one that sits on one line;
    every line stays where it was. Annotated assignments (a dataclass's fields) are kept."""
    lines = [line.encode("utf-8") for line in source.splitlines(keepends=True)]
    spans: list[tuple[int, int, int]] = []  # (line, start, end), in UTF-8 bytes as ast counts
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        arguments = node.args
        for argument in (
            *arguments.posonlyargs,
            *arguments.args,
            *arguments.kwonlyargs,
            arguments.vararg,
            arguments.kwarg,
        ):
            annotation = argument.annotation if argument is not None else None
            if annotation is not None and annotation.end_lineno == argument.lineno:
                start = argument.col_offset + len(argument.arg.encode("utf-8"))
                spans.append((argument.lineno - 1, start, annotation.end_col_offset or start))
        returns = node.returns
        if returns is not None and returns.end_lineno == returns.lineno:
            line = lines[returns.lineno - 1]
            arrow = line.rfind(b"->", 0, returns.col_offset)
            if arrow > 0:
                start = len(line[:arrow].rstrip(b" "))
                spans.append((returns.lineno - 1, start, returns.end_col_offset or arrow))
    for index, start, end in sorted(spans, reverse=True):
        lines[index] = lines[index][:start] + lines[index][end:]
    return b"".join(lines)


def without_help(source: str) -> bytes:
    """`source` with every one-line `help=` and `description=` text of its calls (argparse's)
    blanked to "": the node's `agent.py --help` lists the commands and options without what
    they do (the repository's file has it). argparse.SUPPRESS, a name, is kept."""
    lines = [line.encode("utf-8") for line in source.splitlines(keepends=True)]
    spans: list[tuple[int, int, int]] = []  # (line, start, end), in UTF-8 bytes as ast counts
    for node in ast.walk(ast.parse(source)):
        for keyword in node.keywords if isinstance(node, ast.Call) else ():
            text, end = keyword.value, keyword.value.end_col_offset
            prose = keyword.arg in ("help", "description") and isinstance(text, _TEXT)
            if prose and text.lineno == text.end_lineno and end is not None:
                spans.append((text.lineno - 1, text.col_offset, end))
    for index, start, end in sorted(spans, reverse=True):
        lines[index] = lines[index][:start] + b'""' + lines[index][end:]
    return b"".join(lines)


_TEXT = (ast.Constant, ast.JoinedStr)


def narrower(source: str) -> bytes:
    """`source` indented by one space a level instead of four, line for line: a line's leading
    spaces n become ceil(n / 4), strictly increasing on multiples of four, so every block keeps
    its level; a line that continues a bracket starts at the margin (its indentation means
    nothing to Python); the lines inside a string that spans lines are kept as they are. Gzip
    takes the four spaces a level cheaply, but not for free: 400 bytes of the compressed agent."""
    inside: set[int] = set()  # 1-based numbers of the lines that continue a multi-line token
    bracketed: set[int] = set()  # ... and of those that continue a bracket
    depth = 0
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        inside.update(range(token.start[0] + 1, token.end[0] + 1))
        if token.type == tokenize.OP and token.string in ("(", "[", "{", ")", "]", "}"):
            depth += 1 if token.string in "([{" else -1
        elif token.type == tokenize.NL and depth:
            bracketed.add(token.start[0] + 1)
    lines = source.splitlines(keepends=True)
    for number, line in enumerate(lines, 1):
        spaces = len(line) - len(line.lstrip(" "))
        if number not in inside:
            indent = 0 if number in bracketed else -(-spaces // 4)
            lines[number - 1] = " " * indent + line[spaces:]
    return "".join(lines).encode("utf-8")


def agent_sha256() -> str:
    return hashlib.sha256(agent_source()).hexdigest()


def agent_argv(api_url: str, ca: bool) -> list[str]:
    """How the unit runs the agent (`run`: register once, then heartbeat)."""
    argv = [PYTHON, "-I", "-S", AGENT_PATH, "run", "--url", api_url]
    argv += ["--token-file", JOIN_ENV_PATH, "--state-dir", STATE_DIR]
    return argv + (["--ca-file", CA_PATH] if ca else [])


def check_argv(sha256: str) -> list[str]:
    """The integrity check before every start: the agent's hash against the pinned one."""
    check = f"echo '{sha256}  {AGENT_PATH}' | {SHA256SUM} --check --strict -"
    return ["/bin/sh", "-c", check]


def unit(api_url: str, ca: bool) -> str:
    """The systemd unit that keeps the agent running. `api_url` must hold no control
    character (providers/userdata.py refuses one)."""
    return "\n".join(
        [
            "[Unit]",
            "Description=gpuprov node agent: registers this machine, then heartbeats",
            "Wants=network-online.target",
            "After=network-online.target",
            "",
            "[Service]",
            "Type=simple",
            f"ExecStartPre={command_line(check_argv(agent_sha256()))}",
            f"ExecStart={command_line(agent_argv(api_url, ca))}",
            "Restart=on-failure",
            f"RestartSec={RESTART_SECONDS}",
            # The agent's exit 2: refused for good (a used or expired token, a CA that does not
            # verify the API): starting it again cannot help. Exit 1 (API unreachable) retries.
            f"RestartPreventExitStatus={EXIT_REFUSED}",
            # The job's work runs in a process group of its own under the agent: a restarted
            # agent follows it again, so stopping the agent must not end it.
            "KillMode=process",
            # The agent runs each work in a cgroup of its own under the unit's, and kills all
            # of it at the work's end: systemd leaves the subtree to it.
            "Delegate=yes",
            "UMask=0077",
            "",
            "[Install]",
            "WantedBy=multi-user.target",
            "",
        ]
    )


def command_line(argv: list[str]) -> str:
    """argv as one systemd command line: each word quoted, `%` and `$` doubled so systemd
    neither expands a specifier nor a variable in it (systemd.service, "Command lines")."""
    return " ".join(_systemd_word(word) for word in argv)


def _systemd_word(word: str) -> str:
    escaped = word.replace("%", "%%").replace("$", "$$")
    if escaped and all(ch.isalnum() or ch in "/-._:=+" for ch in escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'
