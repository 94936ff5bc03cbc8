"""`prorsa serve` under load: many concurrent multi-turn sessions, and an oversized body among them.

  load    SESSIONS clients at once for SECONDS, each holding multi-turn chat conversations over
          /v1/chat/completions (X-Session-Id; each reply and a new user message appended; after
          TURNS turns the session is ended with a reward, POST /v1/sessions/{id}/end, and a new
          one begins): every answer's status and latency, requests/s
  big     while they run, one BIG_MB body POSTed to /v1/chat/completions twice: with its
          Content-Length, and chunked without one (cut where it passes the limit): the time from
          its first byte to the 413, and the server process's RSS growth over that window
  stop    SIGINT: the exit code, and the conversations trajectories.parquet kept

The server runs on emulated engines (cost-model timed, replies of the requested length). What the
issue asks of it: no 5xx, p50/p99 reported, each 413 in under a second with under 100 MB growth.

    .venv/bin/python benchmarks/serve_load.py [--sessions 200] [--seconds 60] [--turns 4]
        [--big-mb 100] [--out benchmarks/results/serve-load.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import one another by bare name

from serve_overhead import provenance, serving  # noqa: E402

CHUNK = 2**20  # bytes per write of the big body


class Tally:
    """What the clients saw."""

    def __init__(self) -> None:
        # (start on the client's clock, seconds to the answer, status, turn) per chat request
        self.answers: list[tuple[float, float, int, int]] = []
        self.ends: dict[int, int] = {}  # status of POST /v1/sessions/{id}/end -> count
        self.failures: dict[str, int] = {}  # transport errors by kind (no status at all)


class RssSampler:
    """The server process's resident memory every 20 ms, on a thread of its own (the clients' event
    loop is busy)."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.proc, self.samples = psutil.Process(pid), []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.samples.append((time.perf_counter(), self.proc.memory_info().rss))
            except Exception:  # the process is gone: nothing more to sample
                return

    def between(self, t0: float, t1: float) -> list[int]:
        return [rss for t, rss in list(self.samples) if t0 <= t <= t1]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


async def session_worker(client, w: int, until: float, turns: int, max_tokens: int, tally: Tally) -> None:
    import httpx

    k = 0
    while time.perf_counter() < until:
        session, k = f"load-{w}-{k}", k + 1
        messages = [{"role": "user", "content": f"Session {session}: what is {w} + {k}?"}]
        for turn in range(turns):
            t0 = time.perf_counter()
            try:
                r = await client.post("/v1/chat/completions", headers={"X-Session-Id": session}, json={
                    "model": "tiny", "messages": messages, "max_tokens": max_tokens})
            except httpx.HTTPError as e:
                tally.failures[type(e).__name__] = tally.failures.get(type(e).__name__, 0) + 1
                break
            tally.answers.append((t0, time.perf_counter() - t0, r.status_code, turn))
            if r.status_code != 200:
                break
            messages += [r.json()["choices"][0]["message"],
                         {"role": "user", "content": f"Turn {turn + 1} done; go on."}]
        try:
            r = await client.post(f"/v1/sessions/{session}/end", json={"reward": 1.0})
            tally.ends[r.status_code] = tally.ends.get(r.status_code, 0) + 1
        except httpx.HTTPError as e:
            tally.failures[type(e).__name__] = tally.failures.get(type(e).__name__, 0) + 1


async def big_post(host: str, port: int, body: bytes, chunked: bool) -> tuple[float, int, dict]:
    """POST BODY on a raw connection, writing it while waiting for the answer (the server may answer
    before it has read it, and then reads no more); -> (seconds from the first byte to the status
    line, status, the error object)."""
    reader, writer = await asyncio.open_connection(host, port)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            + ("Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {len(body)}\r\n") + "\r\n")

    async def send() -> None:
        writer.write(head.encode())
        view = memoryview(body)
        for i in range(0, len(body), CHUNK):
            piece = view[i:i + CHUNK]
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n" if chunked else piece)
            await writer.drain()
        if chunked:
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    t0 = time.perf_counter()
    sending = asyncio.create_task(send())
    status_line = await reader.readline()
    elapsed = time.perf_counter() - t0
    sending.cancel()
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    error = json.loads(await reader.readexactly(int(headers.get("content-length", 0)))) if headers else {}
    writer.close()
    return elapsed, int(status_line.split()[1]), error.get("error", {})


def payload(mb: float) -> bytes:
    head, tail = b'{"model": "tiny", "messages": [{"role": "user", "content": "', b'"}]}'
    return head + b"x" * (int(mb * 2**20) - len(head) - len(tail)) + tail


