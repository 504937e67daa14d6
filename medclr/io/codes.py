"""Header strings as medclr writes them anywhere (``medclr inspect``'s JSON, the score table's ``view`` and UID
columns, the app's facts line, a MIMIC manifest's ``view``): the one reduction of an untrusted DICOM value to the
alphabet of its value representation. A value outside it is damage or something planted (``<SCRIPT>``, Markdown
links) and is written as "" (the callers count or report the values left blank); it is never echoed."""

from __future__ import annotations

import re

__all__ = ["CODE_STRING", "UID", "code_string", "left_blank", "uid_string"]

#: DICOM VR CS (Modality, ViewPosition, BodyPartExamined, PhotometricInterpretation): upper-case letters, digits,
#: space and underscore, at most 16 characters (PS3.5 table 6.2-1).
CODE_STRING = re.compile(r"[A-Z0-9_ ]{1,16}")
#: DICOM VR UI (StudyInstanceUID, TransferSyntaxUID, ...): digits and dots, at most 64 characters.
UID = re.compile(r"[0-9.]{1,64}")


def _text(value: object) -> str:
    return "" if value is None else str(value).strip().strip("\0").strip()


def code_string(value: object) -> str:
    """A code string as medclr writes it: stripped and upper-cased ("pa" is PA), kept when it is in the CS
    alphabet; "" otherwise."""
    text = _text(value).upper()
    return text if CODE_STRING.fullmatch(text) else ""


def uid_string(value: object) -> str:
    """A UID as medclr writes it: stripped, kept when it is digits and dots (at most 64); "" otherwise."""
    text = _text(value)
    return text if UID.fullmatch(text) else ""


def left_blank(raw: object, written: str) -> bool:
    """Whether a header value was there but not written (not in its alphabet)."""
    return bool(_text(raw)) and not written
