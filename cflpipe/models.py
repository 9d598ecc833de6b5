"""The models a run can train, built from the dataset's input shape and class count.

Every model is a `LayeredModel`: it lists its layers in order (`model.layers`, module attribute
paths), its last layer is the head (the decision layer, a Linear) and everything before it is the
body, whose output `features(x)` is the embedding. Methods that personalise or cluster on part of
the network (body/head splits, per-layer similarities) rely on that naming, so it is checked once
when a model is built.

No model holds buffers: the whole state is `parameters()`, so averaging parameters averages the
model exactly and a flat parameter vector is a complete checkpoint.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch
from torch import Tensor, nn

from cflpipe.errors import SpecError


class ModelError(SpecError, ValueError):
    """A model name or shape the spec asks for that cannot be built. It is a SpecError so the
    CLI reports it as one line, and a ValueError for callers that use the library directly."""


class LayeredModel(nn.Module):
    """Base of every model: `forward(x) = head(features(x))`."""

    name: str = ""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.layers: list[str] = []

    @property
    def head(self) -> nn.Module:
        return self.get_submodule(self.layers[-1])

    def features(self, x: Tensor) -> Tensor:
        raise NotImplementedError  # pragma: no cover - every registered model overrides it

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


# --------------------------------------------------------------------------- mlp


class MLP(LayeredModel):
    """McMahan et al. (2017)'s 2NN: two hidden layers of 200 units (`mlp`). With `depth` d it has
    d linear layers, d − 1 hidden ones of `hidden` units with ReLU (`mlp11`: FCCA's "11-layer
    MLP", whose width the paper does not give; 200 as the 2NN's)."""

    name = "mlp"

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: int = 200, depth: int = 3):
        super().__init__(input_shape, num_classes)
        widths = [math.prod(input_shape)] + [hidden] * (depth - 1) + [num_classes]
        self.layers = [f"fc{i + 1}" for i in range(depth)]
        for name, (n_in, n_out) in zip(self.layers, zip(widths, widths[1:])):
            setattr(self, name, nn.Linear(n_in, n_out))

    def features(self, x: Tensor) -> Tensor:
        x = torch.flatten(x, 1)
        for name in self.layers[:-1]:
            x = torch.relu(self.get_submodule(name)(x))
        return x


# --------------------------------------------------------------------------- cnn (FedAC)


def _image_shape(input_shape: tuple[int, ...], model: str) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ModelError(
            f"model: {model!r} needs image inputs (channels, height, width), "
            f"got input shape {tuple(input_shape)}; use 'mlp' for vector data"
        )
    return input_shape  # type: ignore[return-value]


def _conv_out(size: int, kernel: int, padding: int) -> int:
    return size + 2 * padding - kernel + 1


class CNN(LayeredModel):
    """FedAC's CNN: the LeNet-5-style network of FedAvg's CIFAR experiments (2 conv + 3 fc)."""

    name = "cnn"

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__(input_shape, num_classes)
        channels, height, width = _image_shape(input_shape, self.name)
        # Unpadded 5x5 convs shrink 8x8 digits to nothing; padding only small inputs keeps
        # the published architecture (and its 62,006 parameters on CIFAR) where it fits.
        padding = 2 if min(height, width) < 28 else 0
        h, w = height, width
        for _ in range(2):
            h, w = _conv_out(h, 5, padding) // 2, _conv_out(w, 5, padding) // 2
        if h < 1 or w < 1:
            raise ModelError(f"model: 'cnn' cannot take inputs of {height}x{width} pixels; "
                             f"it needs at least 4x4")
        self.conv1 = nn.Conv2d(channels, 6, 5, padding=padding)
        self.conv2 = nn.Conv2d(6, 16, 5, padding=padding)
        self.fc1 = nn.Linear(16 * h * w, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)
        self.layers = ["conv1", "conv2", "fc1", "fc2", "fc3"]

    def features(self, x: Tensor) -> Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = torch.relu(self.fc1(x))
        return torch.relu(self.fc2(x))


# --------------------------------------------------------------------------- cnn_tsdp (FedTSDP)


