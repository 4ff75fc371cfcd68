"""Man pages and shell completion scripts generated from the click commands.

    python -m modbridge.tools.manpages [DIR]   # default: packaging/ of the checkout

writes ``DIR/man/modbridge.1`` and one ``modbridge-<command>.1`` per command (a
group's subcommands as ``modbridge-<group>-<sub>.1``), and ``DIR/completion/`` with
the bash, zsh and fish scripts click generates. The same pages ship inside the
package (``modbridge/man/``): ``modbridge man`` prints where. The pages are built from
the same objects ``--help`` prints, so they cannot drift from the CLI;
tests/test_manpages.py regenerates them and compares.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

import click
from click.shell_completion import get_completion_class

from modbridge import __version__

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_MODBRIDGE_COMPLETE"
DATE = "2026"  # stable output: the pages change only when the CLI does


def _roff(text: str) -> str:
    """Text safe in a roff body: backslashes doubled, a leading '.' or "'" escaped."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(("\\&" + ln) if ln[:1] in (".", "'") else ln for ln in text.splitlines())


def _paragraphs(text: str) -> str:
    """click help text as roff: paragraphs refilled, ``\\b`` blocks kept verbatim."""
    out = []
    for para in re.split(r"\n\s*\n", inspect.cleandoc(click.unstyle(text))):
        lines = para.splitlines()
        if lines and lines[0].strip() == "\b":
            out.append(".nf\n" + _roff("\n".join(lines[1:])) + "\n.fi")
        else:
            out.append(_roff(" ".join(ln.strip() for ln in lines)))
    return "\n.PP\n".join(out)


def _walk(cmd: click.Command, path: list[str]):
    """``(path, command)`` for ``cmd`` and every command under it, depth first."""
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name in sorted(cmd.list_commands(click.Context(cmd))):
            sub = cmd.get_command(click.Context(cmd), name)
            if sub is not None and not getattr(sub, "hidden", False):
                yield from _walk(sub, [*path, name])


def page_name(path: list[str]) -> str:
    return "-".join(path)


def _context(path: list[str], root: click.Command) -> click.Context:
    """The context ``modbridge <path>`` runs in: each level's settings, inherited as
    when a person types it (``-h`` comes from the top group's help_option_names)."""
    cmd, ctx = root, click.Context(root, info_name=path[0], **root.context_settings)
    for name in path[1:]:
        cmd = cmd.get_command(ctx, name)
        ctx = click.Context(cmd, info_name=name, parent=ctx, **cmd.context_settings)
    return ctx


def _options(cmd: click.Command, ctx: click.Context) -> list[tuple[str, str]]:
    """(term, help) per option, the help option last from the context's names (not
    ``cmd.get_params``: click caches a command's help option from the first context
    it ran in, so the page would depend on what ran before in the process)."""
    out = [r for r in (p.get_help_record(ctx) for p in cmd.params) if r]
    if ctx.help_option_names and cmd.add_help_option:
        out.append((", ".join(ctx.help_option_names), "Show this message and exit."))
    return out


def render(path: list[str], cmd: click.Command, root: click.Command | None = None) -> str:
    """One man page (roff, section 1) for the command at ``path``."""
    if root is None:
        from modbridge.cli.main import main as root
    ctx = _context(path, root)
    ctx.info_name = " ".join(path)
    title = page_name(path)
    short = cmd.get_short_help_str(limit=200) or ""
    out = [
        f'.TH "{title.upper()}" "1" "{DATE}" "modbridge {__version__}" "modbridge manual"',
        ".SH NAME",
        f"{_roff(title)} \\- {_roff(short)}",
        ".SH SYNOPSIS",
        ".B " + _roff(" ".join(path)),
        _roff(" ".join(cmd.collect_usage_pieces(ctx))),
    ]
    if cmd.help:
        out += [".SH DESCRIPTION", _paragraphs(cmd.help)]
    opts = _options(cmd, ctx)
    if opts:
        out.append(".SH OPTIONS")
        for term, help_text in opts:
            out += [".TP", f".B {_roff(term)}", _roff(help_text or "")]
    if isinstance(cmd, click.Group):
        subs = [(n, cmd.get_command(ctx, n)) for n in cmd.list_commands(ctx)]
        subs = [(n, s) for n, s in subs if s is not None and not s.hidden]
        if subs:
            out.append(".SH COMMANDS")
            for name, sub in subs:
                out += [".TP", f".B {_roff(name)}",
                        _roff(sub.get_short_help_str(limit=200)) + "\n"
                        + f"See \\fB{page_name([*path, name])}\\fR(1)."]  # fmt: skip
    see = ["modbridge"] if len(path) > 1 else []
    out += [".SH SEE ALSO", ", ".join(f"\\fB{s}\\fR(1)" for s in see) or
            "The documentation in the project's docs/ folder (docs/bridge.md first)."]  # fmt: skip
    return "\n".join(out) + "\n"


def pages(root: click.Command) -> dict[str, str]:
    """``{file name: roff text}`` for every command."""
    return {page_name(p) + ".1": render(p, c, root) for p, c in _walk(root, ["modbridge"])}


def completion(root: click.Command, shell: str) -> str:
    """The completion script click generates for ``shell``."""
    cls = get_completion_class(shell)
    if cls is None:
        raise ValueError(f"no completion for {shell!r}; have {', '.join(SHELLS)}")
    return cls(root, {}, "modbridge", COMPLETE_VAR).source()


COMPLETION_FILES = {"bash": "modbridge.bash", "zsh": "_modbridge", "fish": "modbridge.fish"}


def files(root: click.Command) -> dict[str, str]:
    """Every generated file, by its path relative to the output directory."""
    out = {f"man/{name}": text for name, text in pages(root).items()}
    for shell in SHELLS:
        out[f"completion/{COMPLETION_FILES[shell]}"] = completion(root, shell)
    return out


def write(root: click.Command, dest: Path) -> list[Path]:
    """Write every file under ``dest`` (stale generated pages removed first)."""
    written = []
    mandir = dest / "man"
    if mandir.is_dir():
        for old in mandir.glob("modbridge*.1"):
            old.unlink()
    for rel, text in files(root).items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    from modbridge.cli.main import main as cli

    here = Path(__file__).resolve()
    targets = [Path(a) for a in argv] or [here.parents[3] / "packaging", here.parents[1]]
    for dest in targets:
        for path in write(cli, dest):
            if not re.search(r"\.1$", path.name) or path.name == "modbridge.1":
                print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
