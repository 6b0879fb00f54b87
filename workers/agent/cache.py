"""The binary cache: files named by their sha256, checked before they run.

The master puts binaries there (a local hard link, or an SFTP upload to a temporary name and
a rename); the agent runs only a file whose content hashes to its name.  A verification is
remembered by (device, inode, size, mtime_ns), so repeated jobs do not rehash; a file
rewritten in place with the same size within one filesystem timestamp tick would not be
noticed, which is why the master writes to a temporary name and renames.
"""
from __future__ import annotations

import hashlib
import os
import stat

from .protocol import CHECKSUM_MISMATCH, NOT_IN_CACHE, RequestError


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


class BinaryCache:
    def __init__(self, directory: str):
        self.dir = os.path.abspath(str(directory))
        os.makedirs(self.dir, exist_ok=True)
        self._verified: dict[str, tuple[int, int, int, int]] = {}  # sha256 -> stat key

    def verify(self, sha: str) -> str:
        """Path of the verified binary ``sha`` (made executable if it came without the x
        bit, e.g. over SFTP); RequestError not_in_cache or checksum_mismatch (the file is
        then removed)."""
        path = os.path.join(self.dir, sha)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._verified.pop(sha, None)
            raise RequestError("binary %s not in cache" % sha, NOT_IN_CACHE) from None
        if not stat.S_ISREG(st.st_mode):
            raise RequestError("binary %s in cache is not a regular file" % sha, NOT_IN_CACHE)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if self._verified.get(sha) != key:
            self._verified.pop(sha, None)
            actual = sha256_file(path)
            if actual != sha:
                try:
                    os.unlink(path)
                    what = "removed from cache"
                except OSError as e:
                    what = "could not remove it: %s" % e
                raise RequestError("checksum mismatch for binary %s: content hashes to %s; %s"
                                   % (sha, actual, what), CHECKSUM_MISMATCH)
            if not os.access(path, os.X_OK):
                os.chmod(path, (st.st_mode & 0o7777) | 0o500)
                st = os.stat(path)
                key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            self._verified[sha] = key
        return path

    def has(self, sha: str) -> bool:
        try:
            self.verify(sha)
        except RequestError:
            return False
        return True
