"""The automatic probe layer's recorder: the per-step points from the optimizer's hooks, and the
trajectory (losses, learning rate, samples, digests of the state) rank 0 writes for the checks."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from ckpt_chaos import probe
from ckpt_chaos.probe.auto_state import _orig, _point, _s, incarnation


def _ids(indices):
    try:
        return [int(i) for i in indices]
    except TypeError:
        return int(indices) if isinstance(indices, int) else repr(indices)


def _rank() -> int:
    """This process's rank; once the process group tells it, it is kept (a hook runs every step)."""
    if _s.rank is not None and _s.rank_pid == os.getpid():
        return _s.rank
    rank = probe._rank()
    if rank is not None:
        _s.rank, _s.rank_pid = rank, os.getpid()
        incarnation()  # before the first record of a restarted rank, which counts in its launch
        return rank
    return int(os.environ.get("LOCAL_RANK", "0"))


def _optimizer_step(opt) -> int | None:
    """The optimizer's own step count (Adam and friends keep one per parameter)."""
    for group in opt.param_groups:
        for p in group["params"]:
            step = opt.state.get(p, {}).get("step")
            if step is not None:
                return int(step)
    return None


def _warm_up(opt, args, kwargs) -> bool:
    """Whether this optimizer step creates the optimizer's state and trains nothing: torch DCP's
    ``get_state_dict`` of an optimizer with no state yet (``_init_optim_state``, before a load) steps
    it on zero gradients with a zero learning rate. Any step with no closure, no backward since the
    last step and every group's learning rate zero is one, whoever makes it."""
    if kwargs.get("closure", args[0] if args else None) is not None:
        return False
    frame = sys._getframe(1)
    for _ in range(8):  # the hook runs a few frames under the call of step()
        if frame is None:
            break
        if frame.f_code.co_name == "_init_optim_state":
            return True
        frame = frame.f_back
    if _s.backwards:
        return False
    try:
        return all(float(g["lr"]) == 0.0 for g in opt.param_groups if "lr" in g) and bool(opt.param_groups)
    except (TypeError, ValueError, RuntimeError):
        return False


def _numbered(opt, count: int | None) -> int | None:
    """The step the optimizer's count ``count`` stands for: less the warm-up steps (``_warm_up``) that
    added to it, until a load replaces the state (the count is then not the one the last step left)."""
    key = id(opt)
    if count is None:
        return None
    if _s.bias.get(key) and count != _s.count_after.get(key):
        _s.bias[key] = 0
    return count - _s.bias.get(key, 0)


def _before_step(opt, args, kwargs) -> None:
    if _warm_up(opt, args, kwargs):
        _s.warming.add(id(opt))  # no step of training: no point, no record, no digest taken
        return
    done = _numbered(opt, _optimizer_step(opt))
    if done is None:
        done = _s.step_of.get(id(opt), 0)
    if _rank() == 0 and _s.run_dir:
        # What the diagnosis compares after a resume: the state the step starts from (after a load,
        # the loaded one) against the golden run's before the same step (after its save). A save
        # no patch recognises (a native writer) still changes the checkpoint folders; digest_every
        # takes the whole state, RNG included, so a divergence narrows for any trainer.
        if _folders_changed() or (_s.digest_every and done % _s.digest_every == 0):
            _s.pre_digest = True
        if _s.pre_digest:
            _s.pre = {**_rng_digests(), **{f"pre_{k}": v for k, v in digests(opt).items()}}
            _s.pre_digest = False
    if "step.begin" in _s.step_points:
        _point("step.begin", step=done + 1)


def _folders_changed() -> bool:
    """Whether an entry of a watched folder, or of a folder in it, appeared, went or changed since
    the last step: a save happened, whoever wrote it. A few stat calls a step."""
    sig = []
    for d in _s.dirs:
        try:
            with os.scandir(d) as it:
                for e in it:
                    st = e.stat(follow_symlinks=False)
                    sig.append((e.path, st.st_mtime_ns, st.st_size))
        except OSError:
            sig.append((d, None, None))
    sig = tuple(sorted(sig))
    changed, _s.folders = _s.folders is not None and sig != _s.folders, sig
    return changed


