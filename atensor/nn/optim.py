"""Optimizers and learning-rate schedules, with PyTorch's update rules and tinygrad's structure.

An optimizer step is graph, not a loop over numbers: `schedule_step()` assigns each parameter its
update (and each state tensor, such as momentum, its new value) lazily and returns every tensor
that must be realized; `step()` realizes them in one task graph and returns the awaitable handle.
So a whole training step, forward, backward and update, is one realize:

    loss = loss_fn(model(x), y)
    opt.zero_grad()
    loss.backward()
    await opt.step(loss)                   # the same as: await Tensor.realize(loss, *opt.schedule_step())

The learning rate and Adam's bias corrections live in one-element tensors, not in Python floats:
a schedule that changes the rate every step then changes data, not the kernels (which are compiled
once per structure).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import numpy as np

from atensor.graph.node import Node
from atensor.graph.ops import Ops
from atensor.nn.state import load_state_dict
from atensor.porting import missing_name
from atensor.tensor.tensor import Tensor

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "LAMB", "Muon", "newton_schulz", "LRScheduler", "StepLR",
           "MultiStepLR", "CosineAnnealingLR", "OneCycleLR", "LinearWarmup", "WarmupCosineLR"]


def _constant(values: np.ndarray, like: Tensor) -> Tensor:
    """A tensor with storage holding `values`, on `like`'s device (replicated when it is sharded)."""
    t = Tensor(values)
    if isinstance(like.device, tuple):
        return t.shard(like.device).clone()
    return t.to(like.device).clone() if like.device != t.device else t


def _scalar(value: float, like: Tensor) -> Tensor:
    """A one-element float32 tensor with storage, on `like`'s device (replicated when it is sharded)."""
    return _constant(np.array([value], dtype=np.float32), like)


def _state_like(t: Tensor) -> Tensor:
    """Zeros with storage, laid out like `t` (an optimizer's per-parameter state)."""
    return Tensor.zeros(*t.shape, dtype=t.dtype, device=t.device).clone().requires_grad_(False)


def _dedup(tensors: Sequence[Tensor]) -> list[Tensor]:
    unique: dict[int, Tensor] = {}
    for t in tensors:
        unique.setdefault(id(t), t)
    return list(unique.values())


def _fuse(params: list[Tensor]) -> Optional[Tensor]:
    """One flat tensor that becomes the storage of all `params` (each parameter turns into a view of
    its slice, holding the same values), or None when they differ in dtype or devices. A replicated
    parameter set gets one flat buffer per device."""
    dtype, devices = params[0].dtype, params[0].device
    if len(params) < 2 or any(p.dtype != dtype or p.device != devices for p in params):
        return None
    bounds, start = [], 0
    for p in params:
        bounds.append((start, start + p.numel()))
        start += p.numel()

    def flat_on(device: str, parts: list[Tensor]) -> Tensor:
        flat = Tensor.empty(start, dtype=dtype, device=device)
        for part, (a, b) in zip(parts, bounds):
            flat[a:b].assign(part.reshape(-1))  # lazily: the values move in with the next realize
        return flat

    if isinstance(devices, tuple):
        flats = [flat_on(dev, [p.shards[k] for p in params]) for k, dev in enumerate(devices)]
        flat = Tensor(Node.make(Ops.MULTI, dtype, tuple(f.node for f in flats), (None, None)))
        for p, (a, b) in zip(params, bounds):
            views = tuple(f.node.shrink(((a, b),)).reshape(p.shape) for f in flats)
            p._node = Node.make(Ops.MULTI, dtype, views, (None, None))
    else:
        flat = flat_on(devices, params)
        for p, (a, b) in zip(params, bounds):
            p._node = flat.node.shrink(((a, b),)).reshape(p.shape)
    flat.requires_grad = True
    return flat


