"""Fitting the cost model's machine constants to measured engine step times (pure: no I/O).

    StepSample                      one measured step shape and its median time
    features(samples, model)        what the roofline multiplies by each constant, per sample
    fit(samples, model) -> Fit      the constants that best reproduce the samples
    Fit.predict(samples)            the fitted roofline's step times
    Fit.gpu_fields() / model_fields(model)   profile values that make CostModel reproduce the fit
    predict(cost, sample)           what a CostModel says about one sample
    model_fields_from_hf(config, dtype_bytes)   a dense decoder's ModelProfile fields from config.json

What is fitted. For a dense model at tp = ep = 1 the roofline (roofline.py) is, per step,

    T = oh + max((2 P T_tok + 2 V h S) / F_lin + 4 L Hq dh U / F_attn,  (W + kv_tok K) / B)

with the architecture (P, V, h, L, Hq, dh, W, kv_tok) known and four machine constants unknown:
the step overhead oh, the achieved FLOP/s of the linear layers F_lin (= mfu_linear x peak) and of
attention F_attn (= mfu_attn x peak), and the achieved memory bandwidth B (= eta x hbm_bw). They
are fitted to minimise the squared relative error, so short steps weigh as much as long ones, by
Levenberg-Marquardt in log space (positive by construction) from several starts, because the max()
makes the problem piecewise. A weak prior ties F_attn to F_lin (a factor e between them costs as
much as one sample 5% off), so a grid with little attention work cannot send F_attn to infinity.
A constant that adds under 1% to every predicted step is flagged as not identified; B, when no
measured step is memory-bound, is set to the lowest value the samples allow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from prorsa.costmodel.profiles import ModelProfile

CONSTANTS = ("step_overhead_s", "linear_flops", "attn_flops", "mem_bw")
PRIOR_WEIGHT = 0.05  # of the residual log(F_lin / F_attn)
IDENTIFIED_SHARE = 0.01  # a constant adding less than this to every step is not identified


@dataclass(frozen=True)
class StepSample:
    """One measured step shape: `batch` sequences each computing `new` tokens on `context` tokens
    of KV already held (prefill: the cached prefix; decode: new = 1, context = the KV length)."""

    kind: str  # "prefill" or "decode"
    batch: int
    new: int
    context: float  # decode: the mean KV length over the measured steps
    seconds: float  # median step time over the repeats
    repeats: tuple[float, ...] = ()  # every measured step time, for the record

    def chunks(self) -> list[tuple[int, int]]:
        return [(self.new, int(self.context))] * self.batch


def predict(cost, sample: StepSample) -> float:
    """What a CostModel says about one sample, through its public step-time calls."""
    if sample.kind == "prefill":
        return cost.prefill_time(sample.chunks())
    return cost.decode_time([sample.context] * sample.batch)


def features(samples: Sequence[StepSample], model: ModelProfile) -> np.ndarray:
    """Per sample: linear FLOPs, attention FLOPs and bytes streamed; columns of an (n, 3) array.
    Mirrors CostModel.mixed_time / decode_time for a dense model at tp = ep = 1."""
    m = model
    streamed = (m.params_total - m.params_embedding) * m.weight_bytes
    attn_per_unit = 4 * m.layers * m.q_heads * m.head_dim
    rows = []
    for s in samples:
        tokens = s.batch * s.new
        units = s.batch * s.new * (s.context + 0.5 * s.new)
        rows.append((2 * m.params_active * tokens + 2 * m.vocab * m.hidden * s.batch,
                     attn_per_unit * units,
                     streamed + m.kv_bytes_per_token * s.batch * s.context))
    return np.asarray(rows, dtype=float).reshape(-1, 3)


@dataclass(frozen=True)
class Fit:
    step_overhead_s: float
    linear_flops: float  # achieved FLOP/s of the linear layers
    attn_flops: float  # achieved FLOP/s of attention
    mem_bw: float  # achieved bytes/s streaming weights and KV
    memory_bound: int  # samples whose fitted step is memory-bound
    identified: dict[str, bool]  # per constant: does any sample's prediction depend on it
    model: ModelProfile

    def predict(self, samples: Sequence[StepSample]) -> np.ndarray:
        x = features(samples, self.model)
        return _predict(x, self._inverse())[0]

    def _inverse(self) -> np.ndarray:
        return np.array([self.step_overhead_s, 1 / self.linear_flops, 1 / self.attn_flops,
                         1 / self.mem_bw])

    def gpu_fields(self) -> dict[str, float]:
        """Hardware-profile values: peak is the faster of the two compute rates, so both
        efficiencies stay fractions; the bandwidth is the achieved one (efficiency 1)."""
        peak = max(self.linear_flops, self.attn_flops)
        return {"peak_flops": peak, "mfu_attn": self.attn_flops / peak,
                "hbm_bw": self.mem_bw, "bw_efficiency": 1.0,
                "step_overhead_s": self.step_overhead_s}

    def mfu_linear(self) -> float:
        """The model profile's mfu_linear that goes with gpu_fields()' peak."""
        return self.linear_flops / max(self.linear_flops, self.attn_flops)


def _predict(x: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Step times for inverse constants p = (oh, 1/F_lin, 1/F_attn, 1/B); and which samples are
    compute-bound."""
    compute = x[:, 0] * p[1] + x[:, 1] * p[2]
    memory = x[:, 2] * p[3]
    bound = compute >= memory
    return p[0] + np.where(bound, compute, memory), bound


