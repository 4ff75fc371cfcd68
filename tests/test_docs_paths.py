"""Docs cannot lie about paths or commands.

Every repository path a page cites in a code span (``device/config.py``,
``packaging/systemd/modbridge.service``) exists, and every ``modbridge ...`` command
line in a fenced block or code span parses with the real click commands (the
subcommand chain exists, every option is one that command has, the arguments fit).
tests/test_docs_links.py checks the Markdown links; this checks the text around them.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from modbridge.cli.main import main as cli

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(
    [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("packaging/**/*.md"),
     *ROOT.glob("protocol/*.md"), *ROOT.glob("boards/*.md"), *ROOT.glob("device/*.md"),
     *ROOT.glob("bench/*.md"), *ROOT.glob("firmware/*.md")]
)  # fmt: skip

# A code span is taken for a repository path when it starts with one of these folders.
REPO_DIRS = ("device/", "boards/", "protocol/", "host/", "tests/", "bench/", "docs/",
             "packaging/", "examples/", "firmware/", ".ci/")  # fmt: skip
# Paths inside other trees: the MicroPython source (ports/stm32/...), a board's
# filesystem, the host's filesystem. Said as such, never looked up here.
FOREIGN = ("ports/", "py/", "extmod/", "lib/", "/")
SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
# a fenced block tagged as output shows what a command prints, not commands
OUTPUT_FENCE = re.compile(r"^```(?:text|output)[^\n]*\n.*?^```", re.S | re.M)
PLACEHOLDER = re.compile(r"[<>*{}$]|\.\.\.|\.\.")


def _spans(text: str):
    """Code spans outside fenced blocks, and each fenced block's lines."""
    for block in FENCE.findall(text):
        yield from block.splitlines()
    yield from SPAN.findall(FENCE.sub("", text))


def _cited_paths(page: Path):
    for span in _spans(page.read_text(encoding="utf-8")):
        for word in span.split():
            word = word.strip("\"'(),;:")
            if word.startswith(FOREIGN) or PLACEHOLDER.search(word):
                continue
            if word.startswith(REPO_DIRS) and re.fullmatch(r"[\w./-]+", word):
                yield word.split("::")[0]


def _exists(page: Path, path: str) -> bool:
    return any((base / path).exists() for base in (ROOT, page.parent))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_paths_exist(page):
    bad = sorted({p for p in _cited_paths(page) if not _exists(page, p)})
    assert not bad, f"{page.relative_to(ROOT)} cites missing files: {', '.join(bad)}"


def test_no_page_sends_a_user_to_the_seeds():
    """The seed documents live beside the project, not in a user's clone."""
    bad = [str(p.relative_to(ROOT)) for p in PAGES
           if re.search(r"seeds/0\d\d", p.read_text(encoding="utf-8"))]  # fmt: skip
    assert not bad, f"these pages cite seeds/, which a clone does not have: {bad}"


def _command_lines(page: Path):
    """``(line, complete)`` for every ``modbridge ...`` a page shows: fenced lines (a
    ``$ `` prompt allowed, ``\\`` continuations joined, comments cut) are complete
    invocations; a code span in prose only names a command and some of its options."""
    text = OUTPUT_FENCE.sub("", page.read_text(encoding="utf-8"))
    for block in FENCE.findall(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"^\s*\$\s+", "", line).strip()
            if line.startswith("modbridge "):
                yield line, True
    for span in SPAN.findall(FENCE.sub("", text)):
        if span.startswith("modbridge "):
            yield span, False


def _words(line: str) -> list[str]:
    line = re.split(r"\s(?:\||&&|;|>|2>|#)\s?", line)[0]
    line = re.sub(r"<[^>]*>", "X", line)  # <port>, <board>: a placeholder value
    try:
        return shlex.split(line)[1:]
    except ValueError:
        return line.split()[1:]


def _rest(ctx: click.Context) -> list[str]:
    """What a group left for its subcommand (click 8.2 moved it to _protected_args)."""
    protected = getattr(ctx, "_protected_args", None)
    if protected is None:
        protected = ctx.protected_args
    return list(protected) + list(ctx.args)


def _options(cmd: click.Command) -> set[str]:
    names = {"-h", "--help"}
    for p in cmd.params:
        names.update(getattr(p, "opts", ()))
        names.update(getattr(p, "secondary_opts", ()))
    return names


def _check(line: str, complete: bool) -> str | None:
    """None when ``line`` is a modbridge command as the CLI has it, else why not.

    The subcommand chain must exist (``get|set`` names each), every ``--option`` must
    be one that command has; a complete invocation (a fenced example, no ``[...]``
    synopsis) must also parse as click parses it."""
    words = _words(line)
    if any(w.endswith(":") for w in words[:2]):
        return None  # an error message the CLI prints ("modbridge set: ..."), not a call
    if words and words[-1] == "&":
        words.pop()  # started in the background
    cmd: click.Command = cli
    path = []
    while isinstance(cmd, click.Group) and words:
        if type(cmd).parse_args is not click.Group.parse_args:
            # a group that picks a default subcommand (calibrate MODULE = guided)
            ctx = cmd.make_context(cmd.name, list(words), resilient_parsing=True)
            words = _rest(ctx)
        if words[0].startswith("-"):
            break
        if words[0] in ("...", "[...]"):
            return None
        names = re.split(r"[|/]", words[0].strip("[]"))
        subs = [cmd.get_command(click.Context(cmd), n) for n in names if n != "..."]
        if not subs or any(s is None for s in subs):
            return f"no command {' '.join(path + [words[0]])!r}"
        if len(subs) > 1:
            return None  # get|set|save|reset: each exists; options would be ambiguous
        cmd = subs[0]
        path.append(words.pop(0))
    known = _options(cmd)
    for w in words:
        opt = w.strip("[]().,").split("=")[0]
        if re.fullmatch(r"--?[A-Za-z][\w-]*", opt) and opt not in known:
            return f"{' '.join(['modbridge', *path])} has no option {opt}"
    synopsis = "[" in line or "..." in line
    if complete and not synopsis:
        argv = [w for w in _words(line) if w != "&"]
        try:
            ctx = cli.make_context("modbridge", argv)
            args = _rest(ctx)
            group = cli
            while isinstance(group, click.Group) and args:
                name, sub, rest = group.resolve_command(ctx, args)
                ctx = sub.make_context(name, list(rest), parent=ctx)
                group = sub
                args = _rest(ctx)
        except click.exceptions.Exit:
            pass  # --help / --version
        except click.UsageError as e:
            return e.format_message()
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_commands_parse(page):
    bad = [f"{line!r}: {why}" for line, complete in _command_lines(page)
           if (why := _check(line, complete))]  # fmt: skip
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)


def test_the_checks_catch_a_lie():
    """The checks themselves: a missing file, a wrong command or option are caught."""
    page = ROOT / "README.md"
    assert not _exists(page, "device/no_such_file.py")
    assert _exists(page, "device/config.py")
    why = _check("modbridge run --no-such-option", False)
    assert why == "modbridge run has no option --no-such-option", why
    assert _check("modbridge no-such-command", False) == "no command 'no-such-command'"
    assert _check("modbridge config get|sett", False) is not None
    assert "Missing" in _check("modbridge flash --port /dev/ttyACM0", True)
    assert _check("modbridge run --sim --duration 5", True) is None
    assert _check("modbridge set: duty1 must be 30..100 %", True) is None
