"""Train a small convolutional digit classifier with atensor's tinygrad-compatible API.

    python examples/conv_digits.py                          # 100 steps of 128: ~99% held-out, ~30 s of CPU
    python examples/conv_digits.py --steps 30 --seed 1
    ATENSOR_MNIST_DIR=~/mnist python examples/conv_digits.py --steps 500 --batch-size 512

The data is `atensor.nn.datasets.mnist()`: tinygrad's loader, which here gives scikit-learn's 8x8 digits
drawn into MNIST's layout (uint8 28x28 images, 1500 for training and 297 held out), or MNIST itself when
ATENSOR_MNIST_DIR names a folder holding its idx files (docs/porting.md).

What it shows, all through the names a tinygrad program uses:
- the network is two `ConvBlock`s (two valid convolutions with ReLU, a BatchNorm, a 2x2 max-pool) and a
  linear head: 28x28 -> 24 -> 20 -> 10 -> 8 -> 6 -> 3, then 64*3*3 features -> 10 logits;
- the training step is a `TinyJit` function run under `Context(TRAINING=1)`: it draws its batch with
  `Tensor.randint` on the device, so every replay of the captured step sees a new batch and its BatchNorms
  normalize with the batch's statistics while updating their running ones;
- the evaluation is a second `TinyJit` function outside training mode, so the BatchNorms use the running
  statistics, and it scores the held-out images that training never sees.

bench/conv_steps.py times this `Model`'s forward, backward and Adam step against PyTorch.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Optional

from atensor import Context, Tensor, TinyJit, nn
from atensor.nn.datasets import mnist


class ConvBlock:
    """conv(k) -> ReLU -> conv(k) -> ReLU -> BatchNorm -> 2x2 max-pool; no padding, so an s x s input
    comes out ((s - 2(k-1)) // 2) on each side."""

    def __init__(self, channels_in: int, channels_out: int, kernel: int) -> None:
        self.convs = [nn.Conv2d(channels_in, channels_out, kernel), nn.Conv2d(channels_out, channels_out, kernel)]
        self.norm = nn.BatchNorm(channels_out)

    def __call__(self, x: Tensor) -> Tensor:
        for conv in self.convs:
            x = conv(x).relu()
        return self.norm(x).max_pool2d()


class Model:
    """Two conv blocks (1 -> 32 channels with 5x5 kernels, 32 -> 64 with 3x3) and a linear head over
    the 64x3x3 features of a 28x28 image."""

    def __init__(self) -> None:
        self.blocks = [ConvBlock(1, 32, 5), ConvBlock(32, 64, 3)]
        self.head = nn.Linear(64 * 3 * 3, 10)

    def __call__(self, images: Tensor) -> Tensor:
        x = images
        for block in self.blocks:
            x = block(x)
        return self.head(x.flatten(1))


@dataclass(frozen=True)
class Result:
    """What a run ends with: the last step's training loss and the held-out accuracy in percent."""
    loss: float
    test_accuracy: float


OPTIMIZERS = {"adam": nn.optim.Adam, "adamw": nn.optim.AdamW, "muon": nn.optim.Muon}


def train(steps: int, batch_size: int, seed: int, optimizer: str = "adam", eval_every: int = 10) -> Result:
    """Trains a fresh `Model` for `steps` jitted steps of `batch_size` random training images, printing the
    loss and the held-out accuracy every `eval_every` steps and after the last one."""
    Tensor.manual_seed(seed)
    x_train, y_train, x_test, y_test = mnist()
    model = Model()
    opt = OPTIMIZERS[optimizer](nn.state.get_parameters(model))

    @TinyJit
    @Context(TRAINING=1)
    def train_step() -> Tensor:
        picked = Tensor.randint(batch_size, high=x_train.shape[0])
        opt.zero_grad()
        loss = model(x_train[picked]).sparse_categorical_crossentropy(y_train[picked]).backward()
        return loss.realize(*opt.schedule_step())

    @TinyJit
    def test_accuracy() -> Tensor:
        predicted = model(x_test).argmax(axis=1)
        return (predicted == y_test).mean() * 100

    loss, accuracy = float("nan"), float("nan")
    for step in range(1, steps + 1):
        loss = train_step().item()
        if step % eval_every == 0 or step == steps:
            accuracy = test_accuracy().item()
            print(f"step {step:4d}/{steps}  loss {loss:6.3f}  test accuracy {accuracy:6.2f}%", flush=True)
    return Result(loss, accuracy)


def main(argv: Optional[list[str]] = None) -> Result:
    """Parses the flags, trains, prints the final held-out accuracy and returns the run's `Result`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    parser.add_argument("--batch-size", type=int, default=128, help="images per step (default 128)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the weights and the batches (default 0)")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam")
    parser.add_argument("--eval-every", type=int, default=10, help="steps between evaluations (default 10)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.eval_every < 1:
        parser.error("--steps, --batch-size and --eval-every must be at least 1")
    result = train(args.steps, args.batch_size, args.seed, args.optimizer, args.eval_every)
    print(f"final test accuracy: {result.test_accuracy:.2f}% after {args.steps} steps of {args.batch_size}")
    return result


if __name__ == "__main__":
    main()
