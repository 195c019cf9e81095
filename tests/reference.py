"""NumPy references of the math the federated computations must reproduce."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import numpy as np


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def mclr_sgd(
    w: np.ndarray,
    b: np.ndarray,
    batches: Sequence[tuple[np.ndarray, np.ndarray]],
    lr: float,
    mu: float = 0.0,
    momentum: float = 0.0,
    kernel_pull: Optional[tuple[float, np.ndarray]] = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Local SGD of multinomial logistic regression with FedProx term toward the start and
    momentum; `kernel_pull = (strength, target)` adds strength/2 ||w - target||^2 on the kernel
    only (an anchor over some tensors)."""
    w0, b0 = w.astype(np.float64), b.astype(np.float64)
    w, b = w0.copy(), b0.copy()
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    for x, y in batches:
        p = softmax(x @ w + b)
        p[np.arange(len(y)), y] -= 1.0
        gw, gb = x.T @ p / len(y), p.mean(axis=0)
        if kernel_pull is not None:
            gw = gw + kernel_pull[0] * (w - kernel_pull[1])
        vw = momentum * vw + gw + mu * (w - w0)
        vb = momentum * vb + gb + mu * (b - b0)
        w, b = w - lr * vw, b - lr * vb
    return w, b


def mclr_mean_loss(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    p = softmax(x.astype(np.float64) @ w + b)
    return float(-np.log(p[np.arange(len(y)), y]).mean())


def weighted_mean(models: Sequence[Sequence[np.ndarray]], weights: Sequence[float]) -> list:
    total = float(sum(weights))
    return [
        sum(wt * np.asarray(m[i], np.float64) for m, wt in zip(models, weights)) / total
        for i in range(len(models[0]))
    ]
