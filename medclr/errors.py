"""The one exception type that reaches users as a single line (the CLI prints it, no traceback)."""


class MedclrError(Exception):
    """Bad input or configuration: the message names the file/field and what was expected."""


class ImageReadError(MedclrError, ValueError):
    """A radiograph could not be read (corrupt, truncated, not an image, too large)."""
