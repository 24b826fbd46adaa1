"""What must hold: the judge and its checks by theme, the history and file evidence they read, the verdicts."""
