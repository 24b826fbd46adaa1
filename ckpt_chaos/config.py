"""Where ckpt-chaos reads scenarios from and writes to, for a project that installed it.

Nothing here depends on where the package itself lies: the built-in catalogue is package data,
runs and reports go under the output directory (the current directory unless told otherwise),
and fault-free (golden) runs are cached per user, so they survive between projects' runs and are
shared by them.

A project configures ckpt-chaos in its own ``pyproject.toml``::

    [tool.ckpt-chaos]
    scenarios = ["chaos/scenarios"]   # folders of the project's own scenario files (relative to the file)
    out = "build/chaos"               # where runs and reports go (default: the current directory)
    builtin = false                   # true: list and run take the built-in catalogue too, as --builtin

    [tool.ckpt-chaos.audit]           # ckpt-chaos audit's trainer and settings (docs/audit.md)
    argv = ["train.py", "--ckpt-dir", "{ckpt_dir}"]

``ckpt-chaos list`` and ``run`` take the project's folders only (``--scenarios DIR`` instead, when
given); the built-in catalogue only with ``--builtin`` or ``builtin = true``, or where no folder of
the project's is given (outside a project). A scenario named on the command line is also looked up
in the project's folders and the built-in catalogue (unless ``builtin = false``).

Environment variables: ``CKPT_CHAOS_CACHE`` moves the cache (golden runs, search database);
``CKPT_CHAOS_OUT`` sets the output directory when ``--out`` is not given; ``CKPT_CHAOS_GOLDEN_TREE``
(mutation testing only, ``golden_tree``) keys golden runs by another source tree's code.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ENV_CACHE = "CKPT_CHAOS_CACHE"
ENV_OUT = "CKPT_CHAOS_OUT"
ENV_GOLDEN_TREE = "CKPT_CHAOS_GOLDEN_TREE"
TOOL_TABLE = "ckpt-chaos"


class ConfigError(ValueError):
    """A ``[tool.ckpt-chaos]`` table that cannot be used; the message names the file, key and fix."""


def builtin_scenarios() -> Path:
    """The catalogue shipped with the package."""
    return Path(__file__).resolve().parent / "scenarios"


def cache_dir() -> Path:
    """``$CKPT_CHAOS_CACHE``, else the user's cache directory (``~/.cache/ckpt-chaos`` on Linux)."""
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("ckpt-chaos", appauthor=False))


def golden_dir() -> Path:
    """The cache of fault-free runs, keyed by trainer code, configuration and world size."""
    return cache_dir() / "golden"


def golden_tree() -> Path | None:
    """The source tree whose trainer code keys the golden runs, when ``$CKPT_CHAOS_GOLDEN_TREE`` pins
    one; None (the default) keys them by the code the workers will import.

    Mutation testing runs each mutant from a copy of the project: keyed by the mutant's own code, a
    golden run would be made again per mutant, from the mutant, and the oracle would share its bug.
    Pinned, every mutant finds the golden runs the pristine tree made. A pinned golden run that is
    missing is only made from within that tree (``refuse_golden_elsewhere``)."""
    tree = os.environ.get(ENV_GOLDEN_TREE)
    if not tree:
        return None
    path = Path(tree).expanduser().resolve()
    if not path.is_dir():
        raise ConfigError(f"${ENV_GOLDEN_TREE}={tree}: not a folder; give the pristine source tree whose "
                          "golden runs to use, or unset it")
    return path


def refuse_golden_elsewhere(key: str, root: Path) -> None:
    """Raise when golden run ``key`` is missing, is pinned to another tree's code, and the workers
    would run the current directory's (perhaps mutated) code to make it."""
    tree = golden_tree()
    if tree is not None and Path.cwd().resolve() != tree:
        raise RuntimeError(f"golden run {key} is not in {root}, and ${ENV_GOLDEN_TREE} pins golden runs to "
                           f"{tree}'s code while this runs from {Path.cwd()}: make it first by running the "
                           f"scenario from {tree} with --golden-dir {root}")


