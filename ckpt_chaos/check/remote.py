"""The remote tier's checks: every checkpoint the remote side calls durable is complete, a restore
takes only such a checkpoint and puts it back in place, the final checkpoint is durable, uploads back
off and give up as configured, the remote retention keeps what it promises, and the training loop never
waits for an upload.
"""

from __future__ import annotations

import math

from ckpt_chaos.check.commits import blame, kind_of
from ckpt_chaos.check.history import Exited
from ckpt_chaos.check.verdict import Report, Run, first_few


def remote_tier(run: Run, report: Report) -> None:
    """With a remote tier: every checkpoint the remote side calls durable is complete (the harness
    downloads and hashes each object), a restore only ever takes such a checkpoint, and the
    training loop never waits for an upload."""
    if run.s.remote is None:
        return
    views = [(f"fault_{h.index}", h.index, h.t, h.remote_after) for h in run.faults() if h.remote_after is not None]
    views += [(str(ex.launch), None, ex.t, ex.remote) for ex in run.records(Exited) if ex.remote is not None]
    damaged = {h.detail.get("checkpoint"): h.t for h in run.faults() if kind_of(run, h).damages and h.detail.get("remote")}
    for label, index, t, remote in views:
        torn = {n: r for n, r in remote["checkpoints"].items() if r is not None and not damaged.get(n, t + 1) <= t}
        report.add("remote_durable_complete", not torn, at=label, fault=index, detail=
                   f"{len(remote['checkpoints'])} durable remote checkpoint(s), each complete"
                   + (f"; {len(remote['partial'])} partial upload(s) without a manifest: {', '.join(remote['partial'])}"
                      if remote["partial"] else "") if not torn else
                   "; ".join(f"{n} is marked durable (manifest.json uploaded) but {r}" for n, r in torn.items())
                   + ": the uploader marked it durable before every object was complete" + blame(run, t))
    for launch in run.launches()[1:]:
        before = run.exit_of(launch - 1)
        remote = (before.remote if before else None) or {}
        for e in run.trainer("restored_from_remote", launch):
            reason = remote.get("checkpoints", {}).get(e["name"], "not durable")
            size = remote.get("bytes", {}).get(e["name"])
            if reason is None and size is not None and e.get("bytes") != size:
                reason = (f"complete, {size} bytes of objects besides its manifest, but the trainer reported "
                          f"{e.get('bytes')!r} bytes fetched")
            said = f" ({size} bytes, as the trainer reported)" if size is not None else ""
            report.add("restored_durable", reason is None, at=launch, detail=
                       f"launch {launch} restored {e['name']}, complete on the remote tier{said}" if reason is None
                       else f"launch {launch} restored {e['name']} from the remote tier, which was {reason}")
            _restored_in_place(run, report, launch, e)
    _uploaded_durable(run, report, views, damaged)
    exits = run.records(Exited)
    if exits and exits[-1].rc == 0 and run.trainer("finished") and exits[-1].remote is not None:
        local, remote = exits[-1].snapshot["newest_valid"], exits[-1].remote["newest_durable"]
        report.add("final_durable", remote == local,
                   f"the final checkpoint {local} is durable on the remote tier" if remote == local else
                   f"training finished with {local}, but the newest durable remote checkpoint is {remote or 'none'}: "
                   "the last upload never completed (see upload_* events in events.jsonl)")
        _remote_retention(run, report, exits[-1].remote)
    upload_backoff(run, report)
    upload_retries(run, report)
    # A hand-off is a pipe write; an uploader that made the loop wait would stall it for about as long as
    # its uploads take. Compared in sums, so one scheduling hiccup on a busy machine does not decide it.
    stall = sum(e["stall_s"] for e in run.trainer("upload_queued"))
    uploading = sum(e["seconds"] for e in run.trainer("uploaded"))
    if uploading > 0:
        ok = stall < 0.25 * uploading
        report.add("upload_stall", ok,
                   f"handing checkpoints to the uploader stalled training {stall * 1000:.1f} ms in all, while uploads "
                   f"took {uploading:.2f} s" + ("" if ok else ": the training loop waited for its uploads"))


