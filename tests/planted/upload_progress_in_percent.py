"""Planted bug: the uploader reports its progress through an object in percent under a name that
means a fraction, so a fault aimed at half of an upload fires at its first tenth. This module is
both the trainer and, through ``UPLOADER_MODULE``, its uploader process."""
from reference_trainer import remote


class _PercentReader(remote._ProgressReader):
    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self._read += len(data)
        while self._next_tenth <= 10 and self._read * 10 >= self._size * self._next_tenth:
            remote.probe.point("upload.write", name=self._name, file=self._path.name, path=str(self._path),
                               bytes=self._read, fraction=self._next_tenth * 10)
            self._next_tenth += 1
        return data


remote._ProgressReader = _PercentReader
remote.UPLOADER_MODULE = "tests.planted.upload_progress_in_percent"

if __name__ == "__main__":
    from tests.planted import run_trainer_or_uploader

    run_trainer_or_uploader()
