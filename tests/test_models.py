import pytest
import torch
from torch import nn

from cflpipe.errors import SpecError
from cflpipe.models import (
    MODELS,
    ModelError,
    body_parameter_names,
    build_model,
    embed,
    head_parameter_names,
    layer_of_parameters,
)

IMAGE_SHAPES = [((1, 8, 8), 10), ((1, 28, 28), 10), ((3, 32, 32), 100)]
CASES = [(name, shape, classes) for name in MODELS for shape, classes in IMAGE_SHAPES]
CASES.append(("mlp", (60,), 10))
IDS = [f"{n}-{'x'.join(map(str, s))}-{c}" for n, s, c in CASES]


def _build(name, shape, classes, seed=0):
    torch.manual_seed(seed)
    return build_model(name, shape, classes)


@pytest.fixture(scope="module")
def built():
    # ResNet-18 on 32x32 takes a moment to build; share one instance per case.
    return {case: _build(*case) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_shapes_buffers_and_layers(case, built):
    name, shape, classes = case
    model = built[case].eval()
    x = torch.randn(3, *shape)
    with torch.no_grad():
        out = model(x)
        z = embed(model, x)
        assert out.shape == (3, classes)
        assert z.ndim == 2 and z.shape[0] == 3
        assert torch.equal(model.head(z), out)

    assert list(model.buffers()) == []

    names = [n for n, _ in model.named_parameters()]
    layer_idx = layer_of_parameters(model)
    assert len(layer_idx) == len(names)
    for pname, i in zip(names, layer_idx):
        owners = [layer for layer in model.layers if pname.startswith(layer + ".")]
        assert owners == [model.layers[i]]
    assert layer_idx == sorted(layer_idx), "layers are listed in parameter order"
    assert set(layer_idx) == set(range(len(model.layers))), "no layer is empty"

    head = model.get_submodule(model.layers[-1])
    assert isinstance(head, nn.Linear)
    last_linear = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)][-1]
    assert model.layers[-1] == last_linear
    assert head_parameter_names(model) == [f"{last_linear}.weight", f"{last_linear}.bias"]
    body = body_parameter_names(model)
    assert not set(body) & set(head_parameter_names(model))
    assert body + head_parameter_names(model) == names


def test_layer_names():
    assert build_model("cnn", (3, 32, 32), 10).layers == ["conv1", "conv2", "fc1", "fc2", "fc3"]
    assert build_model("mlp", (60,), 10).layers == ["fc1", "fc2", "fc3"]
    assert build_model("cnn_tsdp", (1, 28, 28), 10).layers == ["conv1", "conv2", "fc1", "fc2"]
    resnet = build_model("resnet18", (1, 8, 8), 10).layers
    assert resnet == ["stem"] + [f"layer{s}.{b}" for s in range(1, 5) for b in range(2)] + ["fc"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_same_seed_same_parameters(name):
    a, b, c = (_build(name, (1, 8, 8), 10, seed) for seed in (1, 1, 2))
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert na == nb and torch.equal(pa, pb)
    assert not all(torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


def test_cnn_parameter_count_is_lenet5():
    model = build_model("cnn", (3, 32, 32), 10)
    assert sum(p.numel() for p in model.parameters()) == 62_006


def test_cnn_pads_only_small_inputs():
    assert build_model("cnn", (1, 8, 8), 10).conv1.padding == (2, 2)
    assert build_model("cnn", (1, 28, 28), 10).conv1.padding == (0, 0)
    assert build_model("cnn", (3, 32, 32), 10).conv1.padding == (0, 0)


def _digit_batch(n=32, classes=10, seed=0):
    """Noisy copies of one fixed 8x8 prototype per class: learnable, unlike random labels."""
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(classes, 1, 8, 8, generator=g)
    y = torch.arange(n) % classes
    x = prototypes[y] + 0.3 * torch.randn(n, 1, 8, 8, generator=g)
    return x, y


# LeNet-style nets with PyTorch's default init sit on a plateau for their first steps, so the
# cnn only has to move; the others must make real progress. ResNet-18 without BatchNorm has
# large initial gradients and needs a small step size.
@pytest.mark.parametrize("name,steps,lr,max_ratio", [
    ("cnn", 20, 0.1, 0.995), ("mlp", 20, 0.1, 0.5), ("cnn_tsdp", 20, 0.1, 0.5),
    ("resnet18", 5, 0.001, 0.7),
])
def test_sgd_reduces_loss(name, steps, lr, max_ratio):
    x, y = _digit_batch()
    model = _build(name, (1, 8, 8), 10)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    with torch.no_grad():
        start = loss_fn(model.eval()(x), y).item()
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    with torch.no_grad():
        end = loss_fn(model.eval()(x), y).item()
    assert end < max_ratio * start, (start, end)


def test_unknown_model_lists_allowed_names():
    with pytest.raises(ValueError) as err:
        build_model("vgg", (3, 32, 32), 10)
    message = str(err.value)
    assert "vgg" in message
    for name in MODELS:
        assert name in message
    assert isinstance(err.value, SpecError)


@pytest.mark.parametrize("name", ["cnn", "cnn_tsdp", "resnet18"])
def test_image_models_reject_vectors(name):
    with pytest.raises(ModelError, match="image"):
        build_model(name, (60,), 10)


def test_too_small_image_and_bad_arguments():
    with pytest.raises(ValueError, match="at least"):
        build_model("cnn", (1, 3, 3), 10)
    with pytest.raises(ValueError):
        build_model("mlp", (), 10)
    with pytest.raises(ValueError):
        build_model("mlp", (60,), 0)


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_the_layers_validate_knows_are_the_built_networks_layers(shape):
    from cflpipe.fl.params import ParamSpace
    from cflpipe.spec import MODEL_NAMES, model_layers

    for name in (*MODEL_NAMES, "mlp2", "mlp11"):
        assert model_layers(name) == ParamSpace(build_model(name, shape, 10), torch.device("cpu")).num_layers, name
    assert model_layers("my_plugin:Net") is None


def test_mlp_depth_names_build_that_many_linear_layers_and_mlp_is_the_2nn():
    """`mlp<d>`: d linear layers, d − 1 hidden of 200 with ReLU (FCCA's 11-layer MLP is mlp11);
    `mlp3` is `mlp` itself, parameter for parameter under one seed."""
    deep = build_model("mlp11", (40,), 10)
    assert deep.layers == [f"fc{i}" for i in range(1, 12)]
    assert deep.features(torch.zeros(2, 40)).shape == (2, 200) and deep(torch.zeros(2, 40)).shape == (2, 10)
    torch.manual_seed(0)
    two_nn = torch.nn.utils.parameters_to_vector(build_model("mlp", (1, 8, 8), 10).parameters())
    torch.manual_seed(0)
    three = torch.nn.utils.parameters_to_vector(build_model("mlp3", (1, 8, 8), 10).parameters())
    assert torch.equal(two_nn, three) and two_nn.numel() == 64 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10
    from cflpipe.spec import mlp_depth

    assert [mlp_depth(n) for n in ("mlp2", "mlp64", "mlp1", "mlp65", "mlp011", "mlp", "mlpx")] == \
        [2, 64, None, None, None, None, None]
    with pytest.raises(SpecError, match="unknown model 'mlp1'"):
        build_model("mlp1", (40,), 10)
