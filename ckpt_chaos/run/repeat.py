"""``ckpt-chaos run --repeat N``: the same scenarios N times, their verdicts compared.

A scenario is deterministic in what it checks (a trigger counts events, never time), so each run of
it must end with the same verdict and the same checks not passing. One whose verdict or failing
checks differ between runs is *flaky*: what it reports rests on the machine's timing (a race the
scenario did not declare, a timeout too tight), and it fails the suite, naming what differed.
"""

from __future__ import annotations

NOT_PASSING = ("fail", "unknown")


def outcome(row: dict) -> tuple[str, dict[str, str]]:
    """What must be the same on every run: the verdict, and each check that did not pass, with its
    verdict (the details may differ: times, pids)."""
    return row["verdict"], {c["name"]: c["verdict"] for c in row.get("checks", []) if c["verdict"] in NOT_PASSING}


def differences(rows: list[dict]) -> list[str]:
    """How the runs ``rows`` of one scenario differ (empty: they agree), each line naming the runs."""
    outcomes = [outcome(r) for r in rows]
    if all(o == outcomes[0] for o in outcomes):
        return []
    out = []
    verdicts = [v for v, _ in outcomes]
    if len(set(verdicts)) > 1:
        out.append("verdict " + ", ".join(f"{v} (run {k})" for k, v in enumerate(verdicts, 1)))
    names = sorted({n for _, checks in outcomes for n in checks})
    for name in names:
        seen = [checks.get(name, "pass") for _, checks in outcomes]
        if len(set(seen)) == 1:
            continue
        details = []
        for k, row in enumerate(rows, 1):
            c = next((c for c in row.get("checks", []) if c["name"] == name), None)
            details.append(f"run {k}: {seen[k - 1] if c else 'absent'}"
                           + (f" ({c['detail'][:200]})" if c and c["verdict"] in NOT_PASSING else ""))
        out.append(f"{name}: " + "; ".join(details))
    return out


def merged(rows: list[dict]) -> dict:
    """One row for a scenario run ``len(rows)`` times: the last run's, with every run's verdict and
    folder in ``runs``; a flaky one fails, with a ``flaky`` check that says what differed."""
    row = {**rows[-1], "runs": [{"verdict": r["verdict"], "run_dir": r.get("run_dir", "")} for r in rows]}
    diff = differences(rows)
    if diff:
        detail = f"{len(rows)} runs disagree: " + " | ".join(diff)
        row["checks"] = [{"name": "flaky", "check": "flaky", "fault": None, "at": None, "verdict": "fail",
                          "detail": detail}, *row.get("checks", [])]
        row["verdict"] = "fail"
        row["reason"] = f"flaky: {detail}" + (f"; {row['reason']}" if row.get("reason") else "")
    return row