def _restored_in_place(run: Run, report: Report, launch: int, e: dict) -> None:
    """A launch that ended after reporting a restore (``restored_from_remote``) but before loading
    anything left the restored copy in the checkpoint folder under its name: its rename happened and
    was made durable, a power cut included. Not judged where the launch loaded it (its load says more)
    or where a later fault of the launch took the disk or damaged a checkpoint."""
    ex = run.exit_of(launch)
    if ex is None or any(x.get("t", 0) > e["t"] for x in run.trainer("loaded", launch)):
        return
    if any(x.launch == launch and x.t > e["t"] and (kind_of(run, x).loses_disk or kind_of(run, x).damages)
           for x in run.faults()):
        return
    here = e["name"] in ex.snapshot.get("checkpoints", {})
    report.add("restored_in_place", here, at=launch, detail=
               f"launch {launch} reported restoring {e['name']} and ended before loading it; the copy is in "
               "the checkpoint folder under that name" if here else
               f"launch {launch} reported restoring {e['name']} from the remote tier (restored_from_remote), but "
               f"when it ended (status {ex.rc}) the checkpoint folder held no {e['name']}: the copy's rename "
               "failed or was never made durable" + blame(run, ex.t))


def _uploaded_durable(run: Run, report: Report, views: list, damaged: dict) -> None:
    """Each checkpoint the uploader reported durable (``uploaded``) was: at the first view of the
    remote tier after the report it has its manifest there, or a newer checkpoint is durable (remote
    retention deletes one only then, and a view mid-deletion shows the same). A report that no view
    follows is not judged."""
    from ckpt_chaos.probe.layout import parse_name

    claims = run.trainer("uploaded")
    problems, judged = [], 0
    for e in claims:
        after = [v for v in views if v[2] > e["t"]]
        if not after or e["name"] in damaged:
            continue
        label, index, _, remote = min(after, key=lambda v: v[2])
        judged += 1
        held = remote["checkpoints"]
        if e["name"] in held or any(parse_name(n) > parse_name(e["name"]) for n in held):
            continue
        when = f"at fault {index}" if index is not None else f"at the end of launch {label}"
        problems.append(f"the uploader reported {e['name']} durable (uploaded, launch {e.get('attempt')}), but "
                        f"the remote tier's next view ({when}) holds no manifest for it nor any newer durable "
                        "checkpoint: the manifest's put failed or never happened, and a restore would not find "
                        "the checkpoint" + blame(run, e["t"]))
    if not claims:
        return
    if not judged:
        report.add("uploaded_durable", "unknown", f"{len(claims)} upload(s) reported durable, but no view of the "
                   "remote tier came after any of them (or each was damaged on purpose): none could be checked")
        return
    report.add("uploaded_durable", not problems,
               f"{judged} upload(s) reported durable, each held durable by the remote tier at its next view"
               if not problems else first_few(problems))