def _terms(x: np.ndarray, p: np.ndarray) -> np.ndarray:
    """(n, 4): what each constant adds to each predicted step (zero where its regime is not the
    bound one)."""
    _, bound = _predict(x, p)
    return np.stack([np.full(len(x), p[0]),
                     np.where(bound, x[:, 0] * p[1], 0.0),
                     np.where(bound, x[:, 1] * p[2], 0.0),
                     np.where(bound, 0.0, x[:, 2] * p[3])], axis=1)


_PRIOR_ROW = PRIOR_WEIGHT * np.array([0.0, -1.0, 1.0, 0.0])  # d/d(log p) of the prior residual


def _residuals(x: np.ndarray, y: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Relative errors of the samples, then the prior's residual."""
    return np.append(_predict(x, np.exp(theta))[0] / y - 1, _PRIOR_ROW @ theta)


def _levenberg_marquardt(x: np.ndarray, y: np.ndarray, p0: np.ndarray, iters: int = 300):
    theta = np.log(p0)

    def cost(t):
        return float(np.sum(_residuals(x, y, t) ** 2))

    c, lam = cost(theta), 1e-3
    for _ in range(iters):
        r = _residuals(x, y, theta)
        # d(relative error)/d(log p_j) is the share of the step p_j adds
        j = np.vstack([_terms(x, np.exp(theta)) / y[:, None], _PRIOR_ROW])
        jtj = j.T @ j
        # damping on the diagonal, floored so a constant with no effect does not move
        a = jtj + lam * np.diag(np.maximum(np.diag(jtj), 1e-12))
        step = np.linalg.solve(a, -j.T @ r)
        trial = cost(theta + step)
        if trial < c:
            theta, lam = theta + step, lam / 3
            converged = c - trial < 1e-14 * max(c, 1e-30)
            c = trial
            if converged:
                break
        else:
            lam *= 4
            if lam > 1e12:
                break
    return np.exp(theta), c


def fit(samples: Sequence[StepSample], model: ModelProfile) -> Fit:
    if len(samples) < len(CONSTANTS):
        raise ValueError(f"need at least {len(CONSTANTS)} samples to fit {len(CONSTANTS)} constants, "
                         f"got {len(samples)}")
    if model.is_moe:
        raise ValueError(f"{model.name}: calibration fits dense models only")
    x = features(samples, model)
    y = np.array([s.seconds for s in samples], dtype=float)
    if np.any(y <= 0):
        raise ValueError("every sample needs a positive step time")

    # start from a compute-only linear fit (weighted by 1/y: relative error), then try the
    # memory term from irrelevant to dominant: the max() leaves local minima between regimes
    a = np.column_stack([np.ones(len(y)), x[:, 0], x[:, 1]]) / y[:, None]
    lin = np.linalg.lstsq(a, np.ones(len(y)), rcond=None)[0]
    floor = 1e-6 * np.array([y.min(), y.max() / max(x[:, 0].max(), 1), y.max() / max(x[:, 1].max(), 1)])
    base = np.maximum(lin, floor)
    compute = x[:, 0] * base[1] + x[:, 1] * base[2]
    binding = float(np.min(compute / x[:, 2]))  # the 1/B at which memory first binds somewhere
    best = None
    for scale in (1e-3, 0.5, 1.0, 2.0, 10.0):
        p, c = _levenberg_marquardt(x, y, np.append(base, binding * scale))
        if best is None or c < best[1]:
            best = (p, c)
    p = best[0]
    pred, bound = _predict(x, p)
    share = (_terms(x, p) / pred[:, None]).max(axis=0)
    identified = {k: bool(v >= IDENTIFIED_SHARE) for k, v in zip(CONSTANTS, share)}
    if not (~bound).any():
        # any bandwidth above this reproduces the samples; the lowest is the one they imply
        compute = x[:, 0] * p[1] + x[:, 1] * p[2]
        p[3] = float(np.min(compute / x[:, 2]))
    return Fit(step_overhead_s=float(p[0]), linear_flops=float(1 / p[1]), attn_flops=float(1 / p[2]),
               mem_bw=float(1 / p[3]), memory_bound=int((~bound).sum()), identified=identified,
               model=model)


def model_fields_from_hf(config: dict, dtype_bytes: int) -> dict[str, float | int]:
    """ModelProfile fields (all but mfu_linear) of a dense Llama-style decoder from its
    config.json: q/k/v/o projections, a gated MLP (three matrices), RMSNorm weights."""
    h = config["hidden_size"]
    layers = config["num_hidden_layers"]
    hq = config["num_attention_heads"]
    hkv = config.get("num_key_value_heads", hq)
    dh = config.get("head_dim") or h // hq
    vocab = config["vocab_size"]
    inter = config["intermediate_size"]
    if config.get("num_local_experts") or config.get("num_experts"):
        raise ValueError("model_fields_from_hf: dense models only")
    attn = h * hq * dh + 2 * h * hkv * dh + hq * dh * h
    active = layers * (attn + 3 * h * inter)
    # a tied table is streamed every step as the lm_head, so none of it counts as resident-only
    embedding = 0 if config.get("tie_word_embeddings") else vocab * h
    norms = (2 * layers + 1) * h
    return {"layers": layers, "hidden": h, "q_heads": hq, "kv_heads": hkv, "head_dim": dh,
            "vocab": vocab, "params_total": float(active + norms + embedding + vocab * h),
            "params_embedding": float(embedding), "params_active": float(active),
            "experts": 0, "experts_per_token": 0, "expert_params": 0,
            "weight_bytes": dtype_bytes, "kv_dtype_bytes": dtype_bytes}
