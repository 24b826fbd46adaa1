"""The world a job runs in: launchers, file systems and faultfs, fanotify, nodes, Slurm, the object store."""
