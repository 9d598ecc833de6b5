"""A small CNN for small images (8×8 digits up to 32×32 CIFAR): two 3×3 convolutions with
pooling and two linear layers, about 4k parameters on 8×8 digits (the built-in cnn has 22k)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from cflpipe.models import LayeredModel, ModelError


class TinyCNN(LayeredModel):
    """conv(3×3, 8) → pool → conv(3×3, 16) → pool → fc(32) → fc(classes)."""

    name = "tiny_cnn"

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__(input_shape, num_classes)
        if len(input_shape) != 3 or min(input_shape[1:]) < 4:
            raise ModelError(f"model: 'tiny_cnn' needs images (channels, height, width) of at least 4×4 pixels, "
                             f"got input shape {tuple(input_shape)}; use 'mlp' for vector data")
        channels, height, width = input_shape
        self.conv1 = nn.Conv2d(channels, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * (height // 4) * (width // 4), 32)
        self.fc2 = nn.Linear(32, num_classes)
        # cflpipe's layer convention: every parameter in exactly one listed layer, the last one the head.
        self.layers = ["conv1", "conv2", "fc1", "fc2"]

    def features(self, x: Tensor) -> Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return torch.relu(self.fc1(torch.flatten(x, 1)))