@dataclass
class ProjectConfig:
    """The ``[tool.ckpt-chaos]`` table of the project being tested (empty outside a project)."""

    file: Path | None = None  # the pyproject.toml it came from
    scenarios: list[Path] = field(default_factory=list)  # the project's own scenario folders
    out: Path | None = None  # where runs and reports go
    builtin: bool | None = None  # true: select the built-in catalogue too; false: never offer it; unset: neither
    audit: dict = field(default_factory=dict)  # [tool.ckpt-chaos.audit], read by ckpt_chaos/subcommands/audit.py

    def scenario_dirs(self, given: list[Path] | None = None, builtin: bool = False) -> list[Path]:
        """The folders ``list`` and ``run`` select from: ``given`` (``--scenarios``), else the project's;
        then the built-in catalogue when asked (``builtin``: ``--builtin``; ``builtin = true``), or
        when there is no such folder and the project does not say ``builtin = false``."""
        own = list(given or self.scenarios)
        if builtin or self.builtin is True or (not own and self.builtin is not False):
            own.append(builtin_scenarios())
        return _unique(own)

    def lookup_dirs(self, given: list[Path] | None = None, builtin: bool = False) -> list[Path]:
        """Where a scenario named on the command line is looked for: the folders selected, then the
        project's own and the built-in catalogue (unless ``builtin = false`` and no ``--builtin``)."""
        offered = [*self.scenarios, *([builtin_scenarios()] if builtin or self.builtin is not False else [])]
        return _unique([*self.scenario_dirs(given, builtin), *offered])


def _unique(dirs: list[Path]) -> list[Path]:
    out: list[Path] = []
    for d in dirs:
        if Path(d).resolve() not in out:
            out.append(Path(d).resolve())
    return out


def find_pyproject(start: Path | None = None) -> Path | None:
    """The nearest ``pyproject.toml`` at or above ``start`` (the current directory)."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "pyproject.toml").is_file():
            return d / "pyproject.toml"
    return None


def project_config(start: Path | None = None) -> ProjectConfig:
    """Read ``[tool.ckpt-chaos]`` from the nearest ``pyproject.toml``; no table, no settings."""
    path = find_pyproject(start)
    if path is None:
        return ProjectConfig()
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: cannot read it: {e}; fix the file or run from another directory") from None
    table = data.get("tool", {}).get(TOOL_TABLE)
    if table is None:
        return ProjectConfig()
    key = f"tool.{TOOL_TABLE}"
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {key}: expected a table; write [{key}] with keys")
    allowed = {"scenarios", "out", "builtin", "audit"}
    for k in table:
        if k not in allowed:
            raise ConfigError(f"{path}: {key}.{k}: unknown key; allowed keys: {', '.join(sorted(allowed))}")
    scenarios = table.get("scenarios", [])
    if isinstance(scenarios, str):
        scenarios = [scenarios]
    if not (isinstance(scenarios, list) and all(isinstance(s, str) for s in scenarios)):
        raise ConfigError(f"{path}: {key}.scenarios: expected a list of folders; e.g. scenarios = [\"chaos\"]")
    dirs = [(path.parent / s).resolve() for s in scenarios]
    for s, d in zip(scenarios, dirs):
        if not d.is_dir():
            raise ConfigError(f"{path}: {key}.scenarios: {s!r} is not a folder (looked for {d}); "
                              "create it or fix the path")
    out = table.get("out")
    if out is not None and not isinstance(out, str):
        raise ConfigError(f"{path}: {key}.out: expected a path string; e.g. out = \"build/chaos\"")
    builtin = table.get("builtin")
    if builtin is not None and not isinstance(builtin, bool):
        raise ConfigError(f"{path}: {key}.builtin: expected true or false, found {builtin!r}; true: list and run "
                          "take the built-in catalogue besides the project's scenarios (as --builtin)")
    audit = table.get("audit", {})
    if not isinstance(audit, dict):
        raise ConfigError(f"{path}: {key}.audit: expected a table; write [{key}.audit] with argv = [...]")
    return ProjectConfig(file=path, scenarios=dirs, out=(path.parent / out).resolve() if out else None,
                         builtin=builtin, audit=audit)


def out_dir(option: str | Path | None = None, project: ProjectConfig | None = None) -> Path:
    """Where runs and reports go: ``--out``, else ``$CKPT_CHAOS_OUT``, else the project's ``out``,
    else the current directory."""
    if option:
        return Path(option).resolve()
    if os.environ.get(ENV_OUT):
        return Path(os.environ[ENV_OUT]).resolve()
    if project is not None and project.out is not None:
        return project.out
    return Path.cwd()
