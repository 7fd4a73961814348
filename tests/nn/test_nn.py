"""atensor.nn against PyTorch CPU: layers (values and gradients), losses, optimizers over several
steps, learning-rate schedules, state dicts and safetensors files that PyTorch opens."""
from __future__ import annotations

import numpy as np
import pytest

from atensor import Tensor, dtypes, nn
from atensor.nn import optim


from tests.torch_reference import needs_torch, torch
F = torch.nn.functional

RNG = np.random.default_rng(1)


def _t(a):
    return torch.tensor(np.asarray(a))


def _copy_weights(layer, tlayer):
    """Gives the torch layer the atensor layer's (random) parameters."""
    with torch.no_grad():
        for name, param in tlayer.named_parameters():
            param.copy_(_t(getattr(layer, name).numpy()))


def _check_layer(layer, tlayer, x, rtol=1e-5, atol=1e-6):
    """Forward values and the gradients of input and parameters against PyTorch."""
    _copy_weights(layer, tlayer)
    tx = _t(x).requires_grad_()
    tout = tlayer(tx)
    cot = RNG.uniform(-1, 1, size=tout.shape).astype(np.float32)
    (tout * _t(cot)).sum().backward()
    xt = Tensor(x, requires_grad=True)
    params = {name: getattr(layer, name) for name, _ in tlayer.named_parameters()}
    for p in params.values():
        p.requires_grad = True
    out = layer(xt)
    (out * Tensor(cot)).sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=rtol, atol=atol)
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=rtol, atol=atol)
    for name, tparam in tlayer.named_parameters():
        np.testing.assert_allclose(params[name].grad.numpy(), tparam.grad.numpy(), rtol=rtol, atol=atol)


@needs_torch
def test_linear_matches_pytorch():
    _check_layer(nn.Linear(5, 3), torch.nn.Linear(5, 3), RNG.standard_normal((4, 5)).astype(np.float32))


def test_linear_initialization_is_bounded_by_one_over_sqrt_fan_in():
    w = nn.Linear(100, 50).weight.numpy()
    assert w.shape == (50, 100) and np.abs(w).max() <= 0.1 and w.std() > 0.04


@needs_torch
@pytest.mark.parametrize("kw", [{}, dict(stride=2, padding=1), dict(padding=2, dilation=2), dict(groups=2)])
def test_conv2d_matches_pytorch(kw):
    layer, tlayer = nn.Conv2d(4, 6, 3, **kw), torch.nn.Conv2d(4, 6, 3, **kw)
    _check_layer(layer, tlayer, RNG.standard_normal((2, 4, 7, 6)).astype(np.float32), rtol=1e-4, atol=1e-5)


