"""Goodput against checkpoint interval: closed-form models, a Monte Carlo of failures, a recommendation.

The setting (Young 1974, Daly 2006): a job computes in segments of ``interval`` seconds, each
followed by a checkpoint that stalls training ``save`` seconds. A failure loses everything since
the last completed checkpoint, then costs ``restart`` seconds (process start, rendezvous, load)
before work resumes; a failure can also strike during a save or a restart. *Goodput* is the
fraction of wall time spent on work that is kept.

* ``young_interval``: sqrt(2 * save * mtbf), the first-order optimum.
* ``daly_interval``: Daly's higher-order optimum (valid for save < 2 * mtbf).
* ``expected_goodput``: Daly's complete model for exponential failures,
  ``interval / (mtbf * e^(restart/mtbf) * (e^((interval+save)/mtbf) - 1))``, exact under its
  assumptions (failures a Poisson process, costs constant).
* ``simulate``: the same job with failures drawn from an exponential or a Weibull distribution
  (shape < 1: infant mortality, failures cluster after a restart), over a finite horizon,
  replicated: the mean goodput and its spread. Where the closed form's assumptions hold the two
  agree (tests/test_goodput.py checks it); where they do not (Weibull), only the simulation applies.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

# Rules of thumb from the articles this project came from (../shared/seeds): a fixed wall-clock
# interval, hourly for stable clusters, every few minutes for preemptible capacity.
RULES_OF_THUMB_S = {"every 60 min (stable cluster)": 3600.0, "every 5 min (preemptible)": 300.0}


@dataclass
class Costs:
    """What a failure and a checkpoint cost, in seconds (measured or given)."""

    save: float  # training stall per checkpoint
    restart: float  # failure to first new step: detection, relaunch, rendezvous, load
    mtbf: float  # mean time between failures of the whole job

    def validate(self) -> None:
        for name, value in asdict(self).items():
            if not value > 0:
                raise ValueError(f"{name}={value}: must be > 0 seconds")


def young_interval(c: Costs) -> float:
    return math.sqrt(2 * c.save * c.mtbf)


def daly_interval(c: Costs) -> float:
    if c.save >= 2 * c.mtbf:
        return c.mtbf
    x = c.save / (2 * c.mtbf)
    return math.sqrt(2 * c.save * c.mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - c.save


def expected_goodput(interval: float, c: Costs) -> float:
    """Daly's complete model: expected useful fraction of wall time, exponential failures."""
    return interval / (c.mtbf * math.exp(c.restart / c.mtbf) * math.expm1((interval + c.save) / c.mtbf))


def _draws(rng: np.random.Generator, mtbf: float, shape: float, n: int) -> np.ndarray:
    """Times between failures with mean ``mtbf``: exponential (shape 1) or Weibull."""
    if shape == 1.0:
        return rng.exponential(mtbf, n)
    scale = mtbf / math.gamma(1 + 1 / shape)  # keeps the mean at mtbf
    return scale * rng.weibull(shape, n)


def simulate_once(interval: float, c: Costs, horizon: float, rng: np.random.Generator, shape: float = 1.0) -> float:
    """Goodput of one job of ``horizon`` seconds of useful work. The failure process renews at
    each failure (a replaced node starts young), which is what makes a Weibull shape < 1 hurt."""
    pool = iter(())

    def next_gap() -> float:
        nonlocal pool
        try:
            return next(pool)
        except StopIteration:
            pool = iter(_draws(rng, c.mtbf, shape, 4096).tolist())
            return next(pool)

    t, done, fail_at = 0.0, 0.0, next_gap()
    while done < horizon:
        work = min(interval, horizon - done)
        if t + work + c.save <= fail_at:
            t += work + c.save
            done += work
            continue
        t = fail_at  # everything since the last checkpoint is lost
        fail_at = t + next_gap()
        while t + c.restart > fail_at:  # a failure during the restart starts it over
            t = fail_at
            fail_at = t + next_gap()
        t += c.restart
    return horizon / t


@dataclass
class Simulated:
    interval: float
    mean: float
    p5: float
    p95: float