class _TwoConvNet(LayeredModel):
    """Two 3x3 convs (32, 64 channels), one max-pool, dropout 0.25, a hidden layer, dropout 0.5:
    the shape FedTSDP's CNN and pfl-research's share; they differ in padding and hidden width."""

    padding: int
    hidden: int

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__(input_shape, num_classes)
        channels, height, width = _image_shape(input_shape, self.name)
        h, w = (_conv_out(_conv_out(side, 3, self.padding), 3, self.padding) // 2 for side in (height, width))
        if h < 1 or w < 1:
            side = 2 + 4 * (1 - self.padding)  # the smallest side that survives both convs and the pool
            raise ModelError(f"model: {self.name!r} cannot take inputs of {height}x{width} pixels; "
                             f"it needs at least {side}x{side}")
        self.conv1 = nn.Conv2d(channels, 32, 3, padding=self.padding)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=self.padding)
        self.drop1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(64 * h * w, self.hidden)
        self.drop2 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(self.hidden, num_classes)
        self.layers = ["conv1", "conv2", "fc1", "fc2"]

    def features(self, x: Tensor) -> Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        x = self.drop1(nn.functional.max_pool2d(x, 2))
        x = torch.flatten(x, 1)
        return self.drop2(torch.relu(self.fc1(x)))


class CNNTSDP(_TwoConvNet):
    """FedTSDP's CNN: two padded 3x3 convs, one max-pool, dropout, a 512-unit hidden layer."""

    name = "cnn_tsdp"
    padding, hidden = 1, 512


# --------------------------------------------------------------------------- cnn_pfl (pfl-research)


class CNNPfl(_TwoConvNet):
    """pfl-research's CIFAR-10 benchmark CNN (Granlund et al. 2024, `simple_cnn`): two unpadded
    3x3 convs, one max-pool, dropout 0.25, a 128-unit hidden layer, dropout 0.5. At 3x32x32 it has
    1,626,442 parameters. `cflpipe bench --part yardstick` times this shape against pfl's
    published one."""

    name = "cnn_pfl"
    padding, hidden = 0, 128


# --------------------------------------------------------------------------- resnet18

