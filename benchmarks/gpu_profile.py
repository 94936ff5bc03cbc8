"""Step times of a decoder stack shaped like a model profile, in plain PyTorch with random weights,
for fitting the cost model's GPU constants (`prorsa calibrate --from-measurements`). The method is
Vidur's: time the operators of the real shapes on the device instead of serving the model.

    prefill   one sequence: `new` tokens on a cached prefix of `context` tokens (attention over the
              prefix KV and, causally, the new tokens), lm_head on the last token
    decode    `batch` sequences of one new token each over a KV cache of `context` tokens

A layer is what a vLLM decoder layer computes: RMSNorm, fused QKV projection, rotary embedding, KV
write, torch.nn.functional.scaled_dot_product_attention (GQA, the flash kernel where it passes a
check against a reference), output projection, RMSNorm, gated SiLU MLP. CUDA: bf16, CUDA graphs
(vLLM replays graphs too, so launch gaps are not measured), CUDA events, warm-up, median of repeats.
CPU: float32, wall clock. `--layers N` measures N layers and scales the stack's time to the
model's depth (stack x L / N + lm_head); the file and the output say so.

    python benchmarks/gpu_profile.py                    GPU: Qwen3-8B, the default grid (< 10 min on an H200)
    python benchmarks/gpu_profile.py --quick --model tiny     CPU: a tiny grid in seconds

Writes benchmarks/results/gpu-profile-<device>-<date>.json (schema below, what calibrate.py's
StepSample holds plus the date, device and versions). Needs only torch: no prorsa import, no YAML
library, so it runs on a GPU machine that has nothing else.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
SCHEMA = "prorsa-step-times/1"

# (new, cached prefix) for prefill; (batch, context) for decode. The default grid spans compute-
# and memory-bound steps and long agentic contexts; shapes whose KV does not fit are skipped.
DEFAULT_PREFILL = tuple((n, c) for c in (0, 4096, 16384, 32768) for n in (16, 128, 512, 2048, 8192))
DEFAULT_DECODE = tuple((b, c) for c in (512, 4096, 16384, 32768) for b in (1, 8, 32, 64, 128, 256))
QUICK_PREFILL = ((16, 0), (512, 0), (16, 512), (512, 512))
QUICK_DECODE = ((1, 64), (16, 64), (1, 2048), (16, 2048))


@dataclass(frozen=True)
class Shape:
    """The architecture of a dense decoder, as the cost model's profile gives it."""

    profile: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int


def read_profile(path: Path) -> dict[str, float]:
    """The flat `key: number  # note` lines of a profile (profiles.py validates them; this script
    reads them without a YAML library)."""
    fields = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.split("#", 1)[0].partition(":")
        if sep and value.strip():
            fields[key.strip()] = float(value)
    return fields


def model_shape(name: str) -> Shape:
    path = Path(name) if name.endswith((".yaml", ".yml")) else REPO / "configs" / "models" / f"{name}.yaml"
    f = read_profile(path)
    if f.get("experts"):
        raise SystemExit(f"{path}: an MoE profile; this script times dense decoders")
    h, layers, hq, hkv, dh = (int(f[k]) for k in ("hidden", "layers", "q_heads", "kv_heads", "head_dim"))
    # profiles hold params_active = L (attention + 3 h I), not I itself, and round it to a few
    # digits (norms may be in it too): I is the nearest multiple of 64, as real models' are
    attn = 2 * h * hq * dh + 2 * h * hkv * dh
    inter = 64 * round((f["params_active"] / layers - attn) / (3 * h) / 64)
    return Shape(path.stem, layers, h, hq, hkv, dh, inter, int(f["vocab"]))


# -- attention ------------------------------------------------------------------------------


def _backends(device: torch.device) -> list:
    try:
        from torch.nn.attention import SDPBackend
    except ImportError:  # older torch: whatever SDPA picks by itself
        return [None]
    fast = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION] if device.type == "cuda" else \
        [SDPBackend.FLASH_ATTENTION]
    return fast + [SDPBackend.MATH]


def _kernel(backend):
    if backend is None:
        return nullcontext()
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(backend)


def _mask_kind(mask) -> str:
    return "decode" if mask is None else "causal" if isinstance(mask, str) else "prefix"


