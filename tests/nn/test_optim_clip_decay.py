"""AdamW's weight-decay exemptions and gradient clipping, WarmupCosineLR and the optimizer's state_dict,
against PyTorch (a parameter group without decay, clip_grad_norm_, the same schedule by formula)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from atensor import Tensor
from atensor.nn import optim
from tests.torch_reference import needs_torch, torch

RNG = np.random.default_rng(0)
WEIGHTS = [RNG.standard_normal(s).astype(np.float32) for s in [(4, 3), (3,), (5, 2)]]
X = RNG.standard_normal((6, 4)).astype(np.float32)


def _atensor_run(fused: bool, steps: int = 3):
    params = [Tensor(w.copy()) for w in WEIGHTS]
    for p in params:
        p.requires_grad = True
    opt = optim.AdamW(params, lr=0.1, betas=(0.9, 0.95), weight_decay=0.5, fused=fused, max_grad_norm=0.3,
                      no_decay=[params[1]])
    norms = []
    for _ in range(steps):
        loss = (Tensor(X) @ params[0] + params[1]).tanh().sum() * 3 + (params[2] * params[2]).sum()
        opt.zero_grad()
        loss.backward()
        update = opt.schedule_step()
        loss.realize(opt.grad_norm, *update).wait()
        norms.append(opt.grad_norm.item())
    return params, opt, norms


@needs_torch
@pytest.mark.parametrize("fused", [False, True])
def test_adamw_with_exempt_parameters_and_clipping_equals_torch(fused):
    params, _, norms = _atensor_run(fused)
    ref = [torch.tensor(w.copy(), requires_grad=True) for w in WEIGHTS]
    opt = torch.optim.AdamW([{"params": [ref[0], ref[2]], "weight_decay": 0.5},
                             {"params": [ref[1]], "weight_decay": 0.0}], lr=0.1, betas=(0.9, 0.95))
    ref_norms = []
    for _ in range(3):
        loss = (torch.tensor(X) @ ref[0] + ref[1]).tanh().sum() * 3 + (ref[2] * ref[2]).sum()
        opt.zero_grad()
        loss.backward()
        ref_norms.append(float(torch.nn.utils.clip_grad_norm_(ref, 0.3)))
        opt.step()
    np.testing.assert_allclose(norms, ref_norms, rtol=1e-5)
    for got, want in zip(params, ref):
        np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_state_dict_round_trip_continues_the_same_run():
    params, opt, _ = _atensor_run(fused=True, steps=2)
    saved = {k: v.numpy() for k, v in opt.state_dict().items()}
    assert {"lr", "b1_t", "b2_t", "m.0", "v.0"} <= set(saved)
    weights = [p.numpy() for p in params]
    fresh = [Tensor(w.copy()) for w in weights]
    for p in fresh:
        p.requires_grad = True
    opt2 = optim.AdamW(fresh, lr=0.1, betas=(0.9, 0.95), weight_decay=0.5, fused=True, max_grad_norm=0.3,
                       no_decay=[fresh[1]])
    Tensor.realize(*opt2.load_state_dict(saved)).wait()
    for ps, o in ((params, opt), (fresh, opt2)):
        loss = (Tensor(X) @ ps[0] + ps[1]).tanh().sum() * 3 + (ps[2] * ps[2]).sum()
        o.zero_grad()
        loss.backward()
        update = o.schedule_step()
        loss.realize(*update).wait()
    for a, b in zip(params, fresh):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_warmup_cosine_rises_linearly_then_follows_the_half_cosine():
    p = Tensor(np.zeros(2, np.float32))
    p.requires_grad = True
    schedule = optim.WarmupCosineLR(optim.SGD([p], lr=1.0), warmup_steps=4, total_steps=14, min_lr=0.1)
    rates = [schedule.last_lr]
    for _ in range(15):
        schedule.step()
        rates.append(schedule.last_lr)
    assert rates[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert rates[4] == pytest.approx(1.0)
    assert rates[9] == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi * 0.5)) / 2)
    assert rates[14] == pytest.approx(0.1) and rates[15] == pytest.approx(0.1)


def test_clipping_and_exemptions_refuse_bad_arguments():
    p = Tensor(np.zeros(2, np.float32))
    p.requires_grad = True
    with pytest.raises(ValueError, match="max_grad_norm"):
        optim.AdamW([p], max_grad_norm=0.0)
    with pytest.raises(ValueError, match="not parameters"):
        optim.AdamW([p], no_decay=[Tensor(np.zeros(1, np.float32))])
