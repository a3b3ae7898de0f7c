"""The `batchgen` command line.

Exit codes: 0 success, 1 the run failed, 2 the job is not valid, 3 the input data cannot be read,
4 the directory given to `report` is not a publication (or the one given to `clean` not an output folder).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

EXIT_RUN_FAILED, EXIT_BAD_JOB, EXIT_BAD_DATA, EXIT_NOT_PUBLICATION = 1, 2, 3, 4

app = typer.Typer(
    name="batchgen",
    help="Offline batch generation with vLLM as a Prefect workflow: load, prompt, generate, validate, retry, publish.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

JobArg = Annotated[Path, typer.Argument(help="The job file (YAML).", show_default=False)]
LimitOpt = Annotated[Optional[int], typer.Option("--limit", min=1, help="Use only the first N rows of the input.")]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", help="Override a job field, e.g. --set sampling.max_tokens=64 (repeatable)."),
]


def _quiet_libraries(verbose: bool) -> None:
    """Library chatter off at the default level; everything with --verbose."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "DEBUG" if verbose else "WARNING")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "info" if verbose else "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    level = logging.DEBUG if verbose else logging.WARNING
    for name in ("great_expectations", "transformers", "httpx", "vllm"):
        logging.getLogger(name).setLevel(level)


def _fail(code: int, message: str) -> None:
    typer.echo(f"batchgen: {message}", err=True)
    raise typer.Exit(code)


def _load(job: Path, limit: int | None, sets: list[str] | None):
    from batchgen.job import JobError, load_job, parse_overrides

    try:
        pairs = list(sets or []) + ([f"input.limit={limit}"] if limit else [])
        return load_job(job, overrides=parse_overrides(pairs))
    except JobError as exc:
        _fail(EXIT_BAD_JOB, str(exc))


def _preflight(spec, model: bool = True):
    """Every check that needs no engine (batchgen.preflight); a user's mistake ends here with its exit code."""
    from batchgen.preflight import DataError, JobError, preflight

    try:
        return preflight(spec, model=model)
    except JobError as exc:
        _fail(EXIT_BAD_JOB, str(exc))
    except DataError as exc:
        _fail(EXIT_BAD_DATA, str(exc))


@app.command()
def run(
    job: JobArg,
    limit: LimitOpt = None,
    set_: SetOpt = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show library logs too.")] = False,
    retries: Annotated[Optional[int], typer.Option(
        "--retries", min=0, help="Retries of the whole run after a failure (default 1); each resumes from "
        "the committed results.")] = None,
) -> None:
    """Run a job: the batch-generation Prefect flow, end to end."""
    _quiet_libraries(verbose)
    spec = _load(job, limit, set_)
    # Before a Prefect server and an engine are started for nothing, and before the flow's
    # retry would repeat a failure that no retry can mend: the same checks as `check`.
    _preflight(spec)
    from batchgen.items import DataError
    from batchgen.job import JobError
    from flows.batch_generation import batch_generation

    try:
        flow_fn = batch_generation if retries is None else batch_generation.with_options(retries=retries)
        manifest = flow_fn(spec)
    except JobError as exc:
        _fail(EXIT_BAD_JOB, str(exc))
    except DataError as exc:
        _fail(EXIT_BAD_DATA, str(exc))
    except Exception as exc:  # the flow run is Failed in Prefect; say so plainly here
        _fail(EXIT_RUN_FAILED, f"the run failed: {type(exc).__name__}: {exc}")
    counts = manifest["counts"]
    typer.echo(json.dumps({"output": str(Path(spec.output.dir) / "current"), "publication": manifest["publication"],
                           "counts": counts, "rates": manifest["rates"]}, indent=2))


@app.command()
def check(
    job: JobArg,
    limit: LimitOpt = None,
    set_: SetOpt = None,
) -> None:
    """Validate a job and its data without loading the engine: items, rejected rows, prompt lengths, token estimate."""
    _quiet_libraries(False)
    spec = _load(job, limit, set_)
    checked = _preflight(spec)
    loaded, built, max_len = checked.loaded, checked.built, checked.max_model_len
    rejected = loaded.rejected + built.rejected
    lengths = built.prompts["n_prompt_tokens"]
    report = {
        "job": spec.name,
        "items": len(loaded.items) + len(loaded.rejected),
        "would_generate": len(built.prompts),
        "would_reject": [
            {"item_id": r.item_id, "row": r.row_number, "reasons": r.reasons, "detail": r.detail} for r in rejected
        ],
        "prompt_tokens": {
            "min": int(lengths.min()) if len(lengths) else 0,
            "max": int(lengths.max()) if len(lengths) else 0,
            "total": int(lengths.sum()),
            "model_limit": max_len,
        },
        "estimate": {
            "max_output_tokens_first_pass": len(built.prompts) * spec.sampling.candidates * spec.sampling.max_tokens,
        },
    }
    typer.echo(json.dumps(report, indent=2, ensure_ascii=False))


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(
        metavar="RUN_DIR", help="A finished run's output: the job's output.dir (its `current` publication is used) or one "
             "publication directory (holding manifest.json).", show_default=False)],
) -> None:
    """Rebuild the run report of a finished run: report.html and the GX Data Docs (data_docs/) in its publication.

    Reads only the publication's files (manifest.json, the accepted, rejected and attempts Parquet tables,
    validation.json): no engine, no Prefect server. Prints the path of report.html.
    Exit code 4 if RUN_DIR is not a publication.
    """
    _quiet_libraries(False)
    from batchgen.report import NotAPublicationError, write_report

    target = run_dir
    if not (run_dir / "manifest.json").exists() and (run_dir / "current" / "manifest.json").exists():
        target = (run_dir / "current").resolve()  # the output folder: its current publication
    try:
        path = write_report(target)
    except NotAPublicationError as exc:
        _fail(EXIT_NOT_PUBLICATION, str(exc))
    typer.echo(str(path))