class Attention:
    """SDPA with, per kind of step (decode, prefill from empty, prefill on a prefix), the kernel and
    the way of doing GQA that choose_attention found to be correct there."""

    def __init__(self, choices: dict[str, tuple]):
        self.choices = choices  # kind -> (SDPBackend or None, native GQA)

    def describe(self) -> dict[str, str]:
        return {kind: f"{getattr(b, 'name', 'default').lower()}, {'enable_gqa' if gqa else 'repeat_interleave'}"
                for kind, (b, gqa) in self.choices.items()}

    @staticmethod
    def mask(new: int, cached: int, device: torch.device):
        """None for a decode (the token sees all), "causal" from an empty cache, else causal aligned
        to the bottom right: new token i sees the prefix and new tokens 0..i."""
        if new == 1:
            return None
        if cached == 0:
            return "causal"
        try:
            from torch.nn.attention.bias import causal_lower_right
        except ImportError:
            return torch.ones(new, cached + new, dtype=torch.bool, device=device).tril(cached)
        return causal_lower_right(new, cached + new)

    def __call__(self, q, k, v, mask):
        backend, native_gqa = self.choices[_mask_kind(mask)]
        return _sdpa(q, k, v, mask, backend, native_gqa)


def _sdpa(q, k, v, mask, backend, native_gqa: bool):
    kw = {}
    if native_gqa:
        kw["enable_gqa"] = True
    else:  # copies the KV heads: slower, used only where no kernel takes GQA natively
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    if mask is not None and not isinstance(mask, str):
        kw["attn_mask"] = mask
    with _kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=isinstance(mask, str), **kw)


def _reference(q, k, v, cached):
    """float32 attention with an explicit mask and expanded heads."""
    groups = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(groups, 1) for t in (k, v))
    scores = q.float() @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    new = q.shape[2]
    allowed = torch.ones(new, cached + new, dtype=torch.bool, device=q.device).tril(cached)
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


def choose_attention(shape: Shape, device, dtype) -> Attention:
    """Per kind of step, the fastest kernel, native GQA first, that gives the reference's output
    (so a kernel that ignores the prefix mask's alignment is never timed)."""
    gen = torch.Generator(device).manual_seed(1)
    tol = 2e-2 if dtype != torch.float32 else 1e-4
    choices = {}
    for kind, batch, new, cached in (("decode", 3, 1, 40), ("causal", 1, 16, 0), ("prefix", 1, 16, 24)):
        q = torch.randn(batch, shape.q_heads, new, shape.head_dim, generator=gen, device=device, dtype=dtype)
        k, v = (torch.randn(batch, shape.kv_heads, cached + new, shape.head_dim, generator=gen,
                            device=device, dtype=dtype) for _ in range(2))
        ref, mask = _reference(q, k, v, cached), Attention.mask(new, cached, device)
        choices[kind] = next((c for c in ((b, g) for b in _backends(device) for g in (True, False))
                              if _matches(q, k, v, mask, c, ref, tol)), None)
        if choices[kind] is None:
            raise SystemExit(f"no SDPA kernel matched the reference attention ({kind}) on this device")
    return Attention(choices)


def _matches(q, k, v, mask, choice, ref, tol: float) -> bool:
    try:
        out = _sdpa(q, k, v, mask, *choice).float()
    except (RuntimeError, TypeError, ValueError):  # this kernel does not take these inputs
        return False
    return torch.allclose(out, ref, atol=tol, rtol=tol)


# -- the stack ------------------------------------------------------------------------------


def _rms(x, weight):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), weight, 1e-6)
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * weight