def simulate(interval: float, c: Costs, horizon: float, runs: int = 200, seed: int = 0,
             shape: float = 1.0) -> Simulated:
    """Goodput of ``runs`` independent jobs: mean and the 5th-95th percentile spread."""
    rng = np.random.default_rng(seed)
    values = np.array([simulate_once(interval, c, horizon, rng, shape) for _ in range(runs)])
    return Simulated(interval, float(values.mean()), float(np.percentile(values, 5)), float(np.percentile(values, 95)))


@dataclass
class Recommendation:
    costs: Costs
    young_s: float
    daly_s: float
    best_s: float  # the best of the scanned intervals by the model (or the simulation for Weibull)
    best_goodput: float
    current_s: float | None
    current_goodput: float | None
    curve: list[dict]  # interval_s, model, and (when simulated) sim_mean, sim_p5, sim_p95
    rules: dict[str, float]  # rule of thumb -> its goodput


def recommend(c: Costs, current: float | None = None, horizon: float | None = None, runs: int = 0,
              shape: float = 1.0, points: int = 40, seed: int = 0) -> Recommendation:
    """Scan intervals around the optimum; with ``runs`` > 0 also simulate each (needed for Weibull)."""
    c.validate()
    young, daly = young_interval(c), daly_interval(c)
    lo, hi = max(c.save, daly / 20), max(daly * 20, (current or 0) * 1.5, max(RULES_OF_THUMB_S.values()) * 1.5)
    grid = sorted(set(np.geomspace(lo, hi, points).tolist()) | {young, daly} | ({current} if current else set()))
    curve = []
    for i, tau in enumerate(grid):
        row = {"interval_s": tau, "model": expected_goodput(tau, c)}
        if runs:
            sim = simulate(tau, c, horizon or 50 * c.mtbf, runs, seed + i, shape)
            row.update(sim_mean=sim.mean, sim_p5=sim.p5, sim_p95=sim.p95)
        curve.append(row)
    key = "sim_mean" if runs and shape != 1.0 else "model"
    best = max(curve, key=lambda r: r[key])
    return Recommendation(
        costs=c, young_s=young, daly_s=daly, best_s=best["interval_s"], best_goodput=best[key],
        current_s=current, current_goodput=expected_goodput(current, c) if current else None, curve=curve,
        rules={name: expected_goodput(tau, c) for name, tau in RULES_OF_THUMB_S.items()})


def plot(rec: Recommendation, path) -> None:
    """Goodput against interval, the optimum, the rules of thumb and the current interval marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["interval_s"] / 60 for r in rec.curve]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(xs, [r["model"] * 100 for r in rec.curve], label="model (Daly, exponential failures)")
    if "sim_mean" in rec.curve[0]:
        ax.plot(xs, [r["sim_mean"] * 100 for r in rec.curve], "--", label="Monte Carlo mean")
        ax.fill_between(xs, [r["sim_p5"] * 100 for r in rec.curve], [r["sim_p95"] * 100 for r in rec.curve],
                        alpha=0.2, label="Monte Carlo 5-95 %")
    ax.axvline(rec.best_s / 60, color="green", label=f"optimum {rec.best_s / 60:.1f} min ({rec.best_goodput:.1%})")
    ax.axvline(rec.young_s / 60, color="green", ls=":", label=f"Young {rec.young_s / 60:.1f} min")
    for (name, _), tau in zip(rec.rules.items(), RULES_OF_THUMB_S.values()):
        ax.axvline(tau / 60, color="grey", ls="--", lw=0.8)
        ax.annotate(name, (tau / 60, ax.get_ylim()[0]), rotation=90, fontsize=7, va="bottom", color="grey")
    if rec.current_s:
        ax.axvline(rec.current_s / 60, color="red", label=f"current {rec.current_s / 60:.1f} min "
                                                          f"({rec.current_goodput:.1%})")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (minutes of training between checkpoints)")
    ax.set_ylabel("goodput (%)")
    ax.set_title(f"save {rec.costs.save:g} s, restart {rec.costs.restart:g} s, MTBF {rec.costs.mtbf / 3600:.2f} h")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
