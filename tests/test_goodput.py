"""The goodput model: the Monte Carlo agrees with Daly's closed form where its assumptions hold,
the optimal intervals are optimal, and ``ckpt-chaos cadence`` answers without any training."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_chaos.report.goodput import Costs, _draws, daly_interval, expected_goodput, recommend, simulate, young_interval

costs = st.builds(Costs, save=st.floats(1, 120), restart=st.floats(10, 900), mtbf=st.floats(1800, 48 * 3600))


@settings(max_examples=12, deadline=None, derandomize=True)
@given(c=costs, fraction=st.floats(0.3, 3.0))
def test_monte_carlo_agrees_with_the_closed_form_for_exponential_failures(c, fraction):
    interval = fraction * daly_interval(c)
    sim = simulate(interval, c, horizon=300 * c.mtbf, runs=12, seed=7)
    model = expected_goodput(interval, c)
    # 12 jobs of 300 MTBFs each: the standard error of the mean is well under 0.3 % here.
    assert abs(sim.mean - model) < 0.015, (sim, model)
    assert sim.p5 <= sim.mean <= sim.p95


@settings(max_examples=30, deadline=None, derandomize=True)
@given(c=costs)
def test_daly_and_young_intervals_are_near_the_best_of_a_fine_grid(c):
    grid = np.geomspace(c.save / 10, 50 * daly_interval(c), 4000)
    best = max(expected_goodput(t, c) for t in grid)
    assert expected_goodput(daly_interval(c), c) >= best - 0.002
    assert expected_goodput(young_interval(c), c) >= best - 0.01
    assert young_interval(c) == math.sqrt(2 * c.save * c.mtbf)


def test_weibull_failures_keep_the_given_mean():
    rng = np.random.default_rng(0)
    for shape in (0.5, 0.7, 1.0, 2.0):
        assert abs(_draws(rng, 3600.0, shape, 200_000).mean() / 3600.0 - 1) < 0.02


def test_the_current_interval_is_scored_against_the_best():
    rec = recommend(Costs(save=30, restart=600, mtbf=8 * 3600), current=3600)
    assert rec.current_goodput < rec.best_goodput
    assert abs(rec.best_s - rec.daly_s) / rec.daly_s < 0.2


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "ckpt_chaos.cli", "cadence", *args], capture_output=True, text=True,
                          cwd=cwd)


def test_cadence_recommends_and_plots_without_training(tmp_path):
    out = tmp_path / "cadence"
    p = run_cli("--save-s", "30", "--restart-s", "600", "--node-mtbf-h", "2000", "--nodes", "256",
                "--interval-s", "3600", "--runs", "5", "--out", str(out), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "best interval" in p.stdout and "your interval" in p.stdout and "lost against the best" in p.stdout
    figures = json.loads((out / "cadence.json").read_text())
    assert abs(figures["costs"]["mtbf"] - 2000 * 3600 / 256) < 1e-6
    assert (out / "cadence.svg").read_text().lstrip().startswith(("<?xml", "<svg"))


def test_cadence_rejects_impossible_costs_with_the_field_named(tmp_path):
    p = run_cli("--save-s", "0", "--restart-s", "600", "--mtbf-h", "10", "--out", str(tmp_path), cwd=tmp_path)
    assert p.returncode == 2 and "save=0.0: must be > 0 seconds" in p.stderr
    p = run_cli("--save-s", "30", "--restart-s", "600", "--out", str(tmp_path), cwd=tmp_path)
    assert p.returncode == 2 and "--mtbf-h" in p.stderr
