"""Fault schedules nobody wrote down: the schedule model, the search loop, reduction to a scenario file."""