@needs_torch
def test_batchnorm_training_matches_pytorch_and_updates_running_stats():
    layer, tlayer = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    x = RNG.standard_normal((4, 3, 5, 5)).astype(np.float32) * 2 + 1
    with Tensor.train():
        _check_layer(layer, tlayer, x, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(layer.running_mean.numpy(), tlayer.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.running_var.numpy(), tlayer.running_var.numpy(), rtol=1e-5, atol=1e-6)
    assert layer.num_batches_tracked.item() == 1
    tlayer.eval()
    out = layer(Tensor(x)).numpy()  # evaluation: the running statistics
    np.testing.assert_allclose(out, tlayer(_t(x)).detach().numpy(), rtol=1e-4, atol=1e-5)


@needs_torch
def test_batchnorm1d_matches_pytorch():
    with Tensor.train():
        x = RNG.standard_normal((8, 4)).astype(np.float32)
        _check_layer(nn.BatchNorm1d(4), torch.nn.BatchNorm1d(4), x, rtol=1e-4, atol=1e-5)


@needs_torch
def test_layernorm_matches_pytorch():
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    _check_layer(nn.LayerNorm((4, 5)), torch.nn.LayerNorm((4, 5)), x, rtol=1e-4, atol=1e-5)


@needs_torch
def test_embedding_looks_up_rows_and_gets_gradients_per_row():
    layer = nn.Embedding(6, 3)
    tlayer = torch.nn.Embedding(6, 3)
    _copy_weights(layer, tlayer)
    idx = np.array([[0, 5, 2], [2, 2, 1]], dtype=np.int32)
    layer.weight.requires_grad = True
    out = layer(Tensor(idx))
    (out * out).sum().backward()
    tout = tlayer(_t(idx.astype(np.int64)))
    (tout * tout).sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(layer.weight.grad.numpy(), tlayer.weight.grad.numpy(), rtol=1e-5)


def test_dropout_zeroes_a_fraction_and_rescales_only_in_training():
    x = Tensor.ones(4000)
    assert (nn.Dropout(0.25)(x).numpy() == 1).all()
    Tensor.manual_seed(3)
    with Tensor.train():
        out = nn.Dropout(0.25)(x).numpy()
    assert set(np.unique(out)) <= {0.0, np.float32(1 / 0.75)}
    assert abs((out == 0).mean() - 0.25) < 0.03
    Tensor.manual_seed(3)
    with Tensor.train():
        again = nn.Dropout(0.25)(x).numpy()
    np.testing.assert_array_equal(out, again)


# ---- losses ------------------------------------------------------------------------------------
LOGITS = RNG.standard_normal((6, 5)) * 3
LABELS = np.array([0, 4, 2, 2, 1, 3])


@needs_torch
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_with_class_indices_matches_pytorch(reduction, smoothing):
    x = Tensor(LOGITS, requires_grad=True)
    target = Tensor(LABELS.astype(np.int32))
    loss = nn.cross_entropy(x, target, reduction=reduction, label_smoothing=smoothing)
    (loss * Tensor(np.ones(loss.shape))).sum().backward()
    tx = _t(LOGITS).requires_grad_()
    tloss = F.cross_entropy(tx, _t(LABELS), reduction=reduction, label_smoothing=smoothing)
    tloss.sum().backward()
    np.testing.assert_allclose(loss.numpy(), tloss.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-9, atol=1e-12)


@needs_torch
def test_cross_entropy_with_probabilities_and_ignore_index_match_pytorch():
    probs = RNG.dirichlet(np.ones(5), size=6)
    got = nn.cross_entropy(Tensor(LOGITS), Tensor(probs)).item()
    assert got == pytest.approx(F.cross_entropy(_t(LOGITS), _t(probs)).item(), rel=1e-10)
    labels = LABELS.copy()
    labels[[1, 3]] = -100
    got = nn.cross_entropy(Tensor(LOGITS), Tensor(labels.astype(np.int32))).item()
    assert got == pytest.approx(F.cross_entropy(_t(LOGITS), _t(labels)).item(), rel=1e-10)
    images = RNG.standard_normal((2, 5, 3, 3))
    pixels = RNG.integers(0, 5, size=(2, 3, 3))
    got = nn.cross_entropy(Tensor(images), Tensor(pixels.astype(np.int32))).item()
    assert got == pytest.approx(F.cross_entropy(_t(images), _t(pixels)).item(), rel=1e-10)


@needs_torch
def test_sparse_categorical_crossentropy_is_tinygrads_name_for_it():
    got = nn.sparse_categorical_crossentropy(Tensor(LOGITS), Tensor(LABELS.astype(np.int32))).item()
    assert got == pytest.approx(F.cross_entropy(_t(LOGITS), _t(LABELS)).item(), rel=1e-10)


@needs_torch
def test_mse_and_binary_losses_match_pytorch():
    a, b = RNG.standard_normal((4, 3)) * 30, RNG.uniform(0, 1, size=(4, 3))
    pos_weight = RNG.uniform(0.5, 2, size=(3,))
    x = Tensor(a, requires_grad=True)
    losses = [nn.mse_loss(x, Tensor(b)), nn.binary_cross_entropy_with_logits(x, Tensor(b)),
              nn.binary_cross_entropy_with_logits(x, Tensor(b), pos_weight=Tensor(pos_weight),
                                                  reduction="sum"),
              nn.binary_cross_entropy(x.sigmoid(), Tensor(b))]
    tx = _t(a).requires_grad_()
    tlosses = [F.mse_loss(tx, _t(b)), F.binary_cross_entropy_with_logits(tx, _t(b)),
               F.binary_cross_entropy_with_logits(tx, _t(b), pos_weight=_t(pos_weight), reduction="sum"),
               F.binary_cross_entropy(torch.sigmoid(tx), _t(b))]
    sum(losses[:3], Tensor(0.0, dtype=dtypes.float64)).backward()
    sum(tlosses[:3]).backward()
    for loss, tloss in zip(losses, tlosses):
        assert loss.item() == pytest.approx(tloss.item(), rel=1e-9)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-8, atol=1e-12)