def _after_step(opt, args, kwargs) -> None:
    count = _optimizer_step(opt)
    if id(opt) in _s.warming:
        _s.warming.discard(id(opt))
        if count is not None:
            _s.bias[id(opt)] = _s.bias.get(id(opt), 0) + 1
            _s.count_after[id(opt)] = count
        return
    if opt not in _s.optimizers:
        _s.optimizers.append(opt)
    step = None if count is None else count - _s.bias.get(id(opt), 0)
    _s.count_after[id(opt)] = count
    if step is None:
        step = _s.step_of.get(id(opt), 0) + 1
    _s.step_of[id(opt)] = step
    if _rank() == 0 and _s.run_dir:
        rec = {"step": step, "attempt": _s.attempt, "t": time.time(), "loss_hex": ",".join(_s.losses),
               "lr_hex": float(opt.param_groups[0]["lr"]).hex()}
        if _s.samples:
            rec["samples"] = _s.samples
        if _s.digest_every and step % _s.digest_every == 0:
            rec.update(digests(opt))
        rec.update(_s.pre)
        rec.update(_s.extra)
        _append("trajectory.jsonl", rec)
        _s.last = {"step": step, "optimizer": opt}
    _s.losses, _s.samples, _s.extra, _s.pre, _s.backwards = [], [], {}, {}, 0
    if "step.end" in _s.step_points:
        _point("step.end", step=step)


def _after_backward(tensors) -> None:
    _s.backwards += 1
    if _s.run_dir and _rank() == 0:  # only rank 0 records
        t = tensors[0] if isinstance(tensors, (tuple, list)) and tensors else tensors
        try:
            if t.numel() == 1:
                _s.losses.append(float(t.item()).hex())  # exact for any float dtype
        except (AttributeError, RuntimeError):
            pass
    if _s.batch is not None:
        _s.samples.append(_s.batch)
        _s.batch = None
    if "microstep.end" in _s.step_points:
        _point("microstep.end", step=sum(_s.step_of.values()) + 1 if len(_s.step_of) <= 1 else None,
           micro=len(_s.losses))


def digests(opt) -> dict[str, str]:
    """SHA-256 of this process's parameters and optimizer state, in the optimizer's order: the
    local shards where the model is sharded. The tensors are hashed as one buffer each (a copy into
    one byte tensor costs less than a hash update per small tensor)."""
    import torch

    params, state, tags = [], [], []
    for group in opt.param_groups:
        for p in group["params"]:
            params.append(_flat_bytes(p))
            for key in sorted(opt.state.get(p, {})):
                value = opt.state[p][key]
                tags.append(key)
                if hasattr(value, "detach"):
                    state.append(_flat_bytes(value))
                else:
                    tags.append(repr(value))
    model = hashlib.sha256(torch.cat(params).numpy() if params else b"")
    optimizer = hashlib.sha256("\0".join(tags).encode())
    if state:
        optimizer.update(torch.cat(state).numpy())
    return {"model_digest": model.hexdigest()[:16], "optimizer_digest": optimizer.hexdigest()[:16]}


def _flat_bytes(t):
    import torch

    t = t.detach()
    if hasattr(t, "to_local"):  # a DTensor: this rank's shard
        t = t.to_local()
    return t.cpu().reshape(-1).contiguous().view(torch.uint8)


def _rng_digests() -> dict[str, str]:
    """The random streams a trainer draws from on the CPU: torch's, Python's and NumPy's (if imported)."""
    import random

    import torch

    out = {"pre_rng": hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()[:16],
           "pre_python_rng": hashlib.sha256(repr(random.getstate()).encode()).hexdigest()[:16]}
    np = sys.modules.get("numpy")
    if np is not None:
        out["pre_numpy_rng"] = hashlib.sha256(repr(np.random.get_state()).encode()).hexdigest()[:16]
    return out


def _staged() -> None:
    """A save starts: the state before the next step is digested (what a resume from it must restore)."""
    _s.pre_digest = True


def _append(name: str, rec: dict) -> None:
    """One JSON line, in one write(2) on a descriptor kept open (O_APPEND: a line a killed process
    wrote is whole, and the lines of several processes do not mix)."""
    key = (name, os.getpid())
    fd = _s.logs.get(key)
    if fd is None:  # the layer's own records are never reported, whatever folder is watched
        fd = _s.logs[key] = _orig["os.open"](os.path.join(_s.run_dir, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                                             0o644)
    _orig["os.write"](fd, (json.dumps(rec) + "\n").encode())


def _at_exit() -> None:
    if _s.last is not None and _rank() == 0:
        _append("events.jsonl", {"event": "exit", "step": _s.last["step"], **digests(_s.last["optimizer"])})


def record(**fields) -> None:
    """Add fields to the current step's record (``step=`` numbers the step where the optimizer
    cannot); a no-op outside the harness."""
    if _s.installed:
        _s.extra.update(fields)
