import os

import pytest
import torch

# Release-format checkpoint of a small arch with the release code's outputs, and the release's key layouts.
DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data')
OFFICIAL_LAYOUT_DIR = os.path.join(DATA_DIR, 'official_layout')

# A small arch that keeps every structural feature of the released ones (4 stages, both attention kinds).
SMALL_ARCH = dict(embed_dims=[16, 32, 48, 64], depths=[1, 1, 2, 1], num_heads=[1, 2, 3, 4])


@pytest.fixture
def small_arch():
    return dict(SMALL_ARCH)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
