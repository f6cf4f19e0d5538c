"""The tuner's cost model: XGBoost with a pairwise ranking objective.

It learns which of a task's candidates run faster from the ones measured so far (each task
is one query group: only the order within a task matters, so kernels of very different
sizes can share one model), and ranks the ones not yet measured. Records of similar tasks
(earlier in the run, or in the database) train it too, each task's group weighted by its
similarity (``Sample.weight``): that is the warm start, which the tuner chooses per task.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Sample:
    task: str
    features: np.ndarray
    ms: float  # inf when the candidate failed
    weight: float = 1.0  # the weight of the sample's task group (its similarity to the task tuned)
    kernel_class: str = ""  # the task's kernel class (``schedules.tasks.kernel_class``)


@dataclass
class CostModel:
    """Rank candidates by predicted speed; ``update`` after every measured batch."""

    rounds: int = 200
    max_depth: int = 6
    eta: float = 0.1
    pairs: int = 32  # pairs drawn per candidate, over the whole task (not only its top)
    top_rounds: int = 20  # then rounds on pairs among each task's top candidates only
    top_k: int = 16
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
        y = np.concatenate([log_speed([s.ms for s in g]) for g in groups])
        dtrain = xgb.DMatrix(x, label=y)
        dtrain.set_group([len(g) for g in groups])
        dtrain.set_weight(np.array([g[0].weight for g in groups], dtype="float32"))  # ranking: one per group
        # XGBoost's LambdaRank draws pairs among each group's top candidates by default, which
        # leaves the order of the slower ones unlearned (held-out pairwise accuracy 0.79). Pairs
        # drawn across the whole task first (0.92), then a few rounds on the top's pairs, which
        # orders the best few (top-3 finds 98.6% of the best instead of 97.5%; bench/tuner_quality.py)
        params = {"objective": "rank:pairwise", "lambdarank_pair_method": "mean",
                  "lambdarank_num_pair_per_sample": self.pairs, "max_depth": self.max_depth, "eta": self.eta,
                  "min_child_weight": 1, "subsample": 1.0, "seed": self.seed, "nthread": 1,
                  "verbosity": 0}
        booster = xgb.train(params, dtrain, num_boost_round=self.rounds)
        top = dict(params, lambdarank_pair_method="topk", lambdarank_num_pair_per_sample=self.top_k)
        self._booster = xgb.train(top, dtrain, num_boost_round=self.top_rounds, xgb_model=booster) \
            if self.top_rounds else booster

    def predict(self, features: np.ndarray) -> np.ndarray:
        """A score per row: higher means predicted faster. Zeros before any training."""
        if self._booster is None:
            return np.zeros(len(features))
        import xgboost as xgb
        return self._booster.predict(xgb.DMatrix(np.asarray(features)))


def log_speed(times_ms: list[float]) -> np.ndarray:
    """The label a candidate is ranked by: -log(time / best time) (0 for the best, falling
    evenly per factor of slowdown, so the slow tail keeps its order); failures below all."""
    ok = [t for t in times_ms if math.isfinite(t)]
    best = min(ok) if ok else 1.0
    worst = math.log(max(ok) / best) if ok else 0.0
    return np.array([-math.log(t / best) if math.isfinite(t) else -worst - 1.0 for t in times_ms], dtype="float32")


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