@app.command()
def clean(
    target: Annotated[Path, typer.Argument(
        metavar="JOB_OR_DIR", help="A job file (its output.dir is cleaned) or an output folder.", show_default=False)],
) -> None:
    """Remove staged publications that runs killed while publishing left behind (full copies of the data).

    A staging that a live run is writing is left alone; committed publications are never touched.
    Every run does this when it starts publishing; this command does it now. Prints what was removed.
    """
    from batchgen.publish import PUBLICATIONS, clean_stale

    out = target
    if target.is_file():
        out = Path(_load(target, None, None).output.dir)
    if not (out / PUBLICATIONS).is_dir():
        _fail(EXIT_NOT_PUBLICATION, f"{out}: not a batchgen output folder (no {PUBLICATIONS}/ in it)")
    typer.echo(json.dumps({"output": str(out), "removed": [str(path) for path in clean_stale(out)]}, indent=2))


@app.command("run-sharded")
def run_sharded(
    job: Annotated[str, typer.Argument(help="The job file, as the workers see it (relative to their project "
                                            "folder, or absolute).", show_default=False)],
    shards: Annotated[int, typer.Option(min=1, help="Number of shards (deployment runs).")] = 2,
    deployment: Annotated[str, typer.Option(help="The batch-generation deployment each shard runs as.")] =
    "batch-generation/product-descriptions",
    output_dir: Annotated[Optional[str], typer.Option(help="Shared folder for the shards and the merged "
                                                          "publication; the job's output.dir by default.")] = None,
    limit: LimitOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run a job as N shards on a work pool's workers (each with its own engine), then publish one merged dataset.

    Needs a Prefect server (PREFECT_API_URL), the deployment registered (`make deploy`) and workers on its
    pool (`make worker`, one per machine or GPU). A shard whose run fails or whose worker dies is run again;
    finished shards are not.
    """
    _quiet_libraries(False)
    from batchgen.items import DataError
    from batchgen.job import JobError
    from flows.batch_generation import resolve_job

    try:  # the job as the sharded flow reads it here: its mistakes stop before any shard is started
        spec = resolve_job(job, limit, None, output_dir, list(set_ or []))
    except JobError as exc:
        _fail(EXIT_BAD_JOB, str(exc))
    _preflight(spec, model=False)
    try:
        from flows.sharded_batch_generation import sharded_batch_generation

        manifest = sharded_batch_generation(job, shards=shards, deployment=deployment, limit=limit,
                                            output_dir=output_dir, overrides=list(set_ or []))
    except JobError as exc:
        _fail(EXIT_BAD_JOB, str(exc))
    except DataError as exc:
        _fail(EXIT_BAD_DATA, str(exc))
    except Exception as exc:
        _fail(EXIT_RUN_FAILED, f"the run failed: {type(exc).__name__}: {exc}")
    typer.echo(json.dumps({"publication": manifest["publication"], "counts": manifest["counts"],
                           "shards": [{k: s[k] for k in ("shard", "flow_run_id")} for s in manifest["shards"]]},
                          indent=2))


@app.command()
def ui(
    port: Annotated[int, typer.Option(help="Port of the server and its UI.")] = 4200,
    host: Annotated[str, typer.Option(help="Address to listen on; loopback by default.")] = "127.0.0.1",
) -> None:
    """Start a Prefect server with its UI (runs, deployments, artifacts) at http://HOST:PORT.

    Run history is kept in $PREFECT_HOME/prefect.db (SQLite), or in PostgreSQL when
    PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://USER:PASSWORD@HOST:PORT/DB is set.
    Point runs, `prefect deploy` and workers at it with PREFECT_API_URL=http://HOST:PORT/api.
    """
    prefect = str(Path(sys.executable).with_name("prefect"))
    typer.echo(f"batchgen: Prefect UI at http://{host}:{port} (PREFECT_API_URL=http://{host}:{port}/api)", err=True)
    os.execv(prefect, [prefect, "server", "start", "--host", host, "--port", str(port)])


@app.command()
def serve(
    job: JobArg,
    name: Annotated[Optional[str], typer.Option(help="Deployment name; the job's name by default.")] = None,
    cron: Annotated[Optional[str], typer.Option(help='A cron schedule, e.g. "0 2 * * *" (UTC).')] = None,
    interval: Annotated[Optional[int], typer.Option(min=1, help="Or a schedule every N seconds.")] = None,
    limit: LimitOpt = None,
    set_: SetOpt = None,
) -> None:
    """Serve the job as a deployment from this process: no work pool or worker needed.

    The deployment `batch-generation/NAME` appears in the UI of the server PREFECT_API_URL points at;
    runs fire on the schedule, from the UI's Run button, or `prefect deployment run`, and execute
    here, one at a time, with one engine. Stop with Ctrl-C.
    """
    _quiet_libraries(False)
    spec = _load(job, limit, set_)
    from flows.batch_generation import batch_generation

    parameters: dict = {"job": str(job.resolve())}
    if limit:
        parameters["limit"] = limit
    if set_:
        parameters["overrides"] = list(set_)
    batch_generation.serve(name=name or spec.name, parameters=parameters, cron=cron, interval=interval,
                           limit=1, description=f"{spec.name}: served by `batchgen serve {job}`")


def main() -> None:
    sys.exit(app())


if __name__ == "__main__":
    main()