class Optimizer:
    """Holds the parameters (tensors with `requires_grad`; those left at None are switched on) and
    the buffers (tensors given with `requires_grad=False`, such as batchnorm running statistics),
    which each step realizes along so their pending assigns never pile up.

    `fused=True` moves all parameters into one flat buffer (per device) that they become views of,
    as tinygrad's FUSE_OPTIM and PyTorch's flat-parameter schemes do: the gradient is then one flat
    tensor (one allreduce for data parallel training) and the update a few kernels over it instead
    of a few per parameter.

    `max_grad_norm` clips the gradients as `torch.nn.utils.clip_grad_norm_` does before the update:
    every gradient times min(1, max_grad_norm / (norm + 1e-6)), `norm` the 2-norm of all of them
    together; each step leaves that norm (before clipping) in `grad_norm`, a tensor of the step's
    graph (realize it with the step to read it)."""

    def __init__(self, params: Sequence[Tensor], lr: float, fused: bool = False,
                 max_grad_norm: Optional[float] = None):
        for t in params:
            if t.requires_grad is None:
                t.requires_grad = True
        self.params = _dedup([t for t in params if t.requires_grad])
        self.buffers = _dedup([t for t in params if not t.requires_grad])
        if not self.params:
            raise ValueError("optimizer got no parameters that require grad")
        flat = _fuse(self.params) if fused else None
        self.targets = [flat] if flat is not None else self.params  # what the update runs on
        self.initial_lr = lr
        self._consts: dict[tuple, Tensor] = {}
        self.lr = _scalar(lr, self.params[0])
        self.state: list[Tensor] = [self.lr]
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be positive (or None: no clipping), got {max_grad_norm}")
        self.max_grad_norm = max_grad_norm
        self.grad_norm: Optional[Tensor] = None

    def _c(self, value: float, like: Tensor) -> Tensor:
        """A constant shaped and placed like `like`, made once: building an update from cached
        constants skips the scalar-broadcast work of every `tensor * 0.9` (graph building is on the
        step's critical path)."""
        key = (value, like.shape, like.dtype, like.device)
        found = self._consts.get(key)
        if found is None:
            found = self._consts[key] = Tensor.full(like.shape, value, dtype=like.dtype, device=like.device)
        return found

    def zero_grad(self) -> None:
        """Forgets the gradients (the next backward sets them afresh)."""
        for t in self.params + self.targets:
            t.grad = None

    def schedule_step(self) -> list[Tensor]:
        """Assigns every parameter its update (lazily) and returns all tensors to realize."""
        targets = self.targets
        if all(t.grad is None for t in targets):
            raise RuntimeError("optimizer step without gradients: call loss.backward() first")
        grads = [t.grad if t.grad is not None else t.zeros_like() for t in targets]
        devices = targets[0].device
        if not isinstance(devices, tuple):
            self._update(targets, self._clipped(grads, first=True), lambda t: t)
            return targets + self.buffers + self.state
        # replicated parameters: every device updates its own replica from the (allreduced) gradient,
        # built per device on the shards, which is cheaper than pushing each op through MULTI
        for k in range(len(devices)):
            picked: dict[int, Tensor] = {}

            def on_device(t: Tensor, k: int = k, picked: dict[int, Tensor] = picked) -> Tensor:
                if id(t) not in picked:
                    if t.device != devices:
                        raise ValueError(f"optimizer tensors on {t.device}, parameters on {devices}")
                    picked[id(t)] = t.shards[k]
                return picked[id(t)]
            self._update([on_device(t) for t in targets], self._clipped([on_device(g) for g in grads], k == 0),
                         on_device)
        return targets + self.buffers + self.state

    def _clipped(self, grads: list[Tensor], first: bool) -> list[Tensor]:
        """`grads` scaled to a total 2-norm of at most `max_grad_norm` (PyTorch's clip_grad_norm_
        rule); the norm goes to `grad_norm` when `first` (the first device's, for replicated ones)."""
        if self.max_grad_norm is None:
            return grads
        squares = [(g.float() * g.float()).sum() for g in grads]
        norm = squares[0]
        for more in squares[1:]:
            norm = norm + more
        norm = norm.sqrt()
        if first:
            self.grad_norm = norm
        scale = (self.max_grad_norm / (norm + 1e-6)).minimum(1.0)
        return [g * scale.cast(g.dtype) for g in grads]

    def state_dict(self) -> dict[str, Tensor]:
        """The optimizer's state tensors by attribute name, for a checkpoint: "lr", and per update
        target i its slots ("m.0", "v.0" for Adam; "b.0" for SGD) and running values ("b1_t")."""
        kept = {id(t) for t in self.state}
        out: dict[str, Tensor] = {}
        for name, value in vars(self).items():
            if name == "state":
                continue
            if isinstance(value, Tensor) and id(value) in kept:
                out[name] = value
            elif isinstance(value, list):
                out.update((f"{name}.{i}", t) for i, t in enumerate(value) if isinstance(t, Tensor) and id(t) in kept)
        return out

    def load_state_dict(self, arrays: dict[str, Any]) -> list[Tensor]:
        """Assigns a `state_dict()`'s saved values (arrays or tensors) into this optimizer's state
        (lazily; realize the returned tensors, or just step: the assigns run first). The keys and
        shapes must match: the same model, optimizer and `fused` setting."""
        return load_state_dict(self.state_dict(), arrays)

    def step(self, *also: Tensor) -> Any:
        """Realizes one update of every parameter, together with `also` (pass the loss: a value that
        reads the parameters must be realized before or with the update that overwrites them);
        returns the first of them, awaitable for all: `await opt.step(loss)`."""
        tensors = [*also, *self.schedule_step()]
        return tensors[0].realize(*tensors[1:])

    def _update(self, params: list[Tensor], grads: list[Tensor], state: Callable[[Tensor], Tensor]) -> None:
        """Assigns the update to `params` (single-device tensors); `state(t)` is the optimizer state
        tensor `t` as seen on the same device as `params`."""
        raise NotImplementedError


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, Nesterov momentum and (L2) weight decay, PyTorch's
    rule: d = g + wd * p; b = momentum * b + (1 - dampening) * d (b = d on the first step);
    d = d + momentum * b (nesterov) or b; p = p - lr * d."""

    def __init__(self, params: Sequence[Tensor], lr: float = 0.001, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, dampening: float = 0.0,
                 fused: bool = False):
        super().__init__(params, lr, fused)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("nesterov momentum needs momentum > 0 and no dampening")
        self.momentum, self.wd, self.nesterov, self.dampening = momentum, weight_decay, nesterov, dampening
        self.b = [_state_like(t) for t in self.targets] if momentum else []
        self.first = _scalar(1.0, self.params[0]) if momentum and dampening else None
        self.state += self.b + ([self.first] if self.first is not None else [])

    def _update(self, params: list[Tensor], grads: list[Tensor], state: Callable[[Tensor], Tensor]) -> None:
        c, lr = self._c, state(self.lr)
        first = None if self.first is None else state(self.first)
        inflow_scale = None if first is None else 1 - (1 - first) * self.dampening  # (1,)
        for i, (t, g) in enumerate(zip(params, grads)):
            p = t.detach()
            d = g + p * c(self.wd, p) if self.wd else g
            if self.momentum:
                inflow = d if inflow_scale is None else d * inflow_scale
                b = state(self.b[i])
                b.assign(b * c(self.momentum, p) + inflow)
                d = d + b * c(self.momentum, p) if self.nesterov else b
            t.assign((p - d * lr).cast(t.dtype))
        if first is not None:
            first.assign(first * 0)


def _decay_masks(opt: Optimizer, exempt: Sequence[Tensor]) -> list[Optional[Tensor]]:
    """Per update target, where weight decay applies: None (all of it), or a 0/1 tensor laid out like
    the target (the fused flat buffer, where exempt parameters' slices are 0). An unfused exempt
    parameter is left out of `decayed` instead (no mask to read)."""
    skip = {id(t) for t in exempt}
    unknown = skip - {id(t) for t in opt.params}
    if unknown:
        raise ValueError(f"{len(unknown)} tensor(s) exempted from weight decay are not parameters of the optimizer")
    if not skip or opt.targets is opt.params:
        return [None] * len(opt.targets)
    flat = opt.targets[0]
    mask = np.concatenate([np.full(p.numel(), 0.0 if id(p) in skip else 1.0, flat.dtype.np) for p in opt.params])
    return [_constant(mask, flat)]


def _init_moments(opt: Optimizer, b1: float, b2: float, eps: float, wd: float) -> None:
    """Adam's and LAMB's state: the running powers b1^t, b2^t and the first and second moments."""
    opt.b1, opt.b2, opt.eps, opt.wd = b1, b2, eps, wd
    opt.b1_t, opt.b2_t = _scalar(1.0, opt.params[0]), _scalar(1.0, opt.params[0])
    opt.m = [_state_like(t) for t in opt.targets]
    opt.v = [_state_like(t) for t in opt.targets]
    opt.state += [opt.b1_t, opt.b2_t] + opt.m + opt.v


def _advance_powers(opt: Optimizer, state: Callable[[Tensor], Tensor]) -> tuple[Tensor, Tensor]:
    """One step of b1^t and b2^t, assigned in place: (b1^t, b2^t) after this step."""
    return (state(opt.b1_t).assign(state(opt.b1_t) * opt.b1),
            state(opt.b2_t).assign(state(opt.b2_t) * opt.b2))


class Adam(Optimizer):
    """Adam (Kingma and Ba) with bias correction, PyTorch's rule; `weight_decay` adds wd * p to the
    gradient (L2); AdamW decouples it instead. `no_decay`: parameters weight decay leaves alone (as a
    PyTorch parameter group with weight_decay 0 would: biases and norms, in GPT training)."""
    decoupled = False

    def __init__(self, params: Sequence[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.0, betas: Optional[tuple[float, float]] = None,
                 fused: bool = False, max_grad_norm: Optional[float] = None, no_decay: Sequence[Tensor] = ()):
        super().__init__(params, lr, fused, max_grad_norm)
        if betas is not None:
            b1, b2 = betas
        _init_moments(self, b1, b2, eps, weight_decay)
        self.decay_masks = _decay_masks(self, no_decay)
        exempt = {id(t) for t in no_decay}
        self.decayed = [bool(weight_decay) and id(t) not in exempt for t in self.targets]  # fused: and the mask
        self.state += [m for m in self.decay_masks if m is not None]

    def _update(self, params: list[Tensor], grads: list[Tensor], state: Callable[[Tensor], Tensor]) -> None:
        c, lr = self._c, state(self.lr)
        b1_t, b2_t = _advance_powers(self, state)
        # the bias corrections as two one-element factors:
        # lr * m_hat / (sqrt(v_hat) + eps) = step * m / (sqrt(v) * root + eps)
        step = lr / (1.0 - b1_t)
        root = (1.0 - b2_t).rsqrt()
        for i, (t, g) in enumerate(zip(params, grads)):
            p = t.detach()
            mask = None if self.decay_masks[i] is None else state(self.decay_masks[i])
            decays = self.decayed[i]
            if decays and not self.decoupled:
                g = g + (p * c(self.wd, p) if mask is None else p * mask * c(self.wd, p))
            m, v = state(self.m[i]), state(self.v[i])
            m = m.assign(m * c(self.b1, p) + g * c(1.0 - self.b1, p))
            v = v.assign(v * c(self.b2, p) + (g * g) * c(1.0 - self.b2, p))
            update = m * step / (v.sqrt() * root + c(self.eps, p))
            if decays and self.decoupled:
                decay = p * (lr * self.wd)
                update = update + (decay if mask is None else decay * mask)
            t.assign((p - update).cast(t.dtype))


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter): p = p - lr * (update + wd * p)."""
    decoupled = True

    def __init__(self, params: Sequence[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.01, betas: Optional[tuple[float, float]] = None,
                 fused: bool = False, max_grad_norm: Optional[float] = None, no_decay: Sequence[Tensor] = ()):
        super().__init__(params, lr, b1, b2, eps, weight_decay, betas, fused, max_grad_norm, no_decay)


class LAMB(Optimizer):
    """LAMB (You et al.), tinygrad's rule: Adam's bias-corrected step plus decoupled weight decay,
    up = m_hat / (sqrt(v_hat) + eps) + wd * p, scaled per parameter by the trust ratio
    r = |p| / |up| (1 where either norm is 0): p = p - lr * r * up. Per parameter, so not `fused`."""

    def __init__(self, params: Sequence[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-6, weight_decay: float = 0.0):
        if weight_decay < 0:
            raise ValueError(f"LAMB weight_decay must be >= 0, got {weight_decay}")
        super().__init__(params, lr)
        _init_moments(self, b1, b2, eps, weight_decay)

    def _update(self, params: list[Tensor], grads: list[Tensor], state: Callable[[Tensor], Tensor]) -> None:
        lr = state(self.lr)
        b1_t, b2_t = _advance_powers(self, state)
        for i, (t, g) in enumerate(zip(params, grads)):
            p = t.detach()
            m, v = state(self.m[i]), state(self.v[i])
            m = m.assign(m * self.b1 + g * (1.0 - self.b1))
            v = v.assign(v * self.b2 + (g * g) * (1.0 - self.b2))
            up = (m / (1.0 - b1_t)) / ((v / (1.0 - b2_t)).sqrt() + self.eps) + p * self.wd
            r1, r2 = (p * p).sum().sqrt(), (up * up).sum().sqrt()
            trust = (r1 > 0).where((r2 > 0).where(r1 / r2, 1.0), 1.0)
            t.assign((p - up * (lr * trust)).cast(t.dtype))


def newton_schulz(g: Tensor, steps: int, coefficients: Sequence[float], eps: float = 1e-7) -> Tensor:
    """The Newton-Schulz iteration of an odd polynomial (tinygrad's `Tensor.newton_schulz`): `g` scaled
    to unit Frobenius norm, then `steps` times G = sum_i c_i (G G^T)^i G, on the last two axes (the
    wide orientation: a tall matrix is transposed in and out). With Muon's coefficients it takes G
    towards the nearest semi-orthogonal matrix."""
    if g.ndim < 2:
        raise ValueError(f"newton_schulz needs two or more axes, got shape {g.shape}")
    if g.shape[-2] > g.shape[-1]:
        return newton_schulz(g.transpose(-2, -1), steps, coefficients, eps).transpose(-2, -1)
    x = g / ((g * g).sum(axis=(-2, -1), keepdim=True).sqrt() + eps)
    for _ in range(steps):
        gram = x @ x.transpose(-2, -1)
        term, total = x, x * coefficients[0]
        for c in coefficients[1:]:
            term = gram @ term
            total = total + term * c
        x = total
    return x


class Muon(Optimizer):
    """Muon (Jordan et al.), tinygrad's rule: momentum b = momentum * b + g, the direction
    d = g + momentum * b (Nesterov) or b, orthogonalized by `newton_schulz` on the parameter seen as
    (shape[0], rest), then p = p - lr * d - lr * wd * p (weight decay after the momentum). Every
    parameter, biases too, as in tinygrad. Per parameter, so not `fused`."""

    def __init__(self, params: Sequence[Tensor], lr: float = 0.001, momentum: float = 0.95,
                 weight_decay: float = 0.1, ns_steps: int = 5,
                 ns_coefficients: Sequence[float] = (3.4445, -4.775, 2.0315), nesterov: bool = True):
        if momentum < 0:
            raise ValueError(f"Muon momentum must be >= 0, got {momentum}")
        super().__init__(params, lr)
        self.momentum, self.wd, self.nesterov = momentum, weight_decay, nesterov
        self.ns_steps, self.ns_coefficients = ns_steps, tuple(ns_coefficients)
        self.b = [_state_like(t) for t in self.targets] if momentum else []
        self.state += self.b

    def _update(self, params: list[Tensor], grads: list[Tensor], state: Callable[[Tensor], Tensor]) -> None:
        lr = state(self.lr)
        for i, (t, g) in enumerate(zip(params, grads)):
            p = t.detach()
            if self.momentum:
                b = state(self.b[i])
                b = b.assign(b * self.momentum + g)
                g = g + b * self.momentum if self.nesterov else b
            d = newton_schulz(g.reshape(g.shape[0], -1), self.ns_steps, self.ns_coefficients).reshape(g.shape)
            update = d * lr + p * (lr * self.wd) if self.wd else d * lr
            t.assign((p - update).cast(t.dtype))


# ---- learning-rate schedules ---------------------------------------------------------------------
class LRScheduler:
    """Sets the optimizer's learning rate from the number of `step()` calls so far (PyTorch's
    convention: call `scheduler.step()` after `optimizer.step()`), relative to the rate the
    optimizer was made with. The new rate is assigned into the optimizer's rate tensor and takes
    effect in the next realized step."""

    def __init__(self, optimizer: Optimizer):
        self.optimizer = optimizer
        self.lr0 = optimizer.initial_lr
        self.epoch = 0
        self._set(self.get_lr())

    def get_lr(self) -> float:
        raise NotImplementedError

    def step(self) -> None:
        self.epoch += 1
        self._set(self.get_lr())

    def _set(self, value: float) -> None:
        self.last_lr = value
        self.optimizer.lr.assign(_scalar(value, self.optimizer.lr))


class StepLR(LRScheduler):
    """lr = base * gamma ** (epoch // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer)

    def get_lr(self) -> float:
        return self.lr0 * self.gamma ** (self.epoch // self.step_size)


class MultiStepLR(LRScheduler):
    """lr = base * gamma ** (number of milestones reached)."""

    def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1):
        self.milestones, self.gamma = sorted(milestones), gamma
        super().__init__(optimizer)

    def get_lr(self) -> float:
        return self.lr0 * self.gamma ** sum(1 for m in self.milestones if self.epoch >= m)


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base - eta_min) * (1 + cos(pi * epoch / T_max)) / 2."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0):
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer)

    def get_lr(self) -> float:
        cosine = (1 + math.cos(math.pi * self.epoch / self.T_max)) / 2
        return self.eta_min + (self.lr0 - self.eta_min) * cosine


class OneCycleLR(LRScheduler):
    """PyTorch's one-cycle schedule (cosine annealing): from max_lr / div_factor up to max_lr over
    pct_start of the steps, then down to max_lr / (div_factor * final_div_factor)."""

    def __init__(self, optimizer: Optimizer, max_lr: float, total_steps: int, pct_start: float = 0.3,
                 div_factor: float = 25.0, final_div_factor: float = 1e4):
        self.max_lr, self.total_steps = max_lr, total_steps
        self.initial, self.final = max_lr / div_factor, max_lr / (div_factor * final_div_factor)
        self.up = pct_start * total_steps - 1  # the step at which max_lr is reached (PyTorch's phase end)
        super().__init__(optimizer)

    def get_lr(self) -> float:
        def anneal(start: float, end: float, frac: float) -> float:
            return end + (start - end) * (1 + math.cos(math.pi * min(max(frac, 0.0), 1.0))) / 2
        if self.epoch <= self.up:
            return anneal(self.initial, self.max_lr, self.epoch / self.up if self.up > 0 else 1.0)
        return anneal(self.max_lr, self.final, (self.epoch - self.up) / (self.total_steps - 1 - self.up))


class LinearWarmup(LRScheduler):
    """lr rises linearly from base * start_factor to base over `warmup_steps`, then stays."""

    def __init__(self, optimizer: Optimizer, warmup_steps: int, start_factor: float = 0.1):
        self.warmup_steps, self.start_factor = warmup_steps, start_factor
        super().__init__(optimizer)

    def get_lr(self) -> float:
        frac = min(1.0, self.epoch / max(1, self.warmup_steps))
        return self.lr0 * (self.start_factor + (1 - self.start_factor) * frac)


class WarmupCosineLR(LRScheduler):
    """GPT training's schedule (nanoGPT's get_lr): lr rises linearly to the base rate over
    `warmup_steps` (base * (step + 1) / warmup_steps), then follows a half cosine down to `min_lr` at
    `total_steps`, and stays there."""

    def __init__(self, optimizer: Optimizer, warmup_steps: int, total_steps: int, min_lr: float = 0.0):
        if warmup_steps < 0 or total_steps < 1:
            raise ValueError(f"WarmupCosineLR needs warmup_steps >= 0 and total_steps >= 1, got "
                             f"{warmup_steps} and {total_steps}")
        self.warmup_steps, self.total_steps, self.min_lr = warmup_steps, total_steps, min_lr
        super().__init__(optimizer)

    def get_lr(self) -> float:
        if self.epoch < self.warmup_steps:
            return self.lr0 * (self.epoch + 1) / self.warmup_steps
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (self.epoch - self.warmup_steps) / decay_steps)
        return self.min_lr + (self.lr0 - self.min_lr) * (1 + math.cos(math.pi * progress)) / 2


def __getattr__(name: str) -> object:
    """tinygrad's names this module lacks raise an error naming docs/porting.md."""
    raise missing_name("atensor.nn.optim", name)
