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
  contract rule it broke, a ``ContractRule``), or the judge could not use the perception
  (``stage == "judge"``).
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


class ContractRule(StrEnum):
    """The stage contract's rules (``docs/stage-contract.md``, "What the orchestrator checks in every answer"):
    the one list of names a ``Failure.rule`` takes. ``requirement`` says what each rule requires."""

    IMAGE_SIZE = "image-size"
    CLASS_VOCABULARY = "class-vocabulary"
    SCORE_RANGE = "score-range"
    BOX_INSIDE_IMAGE = "box-inside-image"
    MASK_SIZE = "mask-size"
    RESULT_COUNT = "result-count"
    SCORE_FINITE = "score-finite"
    DEPTH_FINITE = "depth-finite"
    DETECT_RESULT = "detect-result"
    RESULT_SCHEMA = "result-schema"
    STAGE_INFO = "stage-info"

    @property
    def requirement(self) -> str:
        """What the rule requires of a stage answer, in words."""
        return _REQUIREMENTS[self]

    @classmethod
    def parse(cls, name: str) -> ContractRule | None:
        """The rule named ``name`` as another process wrote it (empty: none; a name this version does not
        know, from a newer server: none, the failure's rendered text still carries it)."""
        try:
            return cls(name) if name else None
        except ValueError:
            return None


_REQUIREMENTS: Final[dict[ContractRule, str]] = {
    ContractRule.IMAGE_SIZE: "detections are for the image's (H, W)",
    ContractRule.CLASS_VOCABULARY: "class names are COCO classes in the benchmark's spelling",
    ContractRule.SCORE_RANGE: "detection scores are finite and in [prediction floor, 1]",
    ContractRule.BOX_INSIDE_IMAGE: "boxes are finite xyxy pixel edges inside [0, W] x [0, H] with x0 <= x1, y0 <= y1",
    ContractRule.MASK_SIZE: "masks are (H, W) at the image's resolution, one per instance",
    ContractRule.RESULT_COUNT: "one answer per requested instance",
    ContractRule.SCORE_FINITE: "attribute scores are finite",
    ContractRule.DEPTH_FINITE: "disparity is finite",
    ContractRule.DETECT_RESULT: "a detector's result decodes to detections (masks, boxes and scores agree)",
    ContractRule.RESULT_SCHEMA: "the result parses as its message (no unknown fields)",
    ContractRule.STAGE_INFO: "the stage's /info is valid for this orchestrator",
}

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
    the ``ContractRule`` a stage answer broke (``docs/stage-contract.md``), if any (a rule's
    spelling is accepted and checked: a name outside the enum is a ``ValueError``);
    ``field``: the offending request field, if any; ``code``: the gRPC status (``Code``; a status
    name is accepted and checked: a name outside the enum is a ``KeyError``)
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
        rule: ContractRule | None = None,
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
        self.rule: ContractRule | None = ContractRule(rule) if rule else None
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
        self,
        stage: str,
        message: str,
        *,
        rule: ContractRule | None = None,
        field: str = "",
        code: Code | str = Code.INTERNAL,
    ) -> None:
        super().__init__(FailureKind.STAGE_ERROR, message, stage=stage, rule=rule, field=field, code=code)


def kind_of(error: str | None, error_kind: str | None = None) -> str:
    """The kind of an error line: its ``error_kind`` field, else the first word of ``error`` when it is one
    of ``FAILURE_KINDS`` (older files), else ``OTHER_KIND``."""
    if error_kind in FAILURE_KINDS:
        return str(error_kind)
    head = (error or "").split(":", 1)[0].strip()
    return head if head in FAILURE_KINDS else OTHER_KIND
