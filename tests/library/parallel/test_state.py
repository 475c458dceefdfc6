"""The tensor-parallel group: a stand-in group for one rank without processes."""

import pytest
import torch

from loadkit.parallel import TensorParallelError, stand_in_group, use_group


def test_a_stand_in_group_refuses_collectives_with_other_ranks():
    x = torch.ones(2)
    with use_group(stand_in_group(0, 1)) as g:
        assert g.all_reduce(x) is x and g.all_gather(x) is x
    with pytest.raises(TensorParallelError, match="this group is a stand-in"):
        stand_in_group(1, 2).all_reduce(x)
    with pytest.raises(TensorParallelError, match="outside a group of 2"):
        stand_in_group(2, 2)
