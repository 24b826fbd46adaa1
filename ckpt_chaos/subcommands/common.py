"""What the subcommands share: exit statuses, the usage error, the project's settings, output."""

from __future__ import annotations

import json
import sys
from functools import cache

from ckpt_chaos import config
from ckpt_chaos.extras import missing_extra

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CANNOT_RUN, EXIT_UNKNOWN, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130


class UsageError(Exception):
    """Bad input; the message names the file or option and the fix. Exits 2."""


@cache
def project() -> config.ProjectConfig:
    try:
        return config.project_config()
    except config.ConfigError as e:
        raise UsageError(str(e)) from None


def json_out(data) -> None:
    sys.stdout.write(json.dumps(data, indent=1) + "\n")
    sys.stdout.flush()


def needs(extra: str, command: str) -> int | None:
    why = missing_extra(extra)
    if why is None:
        return None
    print(f"ckpt-chaos {command}: {why}", file=sys.stderr)
    return EXIT_CANNOT_RUN