async def load(url: str, pid: int, args: argparse.Namespace) -> dict:
    import httpx

    base = urlsplit(url)
    tally, rss = Tally(), RssSampler(pid)
    limits = httpx.Limits(max_connections=args.sessions + 8, max_keepalive_connections=args.sessions + 8)
    async with httpx.AsyncClient(base_url=f"{base.scheme}://{base.netloc}", timeout=300, limits=limits) as client:
        t0 = time.perf_counter()
        until = t0 + args.seconds
        workers = [asyncio.create_task(session_worker(client, w, until, args.turns, args.max_tokens, tally))
                   for w in range(args.sessions)]
        await asyncio.sleep(args.seconds / 3)  # the sessions well under way
        body, bigs = payload(args.big_mb), []
        for chunked in (False, True):
            before = rss.between(time.perf_counter() - 1.0, time.perf_counter())
            sent = time.perf_counter()
            elapsed, status, error = await big_post(base.hostname, base.port, body, chunked)
            await asyncio.sleep(2.0)  # whatever the body left behind shows by now
            during = rss.between(sent, time.perf_counter())
            others = [a for a in tally.answers if sent <= a[0] + a[1] <= sent + 2.0]  # served meanwhile
            bigs.append({"length": "chunked" if chunked else "declared", "mb": args.big_mb, "status": status,
                         "code": error.get("code"), "to_413_s": round(elapsed, 4),
                         "rss_before_mb": round(statistics.median(before) / 2**20, 1),
                         "rss_growth_mb": round((max(during) - statistics.median(before)) / 2**20, 1),
                         "answered_meanwhile": len(others)})
            print(f"big body ({bigs[-1]['length']}): {status} in {elapsed:.3f} s, RSS "
                  f"+{bigs[-1]['rss_growth_mb']} MB, {len(others)} other answers in the 2 s after", file=sys.stderr)
        del body
        await asyncio.gather(*workers)
        wall = time.perf_counter() - t0
    rss.stop()
    lat = sorted(a[1] for a in tally.answers)

    def quantiles(xs: list[float]) -> dict[str, float]:
        xs = sorted(xs)
        return {"p50": round(xs[len(xs) // 2], 4), "p99": round(xs[int(len(xs) * 0.99)], 4), "max": round(xs[-1], 4)}

    codes: dict[int, int] = {}
    for a in tally.answers:
        codes[a[2]] = codes.get(a[2], 0) + 1
    return {
        "requests": len(lat), "wall_s": round(wall, 2), "requests_per_s": round(len(lat) / wall, 1),
        "status": {str(k): v for k, v in sorted(codes.items())},
        "server_errors": sum(v for k, v in codes.items() if k >= 500),
        "transport_errors": tally.failures, "session_ends": {str(k): v for k, v in sorted(tally.ends.items())},
        "latency_s": quantiles(lat),
        # a session's first request opens its trajectory; the others continue one
        "latency_first_turn_s": quantiles([a[1] for a in tally.answers if a[3] == 0]),
        "latency_later_turns_s": quantiles([a[1] for a in tally.answers if a[3] > 0]),
        "server_rss_mb": {"first": round(rss.samples[0][1] / 2**20, 1), "last": round(rss.samples[-1][1] / 2**20, 1),
                          "max": round(max(s[1] for s in rss.samples) / 2**20, 1)},
        "big_bodies": bigs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipeline", type=Path, default=ROOT / "pipelines/serve.yaml")
    ap.add_argument("--sessions", type=int, default=200, help="clients at once")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long they start new requests")
    ap.add_argument("--turns", type=int, default=4, help="requests per session before it is ended")
    ap.add_argument("--max-tokens", type=int, default=16, help="each reply's length")
    ap.add_argument("--big-mb", type=float, default=100.0, help="the oversized body (the server's limit: 16 MB)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/serve-load.json")
    args = ap.parse_args()

    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        stopped: list[int] = []
        with serving(args.pipeline, "emulated", out, stopped) as (url, proc):
            figures = asyncio.run(load(url, proc.pid, args))
        rows = pq.read_table(out / "trajectories.parquet", columns=["status", "turns"]).to_pylist()
    doc = {
        **provenance("serve_load.py"),
        "pipeline": args.pipeline.name, "engine": "emulated", "sessions": args.sessions, "seconds": args.seconds,
        "turns": args.turns, "max_tokens": args.max_tokens, **figures,
        "exit_code": stopped[0], "trajectories_saved": len(rows), "turns_saved": sum(len(r["turns"]) for r in rows),
    }
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
