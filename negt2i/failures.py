"""Why an image got no verdict: one failure enum, one exception base, used from a stage to the report.

Every image that cannot be judged ends as one ``Failure`` whose ``kind`` is a
``FailureKind``; the results line stores ``error_kind`` (the enum's value) and
``error`` (``"<kind>: <details>"``), and reports count error lines by kind, never
by message text. The same exception travels through the in-process pipeline, the
orchestrator (where ``code`` becomes the item's gRPC status) and ``negt2i submit``
(where the ``ItemError.kind`` enum maps back through the explicit table of
``negt2i.wire.adapter``).

Kinds:

- ``unreadable_image``: the image file / bytes could not be decoded;
- ``missing_metadata``: no prompt for the image (no ``metadata.jsonl``, unknown prompt id);
- ``invalid_metadata``: the prompt record is invalid;
- ``stage_error``: a stage failed, answered outside the contract (``rule`` names the
  contract rule it broke), or the judge could not use the perception (``stage == "judge"``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, Self


class FailureKind(StrEnum):
    """The failure vocabulary of results files (``error_kind``) and of ``ItemError.kind``."""

    UNREADABLE_IMAGE = "unreadable_image"
    MISSING_METADATA = "missing_metadata"
    INVALID_METADATA = "invalid_metadata"
    STAGE_ERROR = "stage_error"


FAILURE_KINDS: Final[tuple[str, ...]] = tuple(k.value for k in FailureKind)
"""Every kind's spelling, derived from the enum (the first word of an error line's ``error``)."""

OTHER_KIND: Final = "other"
"""How reports count an error line whose kind is not in the vocabulary (files written by other tools)."""


class Code(StrEnum):
    """gRPC status codes (``google.rpc.Code``), the one table: the member's value is the status name
    (``"UNAVAILABLE"``; what ``Failure.code`` and ``ClientError.code`` hold, and what results lines and
    messages show), ``number`` its wire number (``ItemError.code``, ``google.rpc.Status.code``)."""

    number: int

    def __new__(cls, name: str, number: int) -> Self:
        member = str.__new__(cls, name)
        member._value_ = name
        member.number = number
        return member

    OK = "OK", 0
    CANCELLED = "CANCELLED", 1
    UNKNOWN = "UNKNOWN", 2
    INVALID_ARGUMENT = "INVALID_ARGUMENT", 3
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED", 4
    NOT_FOUND = "NOT_FOUND", 5
    ALREADY_EXISTS = "ALREADY_EXISTS", 6
    PERMISSION_DENIED = "PERMISSION_DENIED", 7
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED", 8
    FAILED_PRECONDITION = "FAILED_PRECONDITION", 9
    ABORTED = "ABORTED", 10
    OUT_OF_RANGE = "OUT_OF_RANGE", 11
    UNIMPLEMENTED = "UNIMPLEMENTED", 12
    INTERNAL = "INTERNAL", 13
    UNAVAILABLE = "UNAVAILABLE", 14
    DATA_LOSS = "DATA_LOSS", 15
    UNAUTHENTICATED = "UNAUTHENTICATED", 16

    @classmethod
    def of(cls, number: int) -> Code:
        """The code of a wire number; ``UNKNOWN`` for a number outside ``google.rpc.Code``."""
        for member in cls:
            if member.number == number:
                return member
        return cls.UNKNOWN


class Failure(Exception):
    """One image gets no verdict.

    ``kind``: the ``FailureKind``; ``message``: the human-readable reason; ``stage``:
    the stage that failed (``detector`` ... ``depth``, ``judge``), if any; ``rule``:
    the contract rule a stage answer broke (``docs/stage-contract.md``), if any;
    ``field``: the offending request field, if any; ``code``: the gRPC status (``Code``)
    the orchestrator answers with (``INTERNAL`` unless said otherwise); ``reason``: the
    machine-readable reason of the rich error model (``negt2i.wire.errors.Reason``; derived
    from the other parts when empty).
    """

    def __init__(
        self,
        kind: FailureKind,
        message: str,
        *,
        stage: str = "",
        rule: str = "",
        field: str = "",
        code: Code | str = Code.INTERNAL,
        text: str | None = None,
        reason: str = "",
    ) -> None:
        """``text``: the details as already rendered elsewhere (an ``ItemError`` message)."""
        self._text = text
        self.kind = FailureKind(kind)
        self.message = message
        self.stage = stage
        self.rule = rule
        self.field = field
        self.code = code if isinstance(code, Code) else Code[code]
        self.reason = reason
        super().__init__(self.details())

    def details(self) -> str:
        """``stage: [rule] field: message`` with the empty parts left out."""
        if self._text is not None:
            return self._text
        out = self.message
        if self.field:
            out = f"{self.field}: {out}"
        if self.rule:
            out = f"[{self.rule}] {out}"
        if self.stage:
            out = f"{self.stage}: {out}"
        return out

    def line(self) -> str:
        """The results line's ``error``: ``"<kind>: <details>"``."""
        return f"{self.kind.value}: {self.details()}"


class StageError(Failure):
    """A stage failed, or answered outside the contract, for one image (kind ``stage_error``)."""

    def __init__(
        self, stage: str, message: str, *, rule: str = "", field: str = "", code: Code | str = Code.INTERNAL
    ) -> None:
        super().__init__(FailureKind.STAGE_ERROR, message, stage=stage, rule=rule, field=field, code=code)


def kind_of(error: str | None, error_kind: str | None = None) -> str:
    """The kind of an error line: its ``error_kind`` field, else the first word of ``error`` when it is one
    of ``FAILURE_KINDS`` (older files), else ``OTHER_KIND``."""
    if error_kind in FAILURE_KINDS:
        return str(error_kind)
    head = (error or "").split(":", 1)[0].strip()
    return head if head in FAILURE_KINDS else OTHER_KIND
