"""Cost models that rank candidate programs from their per-store features (compiler.costs.features).

`XGBModel` is Ansor's: one gradient-boosted tree model scores each store, a program's score is the sum over its
stores ("pack-sum"), and it is retrained from scratch on every measured program after each round. Labels are
normalized throughput per workload (the group's best cost / this cost, 0 for a failure); higher is faster. By
default it learns to *order* programs of one workload (a pairwise logistic loss); Ansor's regression on the labels
is the `objective="regression"` ablation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

OBJECTIVES = ("pairwise", "regression")
MAX_PAIRS = 50_000  # pairs in one training of the pairwise objective (more did not rank better; see XGBModel)
PAIRWISE_ETA = 0.4  # the pairwise objective's learning rate (Ansor's regression: 0.2)
SUBSAMPLE = 0.8  # the share of store rows, and of features, each tree of the pairwise objective is grown on


class CostModel(Protocol):
    @property
    def informed(self) -> bool:
        """Whether its scores say anything about speed (it was trained or pre-trained); an uninformed model scores
        at random, and a search that ranks random programs by such scores only spends time (SearchPolicy)."""
        ...

    def update(self, xs: list[np.ndarray], costs: list[float], groups: list[str]) -> None:
        """Learn from measured programs: features, mean seconds (math.inf if it failed), workload key."""
        ...

    def predict(self, xs: list[np.ndarray]) -> np.ndarray:
        """One score per program, higher = faster; -inf for a program without features (it did not lower)."""
        ...


def normalized_throughput(costs: Sequence[float], groups: Sequence[str]) -> np.ndarray:
    """Per program: the least finite cost of its group divided by its cost; 0 for a failure."""
    costs = np.asarray(costs, np.float64)
    best: dict[str, float] = {}
    for c, g in zip(costs, groups):
        if math.isfinite(c) and c > 0:
            best[g] = min(best.get(g, math.inf), c)
    out = np.zeros(len(costs))
    for i, (c, g) in enumerate(zip(costs, groups)):
        if math.isfinite(c) and c > 0:
            out[i] = best[g] / c
    return out


def pairwise_accuracy(scores: Sequence[float], costs: Sequence[float]) -> float:
    """Fraction of pairs (both costs finite and different) whose scores order them as the costs do (higher score,
    lower cost); a tie in score counts half. NaN when there is no such pair."""
    s, c = np.asarray(scores, np.float64), np.asarray(costs, np.float64)
    keep = np.isfinite(c)
    s, c = s[keep], c[keep]
    i, j = np.triu_indices(len(c), k=1)
    dc = np.sign(c[j] - c[i])
    ds = np.sign(s[i] - s[j])  # agrees with dc when the faster program scores higher
    valid = dc != 0
    if not valid.any():
        return math.nan
    agree = np.where(ds == 0, 0.5, (ds == dc).astype(np.float64))
    return float(agree[valid].mean())


def _pack(xs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of the non-empty programs stacked, each row's program index, and which programs have rows."""
    nonempty = np.array([len(x) > 0 for x in xs], bool)
    rows = [x for x in xs if len(x)]
    if not rows:
        return np.zeros((0, 0), np.float32), np.zeros(0, np.int64), nonempty
    ids = np.repeat(np.arange(len(rows)), [len(x) for x in rows])
    return np.concatenate(rows).astype(np.float32, copy=False), ids, nonempty


def _seed(seed: int | np.random.Generator) -> tuple[int, np.random.Generator]:
    if isinstance(seed, np.random.Generator):
        return int(seed.integers(2**31 - 1)), seed
    return int(seed), np.random.default_rng(seed)


class RandomModel:
    """Uniform random scores (the ablation baseline)."""

    informed = False

    def __init__(self, seed: int | np.random.Generator = 0):
        self.rng = _seed(seed)[1]

    def update(self, xs: list[np.ndarray], costs: list[float], groups: list[str]) -> None:
        pass

    def predict(self, xs: list[np.ndarray]) -> np.ndarray:
        scores = self.rng.uniform(size=len(xs))
        scores[[len(x) == 0 for x in xs]] = -np.inf
        return scores


