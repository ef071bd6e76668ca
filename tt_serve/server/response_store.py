"""Stored responses (the Responses API's ``store``): what ``previous_response_id`` continues from
and what ``GET /v1/responses/{id}`` returns.

An entry keeps the response object as it was sent, the exact token ids of its prompt and output
(``continuation.py``), the conversation as chat messages (for a continuation whose instructions
or tools changed, which the template must render whole) and what the prompt was rendered with.
The store is bounded by entries and bytes, the least recently used going first. With a folder
(the disk tier's, ``--disk-cache-dir``), each entry is also one JSON file written atomically, and
a restarted server reads them back, newest first, within the same bounds.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_ID_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


@dataclass(frozen=True)
class StoredResponse:
    id: str
    response: dict[str, Any]  # the response object as GET returns it
    prompt_ids: array[int]
    output_ids: array[int]
    messages: list[dict[str, Any]]  # the conversation, this response's answer included
    context: dict[str, Any]  # what the prompt was rendered with: instructions, tools, thinking

    @functools.cached_property
    def nbytes(self) -> int:
        ids = (len(self.prompt_ids) + len(self.output_ids)) * self.prompt_ids.itemsize
        return ids + len(json.dumps([self.response, self.messages, self.context]))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "response": self.response,
            "prompt_ids": self.prompt_ids.tolist(),
            "output_ids": self.output_ids.tolist(),
            "messages": self.messages,
            "context": self.context,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StoredResponse:
        return cls(
            str(d["id"]),
            dict(d["response"]),
            array("i", d["prompt_ids"]),
            array("i", d["output_ids"]),
            list(d["messages"]),
            dict(d["context"]),
        )


class ResponseStore:
    """Thread-safe LRU of stored responses; ``max_entries`` 0 stores nothing."""

    def __init__(self, max_entries: int, max_bytes: int, directory: str | Path | None = None):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._dir = Path(directory) if directory is not None and max_entries > 0 else None
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evicted = 0
        if self._dir is not None:
            self._dir.mkdir(parents=True, exist_ok=True)
            self._load()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def put(self, entry: StoredResponse) -> bool:
        """Keep ``entry`` (evicting the least recently used past the bounds); False when it
        alone is over the byte bound or the store is off."""
        size = entry.nbytes
        if not self.enabled or size > self.max_bytes:
            return False
        with self._lock:
            self._drop(entry.id)
            self._entries[entry.id] = entry
            self._bytes += size
            gone = self._trim()
        self._write(entry)
        for old in gone:
            self._unlink(old)
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None:
                self._entries.move_to_end(response_id)
            return entry

    def delete(self, response_id: str) -> bool:
        with self._lock:
            found = self._drop(response_id)
        if found:
            self._unlink(response_id)
        return found

    # -- inside the lock ---------------------------------------------------------------------

    def _drop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry.nbytes
        return True

    def _trim(self) -> list[str]:
        gone = []
        while self._entries and (
            len(self._entries) > self.max_entries or self._bytes > self.max_bytes
        ):
            rid, entry = self._entries.popitem(last=False)
            self._bytes -= entry.nbytes
            self.evicted += 1
            gone.append(rid)
        return gone

    # -- the folder --------------------------------------------------------------------------

    def _path(self, response_id: str) -> Path | None:
        if self._dir is None or not response_id or not set(response_id) <= _ID_OK:
            return None
        return self._dir / f"{response_id}.json"

    def _write(self, entry: StoredResponse) -> None:
        path = self._path(entry.id)
        if path is None:
            return
        tmp = path.with_suffix(".tmp")
        try:
            with open(tmp, "w") as f:
                json.dump(entry.to_json(), f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:  # the entry stays in memory; a restart loses it
            log.warning("could not write stored response %s: %s", entry.id, exc)
            tmp.unlink(missing_ok=True)

    def _unlink(self, response_id: str) -> None:
        path = self._path(response_id)
        if path is not None:
            path.unlink(missing_ok=True)

    def _load(self) -> None:
        assert self._dir is not None
        files = sorted(self._dir.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        kept: list[StoredResponse] = []
        size = 0
        for path in files:
            try:
                entry = StoredResponse.from_json(json.loads(path.read_text()))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("dropping unreadable stored response %s: %s", path.name, exc)
                path.unlink(missing_ok=True)
                continue
            if len(kept) >= self.max_entries or size + entry.nbytes > self.max_bytes:
                path.unlink(missing_ok=True)
                continue
            kept.append(entry)
            size += entry.nbytes
        for entry in reversed(kept):  # oldest first: the newest is the most recently used
            self._entries[entry.id] = entry
        self._bytes = size
        for tmp in self._dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        if kept:
            log.info("read %d stored response(s) back from %s", len(kept), self._dir)