def upload_backoff(run: Run, report: Report) -> None:
    """After its k-th failed attempt at a checkpoint the uploader waits upload_backoff_s * 2^(k-1),
    as configured, before the next: a store that is down is not hammered, and one that is back is
    not kept waiting longer than asked. The wait it reports is the configured one, and the next
    event of that upload came no sooner."""
    if run.s.remote is None:
        return
    retries = [e for e in run.trainer("upload_retry") if e.get("retry_in_s") is not None]
    if not retries:
        return
    by_process: dict[str, list[dict]] = {}
    for e in run.events:
        if e.get("role") == "uploader" and e.get("name") is not None:
            by_process.setdefault(e.get("process"), []).append(e)
    problems = []
    for e in retries:
        launch, k = e.get("attempt", 0), e["upload_attempt"]
        backoff = float(run.config(launch).get("upload_backoff_s", run.s.remote.backoff_s))
        want = backoff * 2 ** (k - 1)
        if not math.isclose(e["retry_in_s"], want, rel_tol=1e-6, abs_tol=1e-9):
            problems.append(f"{e['name']} (launch {launch}): after attempt {k} the uploader waits "
                            f"{e['retry_in_s']:g}s, not upload_backoff_s * 2^{k - 1} = {want:g}s")
            continue
        same = by_process.get(e.get("process"), [])
        nxt = next((x for x in same if x["t"] > e["t"] and x["name"] == e["name"]), None)
        if nxt is not None and nxt["t"] - e["t"] < e["retry_in_s"]:
            problems.append(f"{e['name']} (launch {launch}): after attempt {k} it said it would wait {want:g}s, but "
                            f"its next event ({nxt['event']}) came {nxt['t'] - e['t']:.3f}s later")
    report.add("upload_backoff", not problems,
               f"{len(retries)} retried upload attempt(s), each after the configured backoff" if not problems else
               first_few(problems))


def upload_retries(run: Run, report: Report) -> None:
    """An upload is given up only after the upload_retries attempts it is configured to make: its
    failed attempts, as its upload_retry events number them, are 1 to upload_retries, and the last
    names no wait (one that says it will retry and then gives up made one attempt fewer than it
    promised). Decided only for uploads the trainer reported giving up (upload_failed)."""
    if run.s.remote is None or not run.trainer("upload_failed"):
        return
    tries: dict[tuple, list[dict]] = {}
    problems, given_up = [], 0
    for e in sorted(run.events, key=lambda e: e["t"]):
        if e["event"] not in ("upload_retry", "upload_failed", "uploaded", "upload_abandoned"):
            continue
        key = (e.get("process"), e.get("name"))
        if e["event"] == "upload_retry":
            tries.setdefault(key, []).append(e)
            continue
        made = tries.pop(key, [])  # an upload's attempts end with it, whatever its end
        if e["event"] != "upload_failed":
            continue
        given_up += 1
        launch = e.get("attempt", 0)
        want = int(run.config(launch).get("upload_retries", run.s.remote.retries))
        numbers = [r.get("upload_attempt") for r in made]
        if numbers != list(range(1, want + 1)):
            problems.append(f"{e['name']} (launch {launch}): given up after {len(made)} failed attempt(s) "
                            f"(numbered {numbers}), but upload_retries={want}")
        elif made[-1].get("retry_in_s") is not None:
            problems.append(f"{e['name']} (launch {launch}): after attempt {want} it said it would retry in "
                            f"{made[-1]['retry_in_s']:g}s, then gave up")
    report.add("upload_retries", not problems,
               f"{given_up} upload(s) given up, each after the upload_retries attempts configured" if not problems
               else first_few(problems))


def _remote_retention(run: Run, report: Report, remote: dict) -> None:
    """After the last upload the remote tier holds the newest ``remote_keep_last`` durable checkpoints
    and nothing older: neither durable ones beyond that nor the objects of uploads that never became
    durable (a bucket that only grows is a bill that only grows)."""
    from ckpt_chaos.probe.layout import parse_name

    keep = int(run.s.trainer.get("remote_keep_last", 2))
    durable, newest = list(remote["checkpoints"]), remote["newest_durable"]
    stale = [n for n in remote["partial"] if newest is not None and parse_name(n) < parse_name(newest)]
    problems = ([f"{len(durable)} durable checkpoints ({', '.join(durable)}), more than remote_keep_last={keep}"]
                if len(durable) > keep else [])
    if stale:
        problems.append(f"objects without a manifest older than the newest durable checkpoint {newest}: "
                        f"{', '.join(stale)} (a deleted checkpoint whose data objects stayed, or a failed upload "
                        "never cleaned up)")
    report.add("remote_retention", not problems,
               f"the remote tier keeps {len(durable)} durable checkpoint(s) (remote_keep_last={keep}) and no "
               "older objects" if not problems else "; ".join(problems))
