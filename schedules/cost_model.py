"""The tuner's cost model: XGBoost with a pairwise ranking objective.

It learns which of a task's candidates run faster from the ones measured so far (each task
is one query group: only the order within a task matters, so kernels of very different
sizes can share one model), and ranks the ones not yet measured. Records of other tasks
(earlier in the run, or in the database) train it too: that is the warm start.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: What a failed candidate counts as: slower than anything that ran.
_FAILED = 0.0


@dataclass
class Sample:
    task: str
    features: np.ndarray
    ms: float  # inf when the candidate failed


@dataclass
class CostModel:
    """Rank candidates by predicted speed; ``update`` after every measured batch."""

    rounds: int = 60
    max_depth: int = 6
    eta: float = 0.3
    seed: int = 0
    samples: list[Sample] = field(default_factory=list)
    _booster: object = field(default=None, init=False, repr=False)

    @property
    def trained(self) -> bool:
        return self._booster is not None

    def update(self, samples: list[Sample]) -> None:
        """Add measured samples and retrain on everything seen so far."""
        self.samples.extend(samples)
        self.fit(self.samples)

    def fit(self, samples: list[Sample]) -> None:
        import xgboost as xgb

        by_task: dict[str, list[Sample]] = {}
        for s in samples:
            by_task.setdefault(s.task, []).append(s)
        groups = [g for g in by_task.values() if len({s.ms for s in g}) > 1]  # a group needs an order
        if not groups:
            self._booster = None
            return
        x = np.stack([s.features for g in groups for s in g])
        y = np.concatenate([relevance([s.ms for s in g]) for g in groups])
        dtrain = xgb.DMatrix(x, label=y)
        dtrain.set_group([len(g) for g in groups])
        params = {"objective": "rank:pairwise", "max_depth": self.max_depth, "eta": self.eta,
                  "min_child_weight": 1, "subsample": 1.0, "seed": self.seed, "nthread": 1,
                  "verbosity": 0}
        self._booster = xgb.train(params, dtrain, num_boost_round=self.rounds)

    def predict(self, features: np.ndarray) -> np.ndarray:
        """A score per row: higher means predicted faster. Zeros before any training."""
        if self._booster is None:
            return np.zeros(len(features))
        import xgboost as xgb
        return self._booster.predict(xgb.DMatrix(np.asarray(features)))


def relevance(times_ms: list[float]) -> np.ndarray:
    """Graded relevance for ranking within a task: the best time over each time, in [0, 1],
    on a 0..30 integer scale (XGBoost's ranking objectives take ordered grades)."""
    ok = [t for t in times_ms if math.isfinite(t)]
    best = min(ok) if ok else 1.0
    return np.array([round(30 * best / t) if math.isfinite(t) else _FAILED for t in times_ms], dtype="float32")


def pairwise_accuracy(scores: np.ndarray, times_ms: np.ndarray) -> float:
    """Of the pairs with different measured times, the share the scores order correctly."""
    times_ms = np.asarray(times_ms, dtype="float64")
    ok = np.isfinite(times_ms)
    s, t = np.asarray(scores)[ok], times_ms[ok]
    i, j = np.triu_indices(len(t), 1)
    differ = t[i] != t[j]
    if not differ.any():
        return float("nan")
    right = (s[i] > s[j]) == (t[i] < t[j])
    return float(right[differ].mean())


def top_k_quality(scores: np.ndarray, times_ms: np.ndarray, k: int) -> float:
    """Best time over the best time among the model's top-k: 1.0 when measuring only those
    k would have found the best."""
    times_ms = np.asarray(times_ms, dtype="float64")
    best = np.min(times_ms[np.isfinite(times_ms)])
    top = np.argsort(-np.asarray(scores), kind="stable")[:k]
    found = np.min(times_ms[top])
    return float(best / found) if math.isfinite(found) else 0.0
