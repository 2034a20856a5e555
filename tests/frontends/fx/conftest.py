"""Shared fixtures for the torch frontend tests: a fresh Dynamo cache per test, small models."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 64),
        torch.nn.ReLU(), torch.nn.Linear(64, 10), torch.nn.Softmax(-1),
    ).eval()


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2)
        self.bn2 = torch.nn.BatchNorm2d(16)
        self.fc = torch.nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.nn.functional.max_pool2d(y, 2)
        y = torch.nn.functional.hardtanh(self.bn2(self.conv2(y)))
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1))


def cnn(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = SmallCNN()
    with torch.no_grad():  # non-trivial BatchNorm statistics
        for bn in (model.bn1, model.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
    return model.eval()


def randn(rng: np.random.Generator, *shape: int) -> torch.Tensor:
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))


@pytest.fixture
def zoo() -> SimpleNamespace:
    """Seeded small models (mlp(seed), cnn(seed)) and randn(rng, *shape)."""
    return SimpleNamespace(mlp=mlp, cnn=cnn, randn=randn)
