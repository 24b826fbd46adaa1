"""Which ranks a fault's ``target`` names."""

from __future__ import annotations


def target_ranks(target: str, world_size: int, triggering: int | None = None,
                 ranks_per_node: int | None = None) -> list[int]:
    """The ranks a target names at this world size. ``node:N`` is every rank of node N; with
    ``ranks_per_node`` None (the local backend) there is one node holding every rank."""
    if target == "triggering":
        return [] if triggering is None else [triggering]
    if target == "uploader":  # the remote tier's uploader process, not a rank
        return []
    if target.startswith("node:"):
        if ranks_per_node is None:
            return list(range(world_size)) if target == "node:0" else []
        n = int(target[5:])
        return [r for r in range(n * ranks_per_node, (n + 1) * ranks_per_node) if r < world_size]
    if target == "all":
        return list(range(world_size))
    if target == "majority":
        return list(range(world_size // 2 + 1))
    if target == "minority":
        n = (world_size - 1) // 2
        return list(range(world_size - n, world_size))
    if target.startswith("rank:"):
        return [int(target[5:])]
    if target.startswith("ranks:"):
        return sorted({int(x) for x in target[6:].split(",")})
    raise ValueError(target)
