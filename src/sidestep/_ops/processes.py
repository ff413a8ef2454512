"""How many processes a server command runs, read from its words and environment.

`sidestep doctor -- CMD ...` asks it whether a per-process memory store would be
split between workers. gunicorn and uwsgi run one worker unless told otherwise
(an option, an environment variable, a configuration file); celery's worker runs
one process per CPU unless its concurrency or pool says otherwise. A configuration
file is never read (it may be code): when one may set the count, the answer is
that it is not known. The command is read as a shell would run it (variables set
before the program, ``sh -c``, wrappers such as ``env``, ``python -m``, ``sidestep
run`` or ``ddtrace-run``); a shell script is not read. Descriptions name programs
(a plain name, else "the command"), options and variables, never an argument's
value other than a worker count.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["Processes", "processes"]

_PYTHON = re.compile(r"^python[0-9.]*$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# the servers read here, found after a wrapper that runs them
_SERVERS = frozenset({"gunicorn", "uwsgi", "celery", "uvicorn"})
# What a command-line flag read from a variable takes as yes (click's, for uvicorn's).
_YES = frozenset({"1", "true", "t", "yes", "y", "on"})
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash"})
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")  # a program named, not a value
# what separates a shell's commands: the last one after `&&` or `;` is the server
_SEQUENCE = frozenset({"&&", ";"})
# celery pools that run every task in the worker's own process
_ONE_PROCESS_POOLS = ("solo", "threads", "gevent", "eventlet")
# the options that load a uwsgi configuration file
_UWSGI_CONFIG_OPTIONS = frozenset(
    ["--ini", "--yaml", "--yml", "-y", "--json", "--js", "-j", "--xml", "--xmlconfig", "-x"]
)
_UWSGI_CONFIG_SUFFIXES = (".ini", ".yaml", ".yml", ".json", ".js", ".xml")
_UWSGI_CONFIG_VARIABLES = ("UWSGI_INI", "UWSGI_YAML", "UWSGI_YML", "UWSGI_JSON", "UWSGI_XML")


@dataclass(frozen=True, slots=True)
class Processes:
    """Whether a command runs several processes (None: not known here), and what it runs."""

    several: bool | None
    what: str


def processes(
    command: Sequence[str],
    environ: Mapping[str, str] = os.environ,
    exists: Callable[[str], bool] = os.path.isfile,
) -> Processes:
    """What `command` runs, in `environ` (with the ``NAME=value`` of an ``env`` it starts
    with); `exists` tells whether gunicorn would find its default configuration file."""
    words = list(command)
    if len(words) == 1 and any(ch.isspace() for ch in words[0]):  # quoted as one word
        inner = _shell_words(words[0])
        if inner is None:
            return Processes(None, "a command doctor cannot split into words")
        words = inner
    words, environ = _assignments(words, environ, options=False)  # NAME=value cmd
    if words and words[0] in ("exec", "nohup"):
        words = words[1:]
    if words and _program(words[0]) == "env":
        words, environ = _assignments(words[1:], environ, options=True)
    if words and _program(words[0]) in _SHELLS:
        return _shell(words[1:], environ, exists)
    if words and _PYTHON.match(_program(words[0])):
        words = _module(words)  # python -m gunicorn ...: gunicorn ...
    if len(words) > 1 and _program(words[0]) == "sidestep" and words[1] == "run":
        # sidestep's own launcher (a Procfile's line): the command after its --
        return processes(words[words.index("--") + 1 :] if "--" in words else [], environ, exists)
    if not words:
        return Processes(False, "no command: one process")
    name, args = _program(words[0]), words[1:]
    if not _PLAIN_NAME.match(name):
        name = "the command"  # a word that is not a program's name may be a value
    if name == "gunicorn":
        return _gunicorn(args, environ, exists)
    if name == "uwsgi":
        return _uwsgi(args, environ)
    if name == "celery":
        return _celery(args)
    if name == "uvicorn":
        return _uvicorn(args, environ)
    if name not in _SERVERS:  # a wrapper: ddtrace-run, uv run, opentelemetry-instrument ...
        server = next((i for i, word in enumerate(args) if _program(word) in _SERVERS), None)
        if server is not None:
            return processes(args[server:], environ, exists)
    given = _option(args, ("--workers", "--processes"), ("-w",))
    if given is not None:
        return _count(name, "worker", given.option, given.value)
    return Processes(False, f"{name} without a worker option: one process")


def _assignments(
    words: list[str], environ: Mapping[str, str], options: bool
) -> tuple[list[str], Mapping[str, str]]:
    """The command after the ``NAME=value`` words that set its environment, and that
    environment; with `options` (``env``'s), ``-i`` empties it and ``-u NAME`` unsets."""
    changed = dict(environ)
    while words:
        word = words[0]
        if options and word in ("-i", "--ignore-environment", "-"):
            changed.clear()
        elif options and word in ("-u", "--unset") and len(words) > 1:
            changed.pop(words[1], None)
            words = words[1:]
        elif options and word.startswith(("--unset=", "-u")):
            changed.pop(word.partition("=")[2] if word.startswith("--") else word[2:], None)
        elif options and word == "--":
            return words[1:], changed
        elif _ASSIGNMENT.match(word):
            name, _, value = word.partition("=")
            changed[name] = value
        else:
            break
        words = words[1:]
    return words, changed


def _shell(args: list[str], environ: Mapping[str, str], exists: Callable[[str], bool]) -> Processes:
    """A shell's ``-c 'COMMANDS'``: the last of its commands (``cd /app && exec
    gunicorn ...``), read as the shell would run it; a script it runs is not read."""
    flags = ""
    while args and args[0].startswith("-") and args[0] not in ("-", "--"):
        flags += args.pop(0)[1:]
    if "c" not in flags or not args:
        return Processes(None, "a shell script, which doctor does not read")
    words = _shell_words(args[0].replace("\n", ";"))  # one command a line
    if words is None:
        return Processes(None, "a shell command doctor cannot split into words")
    commands: list[list[str]] = [[]]
    for word in words:
        if word not in _SEQUENCE:
            commands[-1].append(word)
        elif commands[-1]:
            commands.append([])
    last = next((command for command in reversed(commands) if command), [])
    if any(word in ("|", "||", "&", "(", ")") for word in last):
        return Processes(None, "a shell pipeline or background command: doctor does not follow it")
    return processes(last, environ, exists)


def _shell_words(text: str) -> list[str] | None:
    """`text` split into words and operators as a POSIX shell does; None when it cannot be."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:
        return None


def _module(words: list[str]) -> list[str]:
    """The module a ``python [options] -m MODULE ...`` runs, and its arguments; other
    Python commands as they are."""
    i = 1
    while i < len(words) and words[i].startswith("-"):
        if words[i] == "-m":
            return words[i + 1 :]
        if words[i].startswith("-m"):  # -mgunicorn
            return [words[i][2:], *words[i + 1 :]]
        i += 2 if words[i] in ("-W", "-X") else 1
    return words


def _gunicorn(
    args: list[str], environ: Mapping[str, str], exists: Callable[[str], bool]
) -> Processes:
    """The command line, then GUNICORN_CMD_ARGS, then a configuration file, then
    WEB_CONCURRENCY (the default of `workers`), then one: gunicorn's own order."""
    workers = (("--workers",), ("-w",))
    given = _option(args, *workers)
    if given is not None:
        return _count("gunicorn", "worker", given.option, given.value)
    try:
        extra = shlex.split(environ.get("GUNICORN_CMD_ARGS", ""))
    except ValueError:
        return Processes(None, "gunicorn, whose GUNICORN_CMD_ARGS cannot be split into words")
    given = _option(extra, *workers)
    if given is not None:
        return _count("gunicorn", "worker", "GUNICORN_CMD_ARGS", given.value)
    config = _option(args, ("--config",), ("-c",)) or _option(extra, ("--config",), ("-c",))
    if config is not None:
        return Processes(
            None,
            f"gunicorn, whose configuration file (given with {config.option}) may set"
            " workers: doctor does not read it",
        )
    if exists("gunicorn.conf.py"):
        return Processes(
            None,
            "gunicorn, whose gunicorn.conf.py (in this directory) may set workers:"
            " doctor does not read it",
        )
    if "WEB_CONCURRENCY" in environ:
        return _count("gunicorn", "worker", "WEB_CONCURRENCY", environ["WEB_CONCURRENCY"])
    return Processes(False, "gunicorn with one worker (its default)")


def _uwsgi(args: list[str], environ: Mapping[str, str]) -> Processes:
    """uwsgi reads its options in order, a configuration file's where the file is named:
    a count given after the last file stands; one before it, the file may override."""
    given = _option(args, ("--processes", "--workers"), ("-p",))
    files = [i for i in range(len(args)) if _uwsgi_config(args, i)]
    if given is not None and (not files or given.at > files[-1]):
        return _count("uwsgi", "process", given.option, given.value)
    if files or any(name in environ for name in _UWSGI_CONFIG_VARIABLES):
        return Processes(
            None, "uwsgi, whose configuration file may set processes: doctor does not read it"
        )
    for variable in ("UWSGI_PROCESSES", "UWSGI_WORKERS"):
        if variable in environ:
            return _count("uwsgi", "process", variable, environ[variable])
    return Processes(False, "uwsgi with one process (its default)")


def _uwsgi_config(args: list[str], i: int) -> bool:
    """Whether `args[i]` names a configuration file: an option that loads one, or a
    file given on its own (`uwsgi app.ini`)."""
    word = args[i]
    if word.partition("=")[0] in _UWSGI_CONFIG_OPTIONS:
        return True
    after_option = i > 0 and args[i - 1].startswith("-") and "=" not in args[i - 1]
    return not word.startswith("-") and not after_option and word.endswith(_UWSGI_CONFIG_SUFFIXES)


def _celery(args: list[str]) -> Processes:
    """A worker's processes: one for a pool that runs tasks in the worker itself, else
    its concurrency (or autoscale maximum), by default one per CPU."""
    if "multi" in args:
        return Processes(True, "celery multi, which starts several workers")
    if "worker" not in args:
        return Processes(False, "celery, not a worker: one process")
    args = args[args.index("worker") + 1 :]
    pool = _option(args, ("--pool",), ("-P",))
    if pool is not None and pool.value in _ONE_PROCESS_POOLS:
        return Processes(False, f"celery worker with the {pool.value} pool: one process")
    scale = _option(args, ("--autoscale",), ())
    if scale is not None:
        most = scale.value.partition(",")[0]
        return _count("celery worker", "process", "--autoscale's maximum", most)
    given = _option(args, ("--concurrency",), ("-c",))
    if given is not None:
        return _count("celery worker", "process", given.option, given.value)
    return Processes(
        True,
        "celery worker with one process per CPU (its default concurrency, unless the"
        " application's worker_concurrency or worker_pool says otherwise)",
    )


def _uvicorn(args: list[str], environ: Mapping[str, str]) -> Processes:
    """One server process with ``--reload`` (its reloader runs one, whatever the workers);
    else its workers. Its options are read from ``UVICORN_*`` variables too (``--workers``
    from ``UVICORN_WORKERS``, ``--reload`` from ``UVICORN_RELOAD``), and ``--workers``
    defaults to ``WEB_CONCURRENCY``."""
    options = args[: args.index("--")] if "--" in args else args
    reload = "--reload" in options
    if not reload and environ.get("UVICORN_RELOAD", "").strip().lower() in _YES:
        reload = True
    if reload:
        return Processes(False, "uvicorn reloading on changes: one process")
    given = _option(args, ("--workers",), ())
    if given is not None:
        return _count("uvicorn", "worker", given.option, given.value)
    for variable in ("UVICORN_WORKERS", "WEB_CONCURRENCY"):
        if variable in environ:
            return _count("uvicorn", "worker", variable, environ[variable])
    return Processes(False, "uvicorn without a worker option: one process")


_MAX_DIGITS = 6


def _count(name: str, noun: str, where: str, value: str) -> Processes:
    """`name` running `value` (set by `where`) of `noun`."""
    # ASCII digits only ('²' is a digit to str.isdigit, not to int), and few of them:
    # int() refuses thousands, and no machine runs a million workers
    if not (value.isascii() and value.isdigit()):
        return Processes(None, f"{name}, whose {where} is not a number here")
    if len(value.lstrip("0")) > _MAX_DIGITS:
        return Processes(None, f"{name}, whose {where} is not a plausible count")
    count = int(value)
    plural = "" if count == 1 else "es" if noun.endswith("s") else "s"
    return Processes(count > 1, f"{name} with {count} {noun}{plural} ({where})")


class _Given(NamedTuple):
    at: int  # the index of the option's word
    option: str  # as spelt: --workers, -w
    value: str


def _option(args: Sequence[str], longs: tuple[str, ...], shorts: tuple[str, ...]) -> _Given | None:
    """The last value an option is given, from ``--workers 4``, ``--workers=4``, ``-w 4``
    or ``-w4``; None when it is not given (before a ``--``)."""
    found = None
    for i, word in enumerate(args):
        if word == "--":
            break
        following = args[i + 1] if i + 1 < len(args) else None
        for flag in longs:
            if word == flag and following is not None:
                found = _Given(i, flag, following)
            elif word.startswith(flag + "="):
                found = _Given(i, flag, word[len(flag) + 1 :])
        for flag in shorts:
            if word == flag and following is not None:
                found = _Given(i, flag, following)
            elif word.startswith(flag) and not word.startswith("--") and word != flag:
                found = _Given(i, flag, word[len(flag) :])
    return found


def _program(word: str) -> str:
    return word.rpartition("/")[2]