# ---- optimizers --------------------------------------------------------------------------------
OPTIMIZERS = [
    ("sgd", lambda p: optim.SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    ("sgd_momentum_wd", lambda p: optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01)),
    ("sgd_nesterov", lambda p: optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True),
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True)),
    ("sgd_dampening", lambda p: optim.SGD(p, lr=0.05, momentum=0.8, dampening=0.3),
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, dampening=0.3)),
    ("adam", lambda p: optim.Adam(p, lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    ("adam_l2", lambda p: optim.Adam(p, lr=0.01, weight_decay=0.1),
     lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.1)),
    ("adamw", lambda p: optim.AdamW(p, lr=0.01, weight_decay=0.1),
     lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)),
]


@needs_torch
@pytest.mark.parametrize("name,make,tmake", OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
def test_optimizer_steps_match_pytorch(name, make, tmake):
    w0, x, y = RNG.standard_normal((3, 2)), RNG.standard_normal((5, 3)), RNG.standard_normal((5, 2))
    w = Tensor(w0.astype(np.float32))
    opt = make([w])
    tw = _t(w0.astype(np.float32)).requires_grad_()
    topt = tmake([tw])
    for _ in range(4):
        loss = ((Tensor(x.astype(np.float32)) @ w - Tensor(y.astype(np.float32))) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step(loss).wait()
        topt.zero_grad()
        tloss = ((_t(x.astype(np.float32)) @ tw - _t(y.astype(np.float32))) ** 2).mean()
        tloss.backward()
        topt.step()
        assert loss.item() == pytest.approx(tloss.item(), rel=1e-5)
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_optimizer_turns_on_requires_grad_and_keeps_buffers_apart():
    layer = nn.BatchNorm1d(3)
    opt = optim.SGD(nn.get_parameters(layer), lr=0.1)
    assert layer.weight.requires_grad and not layer.running_mean.requires_grad
    assert {id(t) for t in opt.params} == {id(layer.weight), id(layer.bias)}
    assert {id(t) for t in opt.buffers} == {id(layer.running_mean), id(layer.running_var),
                                           id(layer.num_batches_tracked)}


async def test_a_training_step_is_one_realize_inside_trio():
    Tensor.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), Tensor.relu, nn.Linear(8, 3))
    opt = optim.SGD(nn.get_parameters(model), lr=0.5)
    x = Tensor(RNG.standard_normal((16, 4)).astype(np.float32))
    y = Tensor(RNG.integers(0, 3, size=16).astype(np.int32))
    losses = []
    for _ in range(5):
        loss = nn.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        await Tensor.realize(loss, *opt.schedule_step())
        losses.append(loss.item())
    assert losses[-1] < losses[0]


SCHEDULES = [
    ("step", lambda o: optim.StepLR(o, 2, gamma=0.5),
     lambda o: torch.optim.lr_scheduler.StepLR(o, 2, gamma=0.5)),
    ("multistep", lambda o: optim.MultiStepLR(o, [1, 4], gamma=0.1),
     lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [1, 4], gamma=0.1)),
    ("cosine", lambda o: optim.CosineAnnealingLR(o, 5, eta_min=0.01),
     lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 5, eta_min=0.01)),
    ("onecycle", lambda o: optim.OneCycleLR(o, max_lr=1.0, total_steps=8),
     lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=1.0, total_steps=8)),
]


@needs_torch
@pytest.mark.parametrize("name,make,tmake", SCHEDULES, ids=[s[0] for s in SCHEDULES])
def test_lr_schedules_match_pytorch(name, make, tmake):
    opt = optim.SGD([Tensor([1.0])], lr=0.3)
    sched = make(opt)
    topt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.3)
    tsched = tmake(topt)
    for _ in range(7):
        assert opt.lr.item() == pytest.approx(topt.param_groups[0]["lr"], rel=1e-6)
        sched.step()
        topt.step()
        tsched.step()


