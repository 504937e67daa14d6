"""Reading the public CSV files with their exact columns, with one clear error when they differ."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from medclr.errors import MedclrError


def read_csv_checked(path: str | Path, required: tuple[str, ...], what: str, **kwargs) -> pd.DataFrame:
    """Read a CSV (plain or .gz) and demand ``required`` columns; errors name the file and the columns."""
    path = Path(path)
    if not path.is_file():
        raise MedclrError(f"{path}: {what} not found")
    try:
        df = pd.read_csv(path, **kwargs)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError, EOFError) as exc:
        raise MedclrError(f"{path}: not a readable {what} CSV ({type(exc).__name__}: {exc})") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise MedclrError(f"{path}: {what} lacks column(s) {missing}; it has {list(df.columns)}")
    return df
