"""ResidentSlots: which state slots may have a fed row in the next submitted step.

The one tracker of the pipelined-decode rule in ``model/interface.py`` (fed rows), used by every
backend: a step leaves the greedy ids of some slots on the device (``launched``); the next step
may feed exactly those, unless ``copy_states`` touched the slot in between (``forget``).
"""

from __future__ import annotations

from collections.abc import Iterable

from tt_serve.model.interface import CopyKind, StateCopy, StepRow


class ResidentSlots:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._slots: frozenset[int] = frozenset()

    def check(self, rows: Iterable[StepRow]) -> int:
        """Raise ValueError for a fed row this backend cannot feed; return the fed-row count."""
        n = 0
        for row in rows:
            if not row.fed:
                continue
            if not self.enabled:
                raise ValueError(
                    f"fed row for seq {row.seq_id}, but this backend is not device-resident"
                )
            if row.state_slot not in self._slots:
                raise ValueError(
                    f"fed row for state slot {row.state_slot} (seq {row.seq_id}): the step "
                    "submitted before left no id for it on the device (or copy_states touched it)"
                )
            n += 1
        return n

    def launched(self, slots: frozenset[int]) -> frozenset[int]:
        """A step was submitted that leaves ids for ``slots``; returns what it may feed next."""
        self._slots = slots if self.enabled else frozenset()
        return self._slots

    def forget(self, ops: Iterable[StateCopy]) -> None:
        """State copies ran: slots they wrote no longer continue the sequence their id did."""
        self._slots = self._slots - {op.slot for op in ops if op.kind is not CopyKind.SAVE}