# BatchNorm keeps running mean/variance buffers that FedAvg cannot average meaningfully and that
# drift apart on non-IID clients; Hsieh et al. (2020, "The Non-IID Data Quagmire of Decentralized
# Machine Learning") show GroupNorm avoids that failure. GroupNorm has only affine parameters, so
# the model has no buffers and parameter averaging is the exact model average.
_GN_GROUPS = 2


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(_GN_GROUPS, channels)


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _norm(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.norm2 = _norm(planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), _norm(planes)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class ResNet18(LayeredModel):
    """ResNet-18 with the CIFAR stem (3x3 conv, stride 1, no max-pool), so that 32x32 images
    keep enough resolution and even 8x8 digits reach the last stage at 1x1."""

    name = "resnet18"

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__(input_shape, num_classes)
        channels, _, _ = _image_shape(input_shape, self.name)
        self.stem = nn.Sequential(
            nn.Conv2d(channels, 64, 3, stride=1, padding=1, bias=False), _norm(64), nn.ReLU()
        )
        in_planes = 64
        block_names = []
        for stage, (planes, stride) in enumerate([(64, 1), (128, 2), (256, 2), (512, 2)], 1):
            blocks = []
            for i in range(2):
                blocks.append(BasicBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
                block_names.append(f"layer{stage}.{i}")
            setattr(self, f"layer{stage}", nn.Sequential(*blocks))
        self.fc = nn.Linear(512, num_classes)
        self.layers = ["stem", *block_names, "fc"]

    def features(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        # Global average pooling as a mean: adaptive_avg_pool2d's CUDA backward is nondeterministic.
        return x.mean(dim=(2, 3))


# --------------------------------------------------------------------------- registry

ModelFactory = Callable[[tuple[int, ...], int], LayeredModel]

MODELS: dict[str, ModelFactory] = {
    "mlp": MLP,
    "cnn": CNN,
    "cnn_tsdp": CNNTSDP,
    "cnn_pfl": CNNPfl,
    "resnet18": ResNet18,
}
BUILTIN_MODELS = tuple(MODELS)


def mlp_depth(name: str) -> int | None:
    """The depth of an `mlp<d>` name (d linear layers, 2 ≤ d ≤ 64), else None."""
    from cflpipe.spec import mlp_depth as depth_of  # one rule, in the torch-free spec

    return depth_of(name)


def register_model(name: str):
    """Register a model class (or any `factory(input_shape, num_classes) -> LayeredModel`) under
    `name`; for plugins, which may equally just name the class in a `cflpipe.models` entry point."""

    def decorate(factory: ModelFactory) -> ModelFactory:
        from cflpipe.plugins import describe_object

        old = MODELS.get(name)
        if old is not None and old is not factory:
            raise ValueError(f"model name {name!r} is already registered by {describe_object(old)}; choose another name")
        MODELS[name] = factory
        return factory

    return decorate


def model_factory(name: str, field_path: str = "model") -> ModelFactory:
    """What builds model `name`: built in, an installed plugin's (`cflpipe.models` entry point)
    or a `module:Class` reference; plugins are imported here, the first time they are named."""
    from cflpipe.plugins import (MODELS_GROUP, describe_object, entry_point_names, is_reference, load_entry_point,
                                 load_reference)

    if name in MODELS:
        return MODELS[name]
    if (depth := mlp_depth(name)) is not None:
        return functools.partial(MLP, depth=depth)
    if is_reference(name):
        factory = load_reference(name, field_path)
    elif name in entry_point_names(MODELS_GROUP):
        factory = load_entry_point(MODELS_GROUP, name, field_path)
        factory = MODELS.get(name, factory)  # the entry point may name a module that registers it
    else:
        allowed = ", ".join([*BUILTIN_MODELS, *(n for n in entry_point_names(MODELS_GROUP) if n not in MODELS)])
        raise ModelError(f"{field_path}: unknown model {name!r}; allowed: {allowed} (or a module:Class reference)")
    if not callable(factory) or isinstance(factory, type) and not issubclass(factory, LayeredModel):
        raise ModelError(f"{field_path}: {name!r} is {describe_object(factory)}, not a cflpipe.models.LayeredModel "
                         f"subclass or a function (input_shape, num_classes) -> LayeredModel")
    MODELS[name] = factory
    return factory


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int,
                field_path: str = "model") -> LayeredModel:
    """A freshly initialised model; call `torch.manual_seed` first for a reproducible init."""
    factory = model_factory(name, field_path)
    input_shape = tuple(int(d) for d in input_shape)
    if not input_shape or any(d < 1 for d in input_shape):
        raise ModelError(f"{field_path}: input shape must be non-empty and positive, "
                         f"got {input_shape}")
    if int(num_classes) < 1:
        raise ModelError(f"{field_path}: number of classes must be at least 1, got {num_classes}")
    model = factory(input_shape, int(num_classes))
    if name in BUILTIN_MODELS:
        _check_layers(model)
        return model
    # A plugin's model that breaks the layer conventions is the user's input, reported in one line.
    if not isinstance(model, LayeredModel):
        raise ModelError(f"{field_path}: model {name!r} built a {type(model).__name__}, not a "
                         f"cflpipe.models.LayeredModel")
    try:
        _check_layers(model)
    except (RuntimeError, IndexError, AttributeError) as exc:  # no layers, or a layer name that is no module
        raise ModelError(f"{field_path}: model {name!r}: {exc}") from None
    return model


def _check_layers(model: LayeredModel) -> None:
    # Layer bookkeeping errors are bugs in this module, not user input, hence RuntimeError.
    layer_of_parameters(model)
    if list(model.buffers()):
        raise RuntimeError(f"{type(model).__name__} has buffers; averaging would miss them")
    if not isinstance(model.head, nn.Linear):
        raise RuntimeError(f"{type(model).__name__}'s last layer is not a Linear head")


# --------------------------------------------------------------------------- layer views


def layer_of_parameters(model: LayeredModel) -> list[int]:
    """For each parameter, in `model.named_parameters()` order, the index of its layer."""
    prefixes = [layer + "." for layer in model.layers]
    out = []
    for pname, _ in model.named_parameters():
        owners = [i for i, p in enumerate(prefixes) if pname.startswith(p)]
        if len(owners) != 1:
            raise RuntimeError(f"parameter {pname!r} belongs to {len(owners)} layers of "
                               f"{type(model).__name__}, expected exactly one")
        out.append(owners[0])
    return out


def head_parameter_names(model: LayeredModel) -> list[str]:
    """Parameters of the decision layer (the last layer)."""
    head = len(model.layers) - 1
    names = [n for n, _ in model.named_parameters()]
    return [n for n, i in zip(names, layer_of_parameters(model)) if i == head]


def body_parameter_names(model: LayeredModel) -> list[str]:
    """Parameters of every layer but the last: the embedding network."""
    head = len(model.layers) - 1
    names = [n for n, _ in model.named_parameters()]
    return [n for n, i in zip(names, layer_of_parameters(model)) if i != head]


def embed(model: LayeredModel, x: Tensor) -> Tensor:
    """The body's output for a batch: the input of the head, one row per sample."""
    return model.features(x)
