"""ferry.torch on GPUs: the symmetric pool, FSDP2 with ferry's all-gather and
reduce-scatter, and ferry.torch's refusals of bad input."""

import _workers_fsdp
import pytest
from conftest import GPU_COUNT, worlds_to_test
from harness import run_on_every_rank

pytestmark = pytest.mark.multigpu


@pytest.mark.parametrize("world", worlds_to_test(2, 4, GPU_COUNT))
def test_symmetric_pool(world):
    run_on_every_rank(_workers_fsdp.symmetric_pool, world, timeout=120)


@pytest.mark.parametrize("world", worlds_to_test(2, 4, GPU_COUNT))
def test_fsdp2_training_with_ferry_collectives_matches_nccl(world):
    run_on_every_rank(_workers_fsdp.fsdp_training, world, timeout=240)


def test_fsdp_bad_inputs_are_named():
    run_on_every_rank(_workers_fsdp.fsdp_bad_inputs, 2, timeout=120)
