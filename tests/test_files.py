"""medclr.files: the one atomic-write rule (write beside, fsync, rename, fsync the folder)."""

from __future__ import annotations

import numpy as np
import pytest

from medclr.files import atomic_path, write_text


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "table.json"
    write_text(target, "old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half of the new")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["table.json"]
    write_text(target, "new")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["table.json"]


def test_the_temporary_keeps_the_suffix_writers_go_by(tmp_path):
    # numpy's savez appends .npz to a name without it: the temporary must end in the target's suffix
    target = tmp_path / "sub" / "masks.npz"
    with atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp.name.startswith(".") and tmp.suffix == ".npz"
        np.savez_compressed(tmp, a=np.arange(3))
    with np.load(target) as z:
        assert z["a"].tolist() == [0, 1, 2]
    assert [p.name for p in target.parent.iterdir()] == ["masks.npz"]
