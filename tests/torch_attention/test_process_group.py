"""torch_attention.process_group: membership of a process group, with errors that say what to do."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from torch_attention import process_group


@pytest.mark.skipif(dist.is_available() and dist.is_initialized(), reason="a group is initialized")
def test_without_an_initialized_group_the_error_says_how_to_make_one():
    with pytest.raises(RuntimeError, match="call torch.distributed.init_process_group"):
        process_group.membership(None)
