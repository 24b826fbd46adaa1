"""Running a scenario: the runner, the probe server and its triggers, runs side by side and fanned out."""
