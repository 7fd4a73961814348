"""`nn.datasets.mnist()`: tinygrad's MNIST tensors, from data on this machine (no downloads at run time).

tinygrad's `mnist()` downloads the four idx files and returns (X_train, Y_train, X_test, Y_test) as
uint8 tensors of shapes (60000, 1, 28, 28), (60000,), (10000, 1, 28, 28), (10000,). atensor returns the
same dtypes and layout from one of two sources:

- MNIST's own idx files, when a folder holding them is given (`mnist(path=...)` or the ATENSOR_MNIST_DIR
  setting): train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
  t10k-labels-idx1-ubyte, each plain or .gz (Fashion-MNIST's files have the same names);
- otherwise scikit-learn's bundled digits (1797 8x8 images, 0-16), made MNIST-like: each image scaled to
  0-255, enlarged 3x to 24x24 (nearest pixel) and padded by 2 to 28x28, as MNIST centres a 20x20 digit
  in 28x28. A fixed shuffle splits them 1500 train / 297 test. Small, but the same model trains on it.
"""
from __future__ import annotations

import gzip
import os
from typing import Optional

import numpy as np

from atensor.config import settings
from atensor.porting import missing_name
from atensor.tensor.tensor import Tensor

FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
DIGITS_TRAIN = 1500


def _how_to_provide(what: str) -> str:
    return (f"{what}: atensor downloads nothing at run time. Put MNIST's (or Fashion-MNIST's) four idx files "
            f"({', '.join(FILES)}, plain or .gz) in a folder and call mnist(path=folder), or set "
            f"ATENSOR_MNIST_DIR=folder; mnist() without them uses scikit-learn's digits")


def _read_idx(folder: str, name: str) -> np.ndarray:
    """One idx file's array (its header says the dtype is ubyte and gives the shape)."""
    for candidate in (os.path.join(folder, name), os.path.join(folder, name + ".gz")):
        if os.path.exists(candidate):
            opener = gzip.open if candidate.endswith(".gz") else open
            with opener(candidate, "rb") as f:
                raw = f.read()
            if raw[:2] != b"\x00\x00" or raw[2] != 0x08:
                raise ValueError(f"{candidate} is not an idx file of unsigned bytes (magic {raw[:4].hex()})")
            dims = raw[3]
            shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims))
            return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)
    raise FileNotFoundError(_how_to_provide(f"{name} (or {name}.gz) is not in {folder!r}"))


def digits_as_mnist() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's digits in MNIST's layout (see the module docstring), as numpy arrays."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError(_how_to_provide("scikit-learn (pip install scikit-learn) is not installed")) from None
    digits = load_digits()
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)             # (1797, 8, 8), 0-255
    images = images.repeat(3, axis=1).repeat(3, axis=2)                        # (1797, 24, 24)
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))[:, None]                 # (1797, 1, 28, 28)
    labels = digits.target.astype(np.uint8)
    order = np.random.default_rng(0).permutation(len(labels))
    train, test = order[:DIGITS_TRAIN], order[DIGITS_TRAIN:]
    return images[train], labels[train], images[test], labels[test]


def mnist(device: Optional[str] = None, fashion: bool = False,
          path: Optional[str] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(X_train, Y_train, X_test, Y_test) as uint8 tensors, X of shape (N, 1, 28, 28), Y of shape (N,),
    tinygrad's; from MNIST's files in `path` (or ATENSOR_MNIST_DIR), else from scikit-learn's digits.
    `fashion=True` needs Fashion-MNIST's files in such a folder: there is no local stand-in for them.

    >>> x_train, y_train, x_test, y_test = mnist()
    >>> x_train.shape, y_train.shape, x_train.dtype
    ((1500, 1, 28, 28), (1500,), dtypes.uint8)
    """
    folder = path or settings.mnist_dir
    if folder is not None:
        arrays = [_read_idx(folder, name) for name in FILES]
        arrays[0], arrays[2] = arrays[0].reshape(-1, 1, 28, 28), arrays[2].reshape(-1, 1, 28, 28)
    elif fashion:
        raise FileNotFoundError(_how_to_provide("mnist(fashion=True) needs Fashion-MNIST's files"))
    else:
        arrays = list(digits_as_mnist())
    return tuple(Tensor(a, device=device) for a in arrays)  # type: ignore[return-value]


def __getattr__(name: str) -> object:
    """tinygrad's names this module lacks raise an error naming docs/porting.md."""
    raise missing_name("atensor.nn.datasets", name)
