"""What a failed device-graph capture leaves behind, measured in a fresh process.

    python benchmarks/capture_aftermath.py [--mode guarded|unguarded|driver]

One process per mode (a failed capture can poison the process that ran it):

* ``guarded``: ``DeviceGraph.capture`` of a function that calls ``.item()``;
* ``unguarded``: the same function under a bare ``torch.cuda.graph`` (what attnhal did
  before the guard; shows what this torch does without it);
* ``driver``: ``DeviceGraph.capture`` of a function that calls ``torch.cuda.synchronize()``,
  which no sync debug mode sees: the driver fails the capture.

Then it asks: did the capture raise (and what)? Is the current stream the one from
before? Is the sync debug mode restored? Does ``torch.cuda.empty_cache()`` work? Does a
fresh capture of a correct function replay right, and how many allocations did its
replay make? Prints one JSON object. Without a CUDA/HIP device it prints one
``SKIP`` line and exits 0.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import torch


def _attempt(what: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the probe reports every outcome
        return f"{what} raised {type(exc).__name__}: {str(exc)[:300]}"


def _failing_capture(mode: str, x: torch.Tensor) -> str:
    from attnhal.graphs import DeviceGraph

    def host_sync() -> Any:
        return (x * 2).sum().item()

    def driver_sync() -> Any:
        y = x * 2
        torch.cuda.synchronize()
        return y

    try:
        if mode == "unguarded":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                host_sync()
        else:
            DeviceGraph(x.device, warmup_iters=0).capture(host_sync if mode == "guarded" else driver_sync)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc)[:400]}"
    return "nothing raised"


def _fresh_capture(device: torch.device) -> dict[str, Any]:
    from attnhal.graphs import DeviceGraph

    static = torch.zeros(1024, device=device)
    graph = DeviceGraph(device)
    out = graph.capture(lambda: static * 3 + 1)
    static.copy_(torch.arange(1024.0, device=device))
    graph.replay()
    torch.cuda.synchronize(device)
    want = torch.arange(1024.0) * 3 + 1
    return {"replays_right": bool(torch.equal(out.cpu(), want)), "replay_allocations": graph.replay_allocations}


def probe(mode: str) -> dict[str, Any]:
    device = torch.device("cuda", torch.cuda.current_device())
    x = torch.ones(1024, device=device)
    stream, sync_mode = torch.cuda.current_stream(device), torch.cuda.get_sync_debug_mode()
    report: dict[str, Any] = {"mode": mode, "torch": torch.__version__,
                              "hip": getattr(torch.version, "hip", None), "device": torch.cuda.get_device_name(device)}
    report["raised"] = _failing_capture(mode, x)
    report["stream_restored"] = torch.cuda.current_stream(device) == stream
    report["sync_debug_mode_restored"] = torch.cuda.get_sync_debug_mode() == sync_mode
    report["empty_cache"] = _attempt("empty_cache", lambda: torch.cuda.empty_cache() or "ok")
    report["eager_after"] = _attempt("eager", lambda: float((x + 1).sum().item()))
    report["next_capture"] = _attempt("next capture", lambda: _fresh_capture(device))
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("guarded", "unguarded", "driver"), default="guarded")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("SKIP capture aftermath: no CUDA/HIP device")
        return 0
    print(json.dumps(probe(args.mode)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
