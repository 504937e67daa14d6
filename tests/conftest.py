"""Shared fixtures."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Intra-op threads at one for timing-sensitive tests on a shared machine (as OMP_NUM_THREADS=1)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