# ---- state -------------------------------------------------------------------------------------
class _Net:
    def __init__(self):
        self.conv = nn.Conv2d(1, 2, 3)
        self.bn = nn.BatchNorm2d(2)
        self.layers = [nn.Linear(8, 4), nn.Linear(4, 2)]


def test_state_dict_keys_follow_attribute_paths_like_pytorch():
    keys = set(nn.get_state_dict(_Net()))
    assert keys == {"conv.weight", "conv.bias", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
                    "bn.num_batches_tracked", "layers.0.weight", "layers.0.bias", "layers.1.weight",
                    "layers.1.bias"}


@needs_torch
def test_safetensors_roundtrip_and_pytorch_opens_the_file(tmp_path):
    from safetensors.torch import load_file
    net = _Net()
    path = str(tmp_path / "model.safetensors")
    nn.safe_save(nn.get_state_dict(net), path)
    from_torch = load_file(path)
    for key, t in nn.get_state_dict(net).items():
        np.testing.assert_array_equal(from_torch[key].numpy(), t.numpy())
    other = _Net()
    nn.load_state_dict(other, nn.safe_load(path))
    for key, t in nn.get_state_dict(other).items():
        np.testing.assert_array_equal(t.numpy(), from_torch[key].numpy())


def test_load_state_dict_checks_keys_and_shapes():
    net = nn.Linear(2, 3)
    with pytest.raises(KeyError, match="missing"):
        nn.load_state_dict(net, {"weight": Tensor.zeros(3, 2)})
    with pytest.raises(ValueError, match="shape"):
        nn.load_state_dict(net, {"weight": Tensor.zeros(2, 3), "bias": Tensor.zeros(3)})
    nn.load_state_dict(net, {"weight": Tensor.ones(3, 2)}, strict=False)
    assert net.weight.numpy().tolist() == [[1, 1], [1, 1], [1, 1]]


async def test_batchnorm_and_dropout_on_a_sharded_batch_compute_what_one_device_does():
    """Batch statistics over a batch split on two devices are allreduced (synchronized batchnorm), and
    the dropout mask comes from the same counters: the result is the single-device one."""
    x = RNG.standard_normal((6, 3)).astype(np.float32)
    outputs, stats = [], []
    for devices in (None, ("CPU:0", "CPU:1")):
        Tensor.manual_seed(7)
        bn, drop = nn.BatchNorm1d(3), nn.Dropout(0.5)
        if devices:
            for t in nn.get_parameters(bn):
                t.shard_(devices)
        xt = Tensor(x).shard(devices, axis=0) if devices else Tensor(x)
        with Tensor.train():
            out = drop(bn(xt))
        await Tensor.realize(out, bn.running_mean, bn.running_var)
        outputs.append(out.numpy())
        stats.append((bn.running_mean.numpy(), bn.running_var.numpy()))
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats[1][0], stats[0][0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(stats[1][1], stats[0][1], rtol=1e-5, atol=1e-7)


@needs_torch
@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_fused_optimizer_updates_views_of_one_flat_buffer_like_pytorch(name):
    layers = [nn.Linear(3, 4), nn.Linear(4, 2)]
    params = nn.get_parameters(layers)
    tparams = [_t(p.numpy()).requires_grad_() for p in params]
    make = {"sgd": lambda p: optim.SGD(p, lr=0.1, momentum=0.9, fused=True),
            "adamw": lambda p: optim.AdamW(p, lr=0.01, weight_decay=0.1, fused=True)}[name]
    tmake = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
             "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)}[name]
    opt, topt = make(params), tmake(tparams)
    assert len(opt.targets) == 1 and opt.targets[0].shape == (3 * 4 + 4 + 4 * 2 + 2,)
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    for _ in range(3):
        loss = layers[1](layers[0](Tensor(x)).relu()).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step(loss).wait()
        hidden = (_t(x) @ tparams[0].T + tparams[1]).relu()
        tloss = (hidden @ tparams[2].T + tparams[3]).square().mean()
        topt.zero_grad()
        tloss.backward()
        topt.step()
        assert loss.item() == pytest.approx(tloss.item(), rel=1e-5)
    for p, tp in zip(params, tparams):  # the model's own tensors show the updated values
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)
