"""The automatic probe layer's patches of the standard library's file operations (``open``, fsync,
renames, removals, ``shutil.rmtree`` and ``copyfile``): the file points of a watched directory,
a write cut at each tenth of its planned size (``auto.py`` says what each point means)."""

from __future__ import annotations

import builtins
import errno
import io
import os
import shutil
import stat
import sys

from ckpt_chaos import probe
from ckpt_chaos.probe import follow
from ckpt_chaos.probe.auto_state import CHUNK, TENTHS, WHOLE, _arm, _orig, _point, _Quiet, _quiet, _s, _watched


def _kind(rel: str) -> tuple[str, str]:
    """The write and done points of a file: DCP's shard files are the checkpoint's shards."""
    if rel.endswith(".distcp"):
        return "ckpt.shard.write", "ckpt.shard.done"
    return "file.write", "file.done"


# ---- files -------------------------------------------------------------------------------------------

class _Watched(io.RawIOBase):
    """A file being written in a watched directory: writes go straight to the file (no buffer of
    ours), cut at each tenth of the planned size, and reported there.

    Native code that writes through the file's descriptor (numpy's ``tofile``, which flushes the
    Python file and ``fwrite``s to a dup of ``fileno()``) passes no byte through ``write``: the points
    report the bytes the descriptor shows (the file's size, less what an append found there) where
    that is more than Python wrote, with ``native`` (and ``python_bytes``, Python's own). A native
    write that failed raises past ``close``, which cannot tell; a file with native bytes closed with
    fewer bytes than the same file in the golden run (``follow.Follower.match``) is reported ``short``."""

    def __init__(self, raw, rel: str, via: str, whole_from: int | None = WHOLE):
        super().__init__()
        self._raw, self.rel, self.via = raw, rel, via
        self.opened = rel  # the name it was opened under; ``rel`` follows a rename while it is open
        # a first write of at least this many bytes is the trainer's one call that wrote the file;
        # None: no write tells (text comes in chunks of any size that TextIOWrapper gathers)
        self._whole_from = whole_from
        self.written = 0
        self.failed = None  # the error a write met: the file is torn, whoever closes it
        # its size and names in the golden run, where the file it is there is known (a temporary name
        # followed to the one it was renamed to); ``golden``: that file's size, where it was found
        rank = probe._rank()
        self.planned, self.aliases, same = _s.follow.match("file", 0 if rank is None else rank, rel, _s.attempt)
        self.golden = self.planned if same else None
        self._base = self._size() if "a" in getattr(raw, "mode", "") else 0  # an append counts from here
        self._write_point, self._done_point = _kind(rel)
        self._next = self._boundary(0)
        _s.fds[raw.fileno()] = rel
        _s.streams[raw.fileno()] = self  # an os.write on its descriptor is counted here too

    def _boundary(self, done: int) -> int:
        """The byte count of the next report: the next tenth of the plan (rounded up, so a report at
        tenth k has at least k/10 of the file), or the next MiB."""
        if self.planned:
            k = done * TENTHS // self.planned + 1
            return max(done + 1, -(-k * self.planned // TENTHS))
        return (done // CHUNK + 1) * CHUNK

    def writable(self):
        return True

    def readable(self):
        return False

    def seekable(self):
        return self._raw.seekable()

    def seek(self, offset, whence=io.SEEK_SET):
        return self._raw.seek(offset, whence)

    def tell(self):
        return self._raw.tell()

    def fileno(self):
        return self._raw.fileno()

    def flush(self):
        self._raw.flush()

    def _size(self) -> int | None:
        try:
            return os.fstat(self._raw.fileno()).st_size
        except (OSError, ValueError):
            return None

    def _info(self, size: int | None) -> dict:
        """A point's info: ``bytes``, what Python wrote, or where more, the bytes on disk (``size``,
        the descriptor's) with ``native``."""
        info = {"path": self.rel, "bytes": self.written, "via": self.via,
                **({"aliases": self.aliases} if self.aliases else {}),
                **({"opened": self.opened} if self.opened != self.rel else {})}
        if size is not None and size - self._base > self.written:
            info.update(bytes=size - self._base, native=True, python_bytes=self.written)
        return info

    def write(self, b, partial: bool = False) -> int:
        """Write all of ``b``, cut at each report. ``partial`` (an ``os.write``): a write(2) that failed
        after bytes of this call went out returns their count, as write(2) does, and the caller's next
        write meets the error."""
        view = memoryview(b).cast("B")
        total, pos = len(view), 0
        if self.planned is None and self.written == 0 and self._whole_from and total >= self._whole_from:
            # A file written in one call (a buffer serialized first, as Lightning does) is that call:
            # its tenths are the file's, whatever the file's name (a random temporary one) was in the plan.
            self.planned = total
            self._next = self._boundary(0)
        while pos < total:
            end = pos + min(total - pos, self._next - self.written)
            while pos < end:  # a write(2) may take part of it (a disk filling up): the rest, or its error
                try:
                    n = self._raw.write(view[pos:end])
                    if not n:
                        raise OSError(errno.EIO, f"a write of {end - pos} bytes wrote {n}")
                except OSError as e:
                    if partial and pos:
                        return pos
                    self.failed = e.strerror or repr(e)
                    raise
                pos += n
                self.written += n
            if self.written >= self._next:
                self._raw.flush()
                info = self._info(self._size())  # one fstat a tenth: bytes a native writer added count
                if self.planned:
                    info["fraction"] = round(min(1.0, info["bytes"] / self.planned), 4)
                _point(self._write_point, **info)
                self._next = self._boundary(self.written)
        return total

    def close(self):
        if self.closed:
            return
        size = None
        try:
            try:
                super().close()  # flushes the file
            finally:
                size = self._size()  # what native code wrote through the descriptor is on it
                self._forget()
                self._raw.close()
        except OSError as e:  # the flush or close(2) failed: Python saw it
            self.failed = self.failed or e.strerror or repr(e)
            self._done(size)
            raise
        self._done(size)

    def _forget(self) -> None:
        try:
            fd = self._raw.fileno()
        except (OSError, ValueError):
            return
        _s.fds.pop(fd, None)
        if _s.streams.get(fd) is self:
            del _s.streams[fd]

    def _done(self, size: int | None) -> None:
        info = self._info(size)
        if self.failed:
            info["failed"] = self.failed
        if self.golden and info.get("native") and info["bytes"] < self.golden:
            # fewer bytes than the same file in the golden run, some written where Python does not see:
            # a native write failed unseen. Every write Python made returned, or raised (``failed``): a
            # file it wrote alone is as long as the trainer made it (DCP's .metadata holds its path)
            info["short"] = True
        _point(self._done_point, **info)


class _Descriptor(_Watched):
    """A watched file ``os.open`` opened to write: its ``os.write`` calls are cut and reported as a
    Python file's writes are (``via = "os.write"``), its ``os.close`` is its ``file.done``. Handed to
    ``open``/``os.fdopen`` (``tempfile.mkstemp`` then ``fdopen``), it goes on as that file's stream."""

    def __init__(self, fd: int, rel: str, flags: int, st: os.stat_result):
        # a first os.write tells nothing of the file's size (a loop of chunks, or one call): no guess
        super().__init__(_orig["io.open"](fd, "wb", 0, closefd=False), rel, "os.write", whole_from=None)
        self.fd, self.identity, self.adopted = fd, (st.st_dev, st.st_ino), False
        # bytes there before, which writes in place or at the end do not add to the file's size
        self._base = 0 if flags & os.O_TRUNC else st.st_size

    def same_file(self) -> bool:
        """Whether the descriptor still is this file (closed by other means, its number reused: no)."""
        try:
            st = os.fstat(self.fd)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.identity

    def adopt(self, raw) -> None:
        """``open(fd)`` made a Python file of the descriptor: its closing closes the descriptor."""
        self._raw.close()  # closefd=False: the descriptor stays open
        self._raw, self.adopted, self.via = raw, True, "open"

    def close_fd(self) -> None:
        """``os.close`` of the descriptor: closed, then reported done."""
        size = self._size()
        self._forget()
        io.RawIOBase.close(self)
        self._raw.close()  # closefd=False: only the wrapper
        try:
            _orig["os.close"](self.fd)
        except OSError as e:
            self.failed = self.failed or e.strerror or repr(e)
            self._done(size)
            raise
        self._done(size)

    def __del__(self):
        if self.adopted:  # a Python file's stream now: collected unclosed, it is closed as one
            super().__del__()


def _os_open(path, flags, mode=0o777, *, dir_fd=None):
    fd = _orig["os.open"](path, flags, mode, dir_fd=dir_fd)
    if dir_fd is not None or _quiet():
        return fd
    rel = _watched(path)
    if rel is None:
        return fd
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # a folder opened to fsync it
        return fd
    if flags & (os.O_WRONLY | os.O_RDWR):
        _Descriptor(fd, rel, flags, st)
    else:
        _point("file.read", path=rel, size=st.st_size)
    return fd


def _os_write(fd, data):
    stream = _s.streams.get(fd)
    if stream is None or (isinstance(stream, _Descriptor) and not stream.same_file()):
        return _orig["os.write"](fd, data)
    return stream.write(data, partial=True)


def _os_close(fd):
    stream = _s.streams.get(fd)
    if stream is None:
        return _orig["os.close"](fd)
    if isinstance(stream, _Descriptor) and not stream.adopted and stream.same_file():
        return stream.close_fd()
    # a Python file's descriptor closed under it, or a stale entry: forget it
    stream._forget()
    return _orig["os.close"](fd)


def native_buffer_size(raw) -> int:
    """The buffer ``io.open`` gives a file opened with ``buffering=-1``: the file system's block
    size (``st_blksize``, which FileIO keeps as ``_blksize``), or ``io.DEFAULT_BUFFER_SIZE``."""
    size = getattr(raw, "_blksize", 0)
    return size if size > 1 else io.DEFAULT_BUFFER_SIZE


def _open(file, mode="r", buffering=-1, encoding=None, errors=None, newline=None, closefd=True, opener=None):
    # Only files opened to write and not to read: a read-write file keeps its own buffering.
    writes = isinstance(mode, str) and any(c in mode for c in "wax") and "+" not in mode
    rel = _watched(file) if writes and not _quiet() else None
    adopted = _s.streams.get(file) if writes and isinstance(file, int) else None
    if isinstance(adopted, _Descriptor) and not adopted.adopted and adopted.same_file():
        # a descriptor os.open (tempfile.mkstemp) opened, made a Python file (os.fdopen): the same count
        adopted.adopt(_orig["io.open"](file, mode if "b" in mode else mode + "b", 0, None, None, None, closefd))
        return _buffered(adopted, mode, buffering, encoding, errors, newline)
    if rel is None:
        f = _orig["io.open"](file, mode, buffering, encoding, errors, newline, closefd, opener)
        if not writes and not _quiet() and isinstance(mode, str) and "+" not in mode:
            _read(file, f)
        return f
    binary = "b" in mode
    raw = _orig["io.open"](file, mode if binary else mode + "b", 0, None, None, None, closefd, opener)
    if binary and buffering == 0:
        return _Watched(raw, rel, "open")
    size = native_buffer_size(raw) if buffering in (-1, 1) else buffering
    # a first write no longer than the buffer may be its first fill of many small writes
    stream = _Watched(raw, rel, "open", max(WHOLE, size + 1) if binary else None)
    return _buffered(stream, mode, buffering, encoding, errors, newline)


def _buffered(stream: _Watched, mode: str, buffering, encoding, errors, newline):
    """The file ``io.open`` would have given the trainer, writing through ``stream``."""
    binary = "b" in mode
    if binary and buffering == 0:
        return stream
    # The buffer io.open would have given it, so the trainer's write(2)s come when they would
    # without the harness (a failing write surfaces in the same statement: json.dump, not flush).
    size = native_buffer_size(stream._raw) if buffering in (-1, 1) else buffering
    buffered = io.BufferedWriter(stream, buffer_size=size)
    if binary:
        return buffered
    return io.TextIOWrapper(buffered, encoding=encoding, errors=errors, newline=newline,
                            line_buffering=buffering == 1)


def _read(file, f) -> None:
    """A checkpoint file opened to be read (``json.load``, ``pickle``, ``np.load``): what a resume
    read, whatever library it read with, where no load of a known framework says so."""
    rel = _watched(file)
    if rel is None:
        return
    try:
        size = os.fstat(f.fileno()).st_size
    except (OSError, ValueError, AttributeError):
        size = None
    _point("file.read", path=rel, size=size)


def _path_of_fd(fd) -> str | None:
    if not isinstance(fd, int):
        fd = fd.fileno() if hasattr(fd, "fileno") else None
    if fd is None:
        return None
    rel = _s.fds.get(fd)
    if rel is not None:
        return rel
    try:
        return _watched(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return None


def _fsync(fd):
    rel = None if _quiet() else _path_of_fd(fd)
    _orig["fsync"](fd)
    if rel is not None:
        _point("file.fsync", path=rel, call="fsync")


def _fdatasync(fd):
    rel = None if _quiet() else _path_of_fd(fd)
    _orig["fdatasync"](fd)
    if rel is not None:
        _point("file.fsync", path=rel, call="fdatasync")


def _moved_open(src: str, dst: str) -> None:
    """Files still open under ``src`` (or in the folder ``src``) now have names under ``dst``: a writer
    that renames its temporary file before closing it. Their later points carry the name the file has,
    and its ``file.done`` the one it was opened under (``opened``), as faultfs reports such a file."""
    for fd, stream in list(_s.streams.items()):
        to = follow.moved(stream.rel, src, dst)
        if to is not None:
            stream.rel = to
            if _s.fds.get(fd) is not None:
                _s.fds[fd] = to


def _renamer(which: str):
    def rename(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        rel_src, rel = (None, None) if _quiet() or src_dir_fd or dst_dir_fd else (_watched(src), _watched(dst))
        _orig[which](src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        if rel is None and rel_src is None:
            return
        if rel is not None and rel_src is not None:
            _moved_open(rel_src, rel)
        if rel is not None and os.path.basename(rel) == ".metadata":
            _point("ckpt.metadata", path=rel)
        _point("file.rename", path=rel or os.fsdecode(dst), src=rel_src or os.fsdecode(src), call=which)

    rename.__name__ = which
    return rename


def _remover(which: str):
    def remove(path, *, dir_fd=None):
        rel = None if _quiet() or dir_fd is not None else _watched(path)
        _orig[which](path, dir_fd=dir_fd)
        if rel is not None:
            _point("file.remove", path=rel, call=which)

    remove.__name__ = which
    return remove


def _rmtree(path, *args, **kwargs):
    rel = None if _quiet() else _watched(path)
    if rel is None:
        return _orig["rmtree"](path, *args, **kwargs)
    _point("file.rmtree", path=rel, stage="begin")
    with _Quiet():
        _orig["rmtree"](path, *args, **kwargs)
    _point("file.rmtree", path=rel, stage="end")


def _copyfile(src, dst, *, follow_symlinks=True):
    rel = None if _quiet() else _watched(dst)
    if rel is None:
        return _orig["copyfile"](src, dst, follow_symlinks=follow_symlinks)
    # In chunks through a watched stream (not the kernel's copy_file_range), so a fault can land mid-copy.
    with _Quiet():
        fsrc = _orig["io.open"](src, "rb")
        fdst = _Watched(_orig["io.open"](dst, "wb", 0), rel, "copy")
    with fsrc, fdst:
        while chunk := fsrc.read(CHUNK):
            fdst.write(chunk)
    _point("file.copy", path=rel, src=_watched(src) or os.fsdecode(src), bytes=fdst.written)
    return dst


def _missing_read(exc: BaseException | None) -> tuple[str, str] | None:
    """The checkpoint file a process died failing to find, from its uncaught exception (or one it
    was raised from): an ENOENT naming one file in a watched folder whose own folder exists. A create
    there cannot fail so (O_CREAT makes it), nor can a rename's source be read (``filename2``): what is
    left is a stat, an open or a load of a file the checkpoint lacks, done by native code or a check
    before any open the layer wraps, which is the resume trying that checkpoint."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno == errno.ENOENT and exc.filename is not None \
                and getattr(exc, "filename2", None) is None:
            rel = _watched(exc.filename)
            if rel is not None and os.path.isdir(os.path.dirname(os.path.abspath(os.fsdecode(exc.filename)))):
                return rel, f"{type(exc).__name__}: {exc.strerror}"
        exc = exc.__cause__ or exc.__context__
    return None


def _excepthook(exc_type, exc, tb):
    try:
        found = _missing_read(exc)
        if found is not None:
            _point("file.read", path=found[0], size=None, failed=found[1])
    except Exception:  # the trainer's own error is what must be printed
        pass
    _orig["excepthook"](exc_type, exc, tb)


def _patch_files() -> None:
    sys.excepthook = _excepthook
    builtins.open = io.open = _open
    os.open, os.write, os.close = _os_open, _os_write, _os_close
    _arm("os.write")
    os.fsync = _fsync
    if _orig["fdatasync"] is not None:
        os.fdatasync = _fdatasync
    os.rename, os.replace = _renamer("rename"), _renamer("replace")
    os.remove, os.unlink = _remover("remove"), _remover("unlink")
    shutil.rmtree = _rmtree
    shutil.copyfile = _copyfile  # shutil.copy, copy2 and move (across file systems) call it
    _arm("files")