class XGBModel:
    """Ansor's pack-sum XGBoost model. Keeps every program it was given, retrains from scratch on all of them in
    `update` once `num_warmup` programs measured without error; until then `predict` is uniform random.

    objective="pairwise" (the default): the search only needs the order of a task's programs, so the loss is over
    pairs (a, b) of one workload with labels y_a > y_b: (y_a - y_b) * log(1 + exp(-(S_a - S_b))), S the pack-sum
    score. Weighting a pair by its label gap makes pairs inside the timing noise (29% of a conv's measured pairs
    differ by under 2%) count little and clear differences much. At most MAX_PAIRS pairs, drawn with a seed, enter
    one training. Its trees are shallow (depth 4): a ranking loss never runs out of gradient on near-tied pairs,
    and depth-10 trees fit them into noise (0.71 held-out accuracy on test_cost_model's synthetic pack-sum cost,
    whose programs have 3-5 stores, against 0.91 at depth 4 and 0.92 for the regression; depth 6 0.82).
    Shallow trees at Ansor's learning rate underfit real records, though: all 300 rounds ran and more rounds kept
    ranking better. So each tree takes a larger step (PAIRWISE_ETA) and is grown on a seeded sample of the store
    rows and of the features (SUBSAMPLE), which keeps the larger steps from fitting noise. Held-out pairwise
    accuracy after 512 measured programs, mean of 10 random splits, on Zen 4 records at 1 thread (bench.tuning, 640
    programs each) of the 3x3 convs 128x28x28 / 64x56x56 / 256x14x14 and GEMM 512: eta 0.2 on all the data
    0.857 / 0.843 / 0.790 / 0.825, eta 0.4 on 0.8 of rows and features 0.869 / 0.861 / 0.804 / 0.829; trained on
    the first 512 and tested on the 128 measured after them, 0.616 against 0.659 (mean of the four); the synthetic
    cost of 3-5 stores 0.92-0.93 against 0.91-0.92, of 4 stores 0.98 either way
    (bench/results/cost-model-trees-zen4-2026-11-27.txt).
    A program's gradient is spread over its stores as below, with the logistic loss's Hessian in place of w_p.

    objective="regression", Ansor's choice: loss per program p with label y_p and k_p stores s:
    w_p (sum_s f(s) - y_p)^2 / 2, w_p = max(y_p, weight_floor), which weights fast programs most. Ansor's floor is
    ~0 (w_p = y_p); 0.1 keeps slow programs in the fit so that they are still told apart (held-out pairwise
    accuracy on random 128^3 matmul schedules, 100 programs to train: 0.71 with 1e-3, 0.75 with 0.1, mean of 6
    splits; the best of the top 5 predicted is as good either way). Every store of p gets the gradient
    w_p (sum_s f(s) - y_p); its Hessian block is w_p * ones(k_p, k_p), and the hessian given per store is its
    diagonal majorizer w_p * k_p: with w_p alone (Ansor's choice) stores of one program that land in one leaf all
    take the full Newton step and the sum overshoots k_p-fold, which diverges on programs of many similar stores.
    `adaptive_training` skips a retrain until the data has grown by 20% since the last one.

    `prior` (a model pre-trained on other workloads' records, compiler.search.transfer) makes the model a correction on
    top of it: until this model's own warm-up it scores with the prior alone; after, each store's prior score is
    the starting margin its own trees are fit from, and a program scores prior + own."""

    def __init__(
        self,
        seed: int | np.random.Generator = 43,
        num_warmup: int = 64,
        max_rounds: int = 300,
        early_stopping: int = 50,
        nthread: int = 1,
        max_depth: int | None = None,  # 4 for the pairwise loss, 10 for the regression
        eta: float | None = None,  # PAIRWISE_ETA for the pairwise loss, 0.2 for the regression
        adaptive_training: bool = False,
        weight_floor: float = 0.1,
        prior: XGBModel | None = None,
        objective: str = "pairwise",
    ):
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown cost model objective {objective!r}; expected one of {OBJECTIVES}")
        self.objective = objective
        pairwise = objective == "pairwise"
        max_depth = max_depth if max_depth is not None else (4 if pairwise else 10)
        eta = eta if eta is not None else (PAIRWISE_ETA if pairwise else 0.2)
        self.seed, self.rng = _seed(seed)
        self.num_warmup, self.max_rounds, self.early_stopping = num_warmup, max_rounds, early_stopping
        self.adaptive_training, self.weight_floor = adaptive_training, weight_floor
        self.params = {
            "max_depth": max_depth,
            "gamma": 0.001,
            "min_child_weight": 0,
            "eta": eta,
            "nthread": nthread,
            "seed": self.seed,
            "base_score": 0.0,  # a program's score is a sum over its stores: no per-store offset
            "tree_method": "hist",
            "verbosity": 0,
            "disable_default_eval_metric": 1,
        }
        if pairwise:  # the regression stays Ansor's: every row and feature for every tree
            self.params.update(subsample=SUBSAMPLE, colsample_bytree=SUBSAMPLE)
        self.xs: list[np.ndarray] = []
        self.costs: list[float] = []
        self.groups: list[str] = []
        self.booster = None
        self.prior = prior.booster if prior is not None else None
        self.trained_on = 0  # programs in the last training set
        self.rounds = 0  # boosting rounds kept in the last training

    @property
    def informed(self) -> bool:
        return self.booster is not None or self.prior is not None

    @property
    def num_valid(self) -> int:
        """Programs measured without error (finite cost) that have features."""
        return sum(1 for x, c in zip(self.xs, self.costs) if len(x) and math.isfinite(c))

    def update(self, xs: list[np.ndarray], costs: list[float], groups: list[str]) -> None:
        if not len(xs) == len(costs) == len(groups):
            raise ValueError(f"got {len(xs)} feature matrices, {len(costs)} costs and {len(groups)} groups")
        self.xs += [np.asarray(x, np.float32) for x in xs]
        self.costs += [float(c) for c in costs]
        self.groups += [str(g) for g in groups]
        if self.num_valid < self.num_warmup:
            return
        if self.adaptive_training and self.booster is not None and len(self.xs) < 1.2 * self.trained_on:
            return
        self._train()

    def _train(self) -> None:
        import xgboost as xgb  # only the XGB model needs it

        labels = normalized_throughput(self.costs, self.groups)
        X, ids, nonempty = _pack(self.xs)
        y = labels[nonempty]
        n = len(y)
        per_program = np.bincount(ids, minlength=n)  # stores per program
        w = np.maximum(y, self.weight_floor)  # the regression's weights; they also shape the histogram bins
        dtrain = xgb.DMatrix(X, label=y[ids], weight=w[ids], nthread=self.params["nthread"])
        if self.prior is not None:
            dtrain.set_base_margin(self.prior.inplace_predict(X))  # the objective sees prior + own scores
        if self.objective == "pairwise":
            groups = np.array(self.groups)[nonempty]
            grad_hess, metric = _pairwise_loss(y, groups, np.random.default_rng([self.seed, len(self.xs)]))
        else:
            grad_hess, metric = _regression_loss(y, w)

        def objective(preds: np.ndarray, _dtrain) -> tuple[np.ndarray, np.ndarray]:
            g, h = grad_hess(np.bincount(ids, weights=preds, minlength=n))
            return g[ids], (h * per_program)[ids]

        def loss(preds: np.ndarray, _dtrain) -> tuple[str, float]:
            return "loss", metric(np.bincount(ids, weights=preds, minlength=n))

        callbacks = [xgb.callback.EarlyStopping(rounds=self.early_stopping, metric_name="loss", save_best=True)]
        self.booster = xgb.train(
            self.params,
            dtrain,
            num_boost_round=self.max_rounds,
            obj=objective,
            custom_metric=loss,
            evals=[(dtrain, "train")],
            callbacks=callbacks,
            verbose_eval=False,
        )
        self.trained_on = len(self.xs)
        self.rounds = self.booster.num_boosted_rounds()

    def predict(self, xs: list[np.ndarray]) -> np.ndarray:
        boosters = [b for b in (self.prior, self.booster) if b is not None]
        if not boosters:
            scores = self.rng.uniform(size=len(xs))
        else:
            X, ids, nonempty = _pack(xs)
            scores = np.zeros(len(xs))
            if len(X):
                preds = sum(b.inplace_predict(X) for b in boosters)
                scores[nonempty] = np.bincount(ids, weights=preds, minlength=int(nonempty.sum()))
        scores[[len(x) == 0 for x in xs]] = -np.inf
        return scores

    def save(self, path: str | Path) -> None:
        """One .npz file: the training data, the settings, the random generator's state and the booster."""
        lengths = np.array([len(x) for x in self.xs], np.int64)
        width = max((x.shape[1] for x in self.xs if x.ndim == 2), default=0)
        rows = np.concatenate([x.reshape(-1, width) for x in self.xs]) if self.xs else np.zeros((0, 0), np.float32)
        meta = {
            "seed": self.seed,
            "num_warmup": self.num_warmup,
            "max_rounds": self.max_rounds,
            "early_stopping": self.early_stopping,
            "adaptive_training": self.adaptive_training,
            "weight_floor": self.weight_floor,
            "objective": self.objective,
            "params": self.params,
            "trained_on": self.trained_on,
            "rounds": self.rounds,
            "rng": self.rng.bit_generator.state,
        }
        booster = _raw(self.booster)
        prior = _raw(self.prior)
        with open(path, "wb") as f:  # a file object, so numpy does not append ".npz" to the caller's path
            np.savez(
                f,
                rows=rows,
                lengths=lengths,
                costs=np.array(self.costs, np.float64),
                groups=np.array(self.groups, dtype=str),
                meta=np.array(json.dumps(meta)),
                booster=booster if booster is not None else np.zeros(0, np.uint8),
                has_booster=np.array(booster is not None),
                prior=prior if prior is not None else np.zeros(0, np.uint8),
                has_prior=np.array(prior is not None),
            )

    @classmethod
    def load(cls, path: str | Path) -> XGBModel:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            p = meta["params"]
            model = cls(
                seed=meta["seed"],
                num_warmup=meta["num_warmup"],
                max_rounds=meta["max_rounds"],
                early_stopping=meta["early_stopping"],
                nthread=p["nthread"],
                max_depth=p["max_depth"],
                eta=p["eta"],
                adaptive_training=meta["adaptive_training"],
                weight_floor=meta["weight_floor"],
                objective=meta.get("objective", "regression"),  # files from before the pairwise loss
            )
            model.params = p
            model.rng.bit_generator.state = meta["rng"]
            model.trained_on, model.rounds = meta["trained_on"], meta["rounds"]
            rows, lengths = z["rows"], z["lengths"]
            bounds = np.concatenate([[0], np.cumsum(lengths)])
            width = rows.shape[1] if rows.ndim == 2 else 0
            model.xs = [rows[a:b].reshape(b - a, width) for a, b in zip(bounds[:-1], bounds[1:])]
            model.costs = [float(c) for c in z["costs"]]
            model.groups = [str(g) for g in z["groups"]]
            if bool(z["has_booster"]):
                model.booster = _booster(z["booster"], p["nthread"])
            if "has_prior" in z and bool(z["has_prior"]):
                model.prior = _booster(z["prior"], p["nthread"])
        return model