def _rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Stack:
    """`layers` decoder layers and the lm_head of `shape`, random weights (timing does not depend
    on their values), weights stored (out, in) like nn.Linear."""

    def __init__(self, shape: Shape, layers: int, device, dtype, attention: Attention, seed: int = 0):
        s, self.shape, self.attention = shape, shape, attention
        self.device, self.dtype = device, dtype
        gen = torch.Generator(device).manual_seed(seed)

        def w(rows, cols):
            return torch.randn(rows, cols, generator=gen, device=device, dtype=dtype) * 0.02

        ones = torch.ones(s.hidden, device=device, dtype=dtype)
        qkv = (s.q_heads + 2 * s.kv_heads) * s.head_dim
        self.layers = [dict(norm1=ones, qkv=w(qkv, s.hidden), o=w(s.hidden, s.q_heads * s.head_dim),
                            norm2=ones, gate_up=w(2 * s.intermediate, s.hidden),
                            down=w(s.hidden, s.intermediate)) for _ in range(layers)]
        self.lm_head = w(s.vocab, s.hidden)

    def inputs(self, batch: int, new: int, cached: int) -> dict:
        """Everything one step of this shape reads: hidden states, a KV cache per layer holding
        `cached` tokens and room for `new`, the rotary tables of the new positions, the mask."""
        s, kw = self.shape, dict(device=self.device, dtype=self.dtype)
        pos = torch.arange(cached, cached + new, device=self.device, dtype=torch.float32)
        inv = 1e6 ** (-torch.arange(0, s.head_dim, 2, device=self.device, dtype=torch.float32) / s.head_dim)
        angles = torch.cat([torch.outer(pos, inv)] * 2, dim=-1)[None, :, None, :]
        kv = [(torch.randn(batch, s.kv_heads, cached + new, s.head_dim, **kw),
               torch.randn(batch, s.kv_heads, cached + new, s.head_dim, **kw)) for _ in self.layers]
        return dict(x=torch.randn(batch * new, s.hidden, **kw), kv=kv, cos=angles.cos().to(self.dtype),
                    sin=angles.sin().to(self.dtype), mask=self.attention.mask(new, cached, self.device),
                    batch=batch, new=new, cached=cached)

    def run_layers(self, inp: dict) -> torch.Tensor:
        s, b, n, c = self.shape, inp["batch"], inp["new"], inp["cached"]
        x = inp["x"]
        for lw, (kc, vc) in zip(self.layers, inp["kv"]):
            qkv = F.linear(_rms(x, lw["norm1"]), lw["qkv"]).view(b, n, -1, s.head_dim)
            q, k, v = qkv.split([s.q_heads, s.kv_heads, s.kv_heads], dim=2)
            q, k = _rope(q, inp["cos"], inp["sin"]), _rope(k, inp["cos"], inp["sin"])
            kc[:, :, c:] = k.transpose(1, 2)
            vc[:, :, c:] = v.transpose(1, 2)
            o = self.attention(q.transpose(1, 2), kc, vc, inp["mask"])
            x = x + F.linear(o.transpose(1, 2).reshape(b * n, -1), lw["o"])
            gate, up = F.linear(_rms(x, lw["norm2"]), lw["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, lw["down"])
        return x

    def run_head(self, inp: dict) -> torch.Tensor:
        """lm_head and greedy sampling on each sequence's last token (what vLLM computes); it reads
        the step's input hidden states, which have the shape of the stack's output."""
        last = inp["x"].view(inp["batch"], inp["new"], -1)[:, -1]
        return F.linear(_rms(last, self.layers[0]["norm1"]), self.lm_head).argmax(-1)


# -- timing ---------------------------------------------------------------------------------


def _graphed(fn):
    """fn captured as a CUDA graph (warmed on a side stream first, as torch.cuda.graph requires)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def time_fn(fn, device, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return times


def kv_bytes(shape: Shape, layers: int, batch: int, tokens: int, dtype) -> int:
    return 2 * layers * batch * shape.kv_heads * tokens * shape.head_dim * torch.finfo(dtype).bits // 8


def fits(stack: Stack, batch: int, new: int, cached: int) -> bool:
    """Whether the KV cache and the activations of a step fit in the free device memory."""
    if stack.device.type != "cuda":
        return True
    s, elt = stack.shape, torch.finfo(stack.dtype).bits // 8
    per_token = 4 * s.hidden + 2 * (s.q_heads + 2 * s.kv_heads) * s.head_dim + 3 * s.intermediate
    acts = batch * new * per_token * elt
    need = kv_bytes(s, len(stack.layers), batch, cached + new, stack.dtype) + 2 * acts + batch * s.vocab * 4
    return 1.2 * need + 2**30 < torch.cuda.mem_get_info(stack.device)[0]


def measure(stack: Stack, kind: str, batch: int, new: int, cached: int, *, warmup: int, repeats: int,
            graphs: bool) -> dict:
    """One sample: the stack's and the head's times, scaled to the model's depth."""
    inp = stack.inputs(batch, new, cached)
    run_layers, run_head = (lambda: stack.run_layers(inp)), (lambda: stack.run_head(inp))
    graphed = False
    if graphs:
        try:
            run_layers, run_head = _graphed(run_layers), _graphed(run_head)
            graphed = True
        except RuntimeError as err:  # a kernel that cannot be captured: time it eagerly instead
            print(f"  CUDA graph capture failed ({err}); timing eagerly", flush=True)
    stack_t = time_fn(run_layers, stack.device, warmup, repeats)
    head_t = time_fn(run_head, stack.device, warmup, repeats)
    scale = stack.shape.layers / len(stack.layers)
    total = [a * scale + b for a, b in zip(stack_t, head_t)]
    return dict(kind=kind, batch=batch, new=new, context=cached,
                seconds=statistics.median(stack_t) * scale + statistics.median(head_t), repeats=total,
                stack_s=statistics.median(stack_t), head_s=statistics.median(head_t), graph=graphed)


# -- the run --------------------------------------------------------------------------------


def device_name(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        import platform

        return platform.processor() or platform.machine()


def default_output(device: str, date: str) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    return REPO / "benchmarks" / "results" / f"gpu-profile-{slug}-{date[:10]}.json"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-8b", help="model profile name (configs/models) or YAML path")
    p.add_argument("--layers", type=int, help="measure this many layers, scale to the model's depth")
    p.add_argument("--quick", action="store_true", help="a tiny grid, few repeats (CPU, smoke test)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--warmup", type=int, help="untimed runs per shape (default 3, quick 1)")
    p.add_argument("--repeats", type=int, help="timed runs per shape (default 7, quick 3)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU: torch threads (default 1: one core, like the CPU profile's engines)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="time eager launches on CUDA")
    p.add_argument("--time-limit", type=float, default=540.0,
                   help="seconds after which the remaining shapes are skipped (the file keeps the rest)")
    p.add_argument("--output", type=Path, help="default benchmarks/results/gpu-profile-<device>-<date>.json")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    t_start = time.monotonic()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = model_shape(args.model)
    layers = min(args.layers or shape.layers, shape.layers)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    repeats = args.repeats or (3 if args.quick else 7)
    date = dt.datetime.now().astimezone().isoformat(timespec="minutes")
    name = device_name(device)
    output = args.output or default_output(name, date)
    torch.manual_seed(0)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)  # more threads than free cores spin and time nothing useful

    attention = choose_attention(shape, device, dtype)
    stack = Stack(shape, layers, device, dtype, attention)
    graphs = device.type == "cuda" and not args.no_cuda_graphs
    scaled = f"; times scaled to {shape.layers} layers (stack x {shape.layers}/{layers} + lm_head)" \
        if layers < shape.layers else ""
    print(f"{shape.profile} on {name}, {dtype}, {layers} of {shape.layers} layers{scaled}; "
          f"attention {attention.describe()}, CUDA graphs {graphs}", flush=True)

    command = " ".join(["python", "benchmarks/gpu_profile.py", *(argv if argv is not None else sys.argv[1:])])
    record = dict(schema=SCHEMA, date=date, command=command, device=name, device_type=device.type,
                  torch=torch.__version__, cuda=torch.version.cuda, dtype=str(dtype).removeprefix("torch."),
                  threads=torch.get_num_threads() if device.type == "cpu" else None,
                  attention=attention.describe(), cuda_graphs=graphs,
                  model=asdict(shape), layers_measured=layers, layers_scaled_to=shape.layers,
                  scaling=("seconds = stack_s x layers_scaled_to / layers_measured + head_s; stack_s and "
                           "head_s are medians of the repeats"),
                  warmup=warmup, repeats=repeats, samples=[], skipped=[])
    plan = [("prefill", 1, n, c) for n, c in (QUICK_PREFILL if args.quick else DEFAULT_PREFILL)]
    plan += [("decode", b, 1, c) for b, c in (QUICK_DECODE if args.quick else DEFAULT_DECODE)]
    output.parent.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        for kind, batch, new, cached in plan:
            where = dict(kind=kind, batch=batch, new=new, context=cached)
            if time.monotonic() - t_start > args.time_limit:
                record["skipped"].append(where | {"why": f"past the {args.time_limit:.0f} s time limit"})
                continue
            if not fits(stack, batch, new, cached):
                record["skipped"].append(where | {"why": "KV cache and activations exceed free memory"})
                continue
            try:
                sample = measure(stack, kind, batch, new, cached, warmup=warmup, repeats=repeats, graphs=graphs)
            except torch.cuda.OutOfMemoryError:  # fits() is an estimate; the next shape may still fit
                record["skipped"].append(where | {"why": "out of device memory"})
                torch.cuda.empty_cache()
                continue
            record["samples"].append(sample)
            print(f"{kind:8} batch {batch:4d} new {new:5d} context {cached:6d}  "
                  f"{1e3 * sample['seconds']:9.3f} ms", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            record["elapsed_s"] = round(time.monotonic() - t_start, 1)
            output.write_text(json.dumps(record, indent=1) + "\n")  # a killed run keeps what it measured
    record["elapsed_s"] = round(time.monotonic() - t_start, 1)
    output.write_text(json.dumps(record, indent=1) + "\n")
    for s in record["skipped"]:
        print(f"skipped {s['kind']} batch {s['batch']} new {s['new']} context {s['context']}: {s['why']}")
    print(f"{len(record['samples'])} samples in {record['elapsed_s']:.0f} s{scaled}; wrote {output}")
    return record


if __name__ == "__main__":
    main()
