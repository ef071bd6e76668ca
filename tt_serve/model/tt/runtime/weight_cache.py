"""The converted-weight cache: a start's device weights as ttnn tensor files, one folder per key.

The key (:func:`key_parts`) names everything the files depend on: this format's version, the
model's spec, the precision profile, the MoE dispatch path, the mesh shape and the table's
split of every weight over it (``layout/table.py``), and the checkpoint's content: the sha256 of
every file its tensors are read from (:func:`checkpoint_digest`), so a retrained checkpoint of
the same shapes is a miss. A file is hashed once: the digest is kept under ``checkpoints/`` in
the cache folder with the file's identity (size, mtime, ctime, inode), and a restart only stats
the file.

An entry is written into a temporary sibling folder (``<key>.tmp-<pid>-<random>``), every file
and then the manifest fsynced, and renamed to ``<key>`` in one step: a reader (another replica
starting at the same time, or the next start after a writer was killed) sees a complete entry or
none. When two writers race, the second rename fails on the first one's folder and the second
discards its own. A killed writer's temporary folder is never read, and is removed by a later
write once it is a day old.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tt_serve.model.precision import Precision
from tt_serve.model.spec import ModelSpec
from tt_serve.model.tt.layout.experts import MoeDispatch
from tt_serve.model.tt.layout.parallel import TensorParallel
from tt_serve.model.tt.layout.table import slots

# 3: stacked expert groups (tt/runtime/moe.py); 4: the sparse expert layout; 5: mesh entries
# (per-chip shards), keyed on the checkpoint's content, written by rename
FORMAT_VERSION = 5
CACHE_ENV = "TT_SERVE_TTNN_WEIGHT_CACHE"
MANIFEST = "manifest.json"
TEMP_MARK = ".tmp-"
# A temporary folder this old belongs to a dead writer: a live one adds a file per tensor.
STALE_TEMP_S = 24 * 3600


def default_cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else Path.home() / ".cache" / "tt-serve" / "ttnn-weights"


def _short(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def file_digest(path: Path, memo_dir: Path) -> str:
    """The sha256 of a file's bytes, kept in ``memo_dir`` with the file's identity (resolved
    path, size, mtime, ctime, inode): while the identity holds it is not read again; a rewrite
    or a replacement (new mtime or ctime, or a new inode) hashes it again."""

    def identity() -> dict[str, Any]:
        st = path.stat()
        return {
            "path": str(path.resolve()),
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns,
            "inode": st.st_ino,
            "dev": st.st_dev,
        }

    ident = identity()
    memo = memo_dir / f"{_short(ident['path'])}.json"
    try:
        known = json.loads(memo.read_text())
        if known.get("file") == ident:
            return str(known["sha256"])
    except (OSError, ValueError):
        pass
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if identity() == ident:  # not changed while it was read: the digest is the file's
        tmp = memo_dir / f"{memo.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            memo_dir.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"file": ident, "sha256": digest}))
            os.replace(tmp, memo)
        except OSError:
            tmp.unlink(missing_ok=True)  # a read-only cache: hashed again next time
    return digest


def checkpoint_digest(folder: Path, memo_dir: Path) -> str:
    """The content of the checkpoint in ``folder``: the digest of every file its tensors are read
    from (and its shard index), by name."""
    from tt_serve.model.weights import checkpoint_files

    h = hashlib.sha256()
    for f in checkpoint_files(folder):
        h.update(f"{f.relative_to(folder)}={file_digest(f, memo_dir)};".encode())
    return h.hexdigest()[:32]


def key_parts(
    spec: ModelSpec,
    precision: Precision,
    moe_dispatch: MoeDispatch,
    tp: TensorParallel,
    content: str,
) -> dict[str, str]:
    """What a cache entry's files depend on (its folder name is their digest)."""
    split = [
        f"{s.name}:{s.weight.placement.value}:{s.weight.layout}:{s.weight.dtype(precision)}"
        for s in slots(spec, moe_dispatch)
    ]
    return {
        "format": str(FORMAT_VERSION),
        "spec": _short(repr(spec)),
        "precision": precision.key(),
        "moe": moe_dispatch if spec.num_experts else "-",
        "mesh": f"{tp.rows}x{tp.cols}",
        "split": _short("\n".join(split)),
        "checkpoint": content,
    }


@dataclass(frozen=True)
class WeightCache:
    """A converted-weight cache folder and the checkpoint folder whose content keys it."""

    root: Path
    checkpoint: Path

    def entry(
        self, spec: ModelSpec, precision: Precision, moe_dispatch: MoeDispatch, tp: TensorParallel
    ) -> CacheEntry:
        content = checkpoint_digest(self.checkpoint, self.root / "checkpoints")
        parts = key_parts(spec, precision, moe_dispatch, tp, content)
        return CacheEntry(self.root / _short(json.dumps(parts, sort_keys=True)), parts)


@dataclass(frozen=True)
class CacheEntry:
    """One key's folder: ``{i}.tensorbin`` per weight and a manifest naming them."""

    folder: Path
    parts: dict[str, str]

    @property
    def key(self) -> str:
        return self.folder.name

    def file(self, i: int) -> Path:
        return self.folder / f"{i}.tensorbin"

    def names(self) -> list[str] | None:
        """The weight names of a complete entry, file ``i`` holding name ``i``; None when there
        is no entry, or its manifest is not this key's or does not account for every file."""
        try:
            meta = json.loads((self.folder / MANIFEST).read_text())
        except (OSError, ValueError):
            return None
        names = meta.get("names")
        if meta.get("key") != self.key or not isinstance(names, list):
            return None
        if meta.get("count") != len(names) or not all(
            self.file(i).is_file() for i in range(len(names))
        ):
            return None
        return [str(n) for n in names]

    def write(self, names: list[str], dump: Callable[[Path, str], None]) -> bool:
        """Publish an entry: ``dump(path, name)`` writes each weight into a temporary sibling
        folder, the files and the manifest are fsynced, and one rename gives it this key's name.
        False: another writer published this key first (its files are the same; this writer's
        are discarded). Any failure removes the temporary folder and is raised."""
        root = self.folder.parent
        root.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(root)
        tmp = root / f"{self.key}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            for i, n in enumerate(names):
                dump(tmp / f"{i}.tensorbin", n)
                _fsync(tmp / f"{i}.tensorbin")
            meta = {"key": self.key, "parts": self.parts, "count": len(names), "names": names}
            with (tmp / MANIFEST).open("w") as f:
                json.dump(meta, f)
                f.flush()
                os.fsync(f.fileno())
            _fsync(tmp)
            if self.folder.exists() and self.names() is None:
                _discard(self.folder)  # a damaged entry of this key: never read, replaced
            try:
                os.rename(tmp, self.folder)
            except OSError:
                if self.names() is None:
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
                return False
            _fsync(root)
            return True
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        if not path.is_dir():  # some file systems refuse to sync a directory
            raise
    finally:
        os.close(fd)


def _discard(folder: Path) -> None:
    """Remove ``folder``, first renamed to a temporary name so no reader meets it half gone."""
    aside = folder.with_name(f"{folder.name}{TEMP_MARK}discard-{secrets.token_hex(4)}")
    try:
        os.rename(folder, aside)
    except FileNotFoundError:
        return  # another writer discarded it first
    shutil.rmtree(aside, ignore_errors=True)


def _remove_stale_temps(root: Path) -> None:
    now = time.time()
    for p in root.glob(f"*{TEMP_MARK}*"):
        try:
            if p.is_dir() and now - p.stat().st_mtime > STALE_TEMP_S:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            continue  # another writer removed it first