Loss = tuple[
    Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],  # program scores -> gradient, Hessian per program
    Callable[[np.ndarray], float],  # program scores -> loss
]


def _regression_loss(y: np.ndarray, w: np.ndarray) -> Loss:
    """Weighted squared error of the program scores against the labels."""

    def grad_hess(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return w * (s - y), w

    return grad_hess, lambda s: float(np.sqrt(np.mean((s - y) ** 2)))


def _pairs(y: np.ndarray, groups: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Programs (hi, lo) of one group with y[hi] > y[lo]: every such pair when a group's pairs number at most
    MAX_PAIRS in all, else MAX_PAIRS pairs drawn with `rng` (each group in proportion to its pair count). Drawing
    the indices directly keeps memory linear: a database's 20,000 programs of one workload make 2e8 pairs."""
    members = [np.flatnonzero(groups == g) for g in np.unique(groups)]
    order = np.concatenate(members)
    sizes = np.array([len(m) for m in members])
    start = np.cumsum(sizes) - sizes
    counts = sizes * (sizes - 1) // 2
    if counts.sum() <= MAX_PAIRS:
        i, j = zip(*(np.triu_indices(n, k=1) for n in sizes))
        g = np.repeat(np.arange(len(sizes)), counts)
        a, b = order[start[g] + np.concatenate(i)], order[start[g] + np.concatenate(j)]
    else:
        g = rng.choice(len(sizes), MAX_PAIRS, p=counts / counts.sum())
        i = rng.integers(0, sizes[g])
        j = rng.integers(0, sizes[g] - 1)
        j = j + (j >= i)  # a second program of the same group, never the first
        a, b = order[start[g] + i], order[start[g] + j]
    differ = y[a] != y[b]
    a, b = a[differ], b[differ]
    up = y[a] > y[b]
    return np.where(up, a, b), np.where(up, b, a)


def _pairwise_loss(y: np.ndarray, groups: np.ndarray, rng: np.random.Generator) -> Loss:
    """Label-gap-weighted logistic loss over pairs of programs of one group whose labels differ (`_pairs`); gradients
    and Hessians are scaled per program so their size does not depend on how many pairs there are."""
    hi, lo = _pairs(y, groups, rng)
    n = len(y)
    gap = y[hi] - y[lo]
    pw = gap * (n / max(gap.sum(), 1e-12))  # the weights sum to the number of programs

    def grad_hess(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = 1.0 / (1.0 + np.exp(np.clip(s[hi] - s[lo], -50.0, 50.0)))  # P(the pair is ordered wrongly)
        g = pw * p
        h = pw * p * (1.0 - p)
        grad = np.bincount(lo, weights=g, minlength=n) - np.bincount(hi, weights=g, minlength=n)
        hess = np.bincount(lo, weights=h, minlength=n) + np.bincount(hi, weights=h, minlength=n)
        return grad, np.maximum(hess, 1e-6)

    def metric(s: np.ndarray) -> float:
        return float(np.sum(pw * np.logaddexp(0.0, -(s[hi] - s[lo]))) / n) if len(hi) else 0.0

    return grad_hess, metric


def _raw(booster) -> np.ndarray | None:
    return np.frombuffer(bytes(booster.save_raw("ubj")), np.uint8) if booster is not None else None


def _booster(raw: np.ndarray, nthread: int):
    import xgboost as xgb

    booster = xgb.Booster(params={"nthread": nthread})
    booster.load_model(bytearray(raw.tobytes()))
    return booster
