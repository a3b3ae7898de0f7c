"""The `batchgen` command line.

Exit codes: 0 success, 1 the run failed, 2 the job is not valid, 3 the input data cannot be read,
4 the directory given to `report` is not a publication (or the one given to `clean` not an output folder).
"""

from __future__ import annotations

import contextlib
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
DeploymentNameOpt = Annotated[Optional[str], typer.Option(help="Deployment name; the job's name by default.")]
IntervalOpt = Annotated[Optional[int], typer.Option(min=1, help="Or a schedule every N seconds.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show library logs too.")]


THIRD_PARTY = r"(vllm|torch|transformers|great_expectations|prefect|pydantic|huggingface_hub|triton)(\.|$)"


def _quiet_libraries(verbose: bool) -> None:
    """Library chatter off at the default level (their warnings, weight-loading and metric bars, Prefect's task
    logs on the console; the Prefect UI still gets every log); everything with --verbose. A user's own
    setting of any of these variables wins."""
    os.environ["BATCHGEN_VERBOSE"] = "1" if verbose else "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "DEBUG" if verbose else "ERROR")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "info" if verbose else "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Prefect's console handler only: its API handler still sends every flow and task log to the UI.
    console = "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"
    if console not in os.environ:
        os.environ[console] = "INFO" if verbose else "WARNING"
        _prefect_console(os.environ[console])
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "INFO" if verbose else "ERROR")  # c10's NUMA-binding notes
    level = logging.DEBUG if verbose else logging.ERROR
    for name in ("great_expectations", "transformers", "httpx", "vllm"):
        logging.getLogger(name).setLevel(level)
    if not verbose:
        import warnings

        warnings.filterwarnings("ignore", module=THIRD_PARTY)  # deprecation notes meant for their developers


def _prefect_console(level: str) -> None:
    """Prefect reads its logging settings when it is imported; `python -m flows.batch_generation` imports it before
    the command line runs, so its console handlers are set here too."""
    if "prefect" not in sys.modules:
        return
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger()] + [logger for logger in logging.Logger.manager.loggerDict.values()
                                       if isinstance(logger, logging.Logger)]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, PrefectConsoleHandler):
                handler.setLevel(level)


def _fail(code: int, message: str) -> None:
    typer.echo(f"batchgen: {message}", err=True)
    raise typer.Exit(code)


@contextlib.contextmanager
def _user_errors(run_failed: str | None = None):
    """A job mistake exits 2, a data mistake 3, each with its message; with `run_failed`, any other failure (the flow
    run is Failed in Prefect) exits 1, saying so plainly, the text `run_failed` after it."""
    from batchgen.items import DataError
    from batchgen.job import JobError

    try:
        yield
    except typer.Exit:
        raise
    except JobError as exc:
        _fail(EXIT_BAD_JOB, str(exc))
    except DataError as exc:
        _fail(EXIT_BAD_DATA, str(exc))
    except Exception as exc:
        if run_failed is None:
            raise
        _fail(EXIT_RUN_FAILED, f"the run failed: {type(exc).__name__}: {exc}{run_failed}")


def _load(job: Path, limit: int | None, sets: list[str] | None):
    from batchgen.resolve import resolve_job

    with _user_errors():
        return resolve_job(job, limit=limit or None, overrides=list(sets or []))


def _preflight(spec, model: bool = True):
    """Every check that needs no engine (batchgen.preflight); a user's mistake ends here with its exit code."""
    from batchgen.preflight import preflight
    from expectations.check import check_expectations

    with _user_errors():
        checked = preflight(spec, model=model)
        check_expectations(spec)  # the job's own GX expectations, on a sample output
        return checked


def _batch_flow(retries: int | None):
    """The batch-generation flow; with --retries, Prefect retries the whole flow run that many times."""
    from flows.batch_generation import batch_generation

    return batch_generation if retries is None else batch_generation.with_options(retries=retries)


@app.command()
def run(
    job: JobArg,
    limit: LimitOpt = None,
    set_: SetOpt = None,
    verbose: VerboseOpt = False,
    retries: Annotated[Optional[int], typer.Option(
        "--retries", min=0, help="Retries of the whole run after a failure (default 1); each resumes from "
        "the committed results.")] = None,
) -> None:
    """Run a job: the batch-generation Prefect flow, end to end."""
    _quiet_libraries(verbose)
    spec = _load(job, limit, set_)
    # Before a Prefect server and an engine are started for nothing, and before the flow's
    # retry would repeat a failure that no retry can mend: the same checks as `check`.
    checked = _preflight(spec)
    # The job holds up: the engine starts now (in the background), while Prefect's server and the flow start.
    from tasks.generate import start_engine_early

    start_engine_early(spec, checked.loaded, say=False)
    with _user_errors(run_failed=""):
        manifest = _batch_flow(retries)(spec)
    counts = manifest.counts
    from batchgen.report import REPORT

    published = (Path(spec.output.dir) / "current").resolve()
    typer.echo(json.dumps({"output": str(Path(spec.output.dir) / "current"), "publication": manifest.publication,
                           "report": str(published / REPORT), "counts": counts.to_json(),
                           "rates": manifest.rates.to_json()}, indent=2))
    typer.echo(f"batchgen: {counts.accepted} accepted, {counts.rejected} rejected of {counts.items} items "
               f"in {published}; report: {published / REPORT}", err=True)


@app.command()
def check(
    job: JobArg,
    limit: LimitOpt = None,
    set_: SetOpt = None,
    sample: Annotated[int, typer.Option(
        "--sample", min=0, help="Also generate the first N prompts on the engine (it starts: seconds on a small "
        "model) and measure how many are cut off at sampling.max_tokens.")] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the JSON report on stdout: no rendered "
                                                              "prompts or warnings on stderr.")] = False,
) -> None:
    """Validate a job and its data without loading the engine: items, rejected rows, prompt lengths, token estimate.

    Shows the first prompts as the model will see them (after its chat template) and warns when the
    first pass's budget (sampling.max_tokens) would cut outputs off: against the expectations' min_chars
    without the engine, measured on a sample with --sample N. Says how many first-pass outputs the job's output
    already holds (`resume`): a run after a crash, or a rerun, reuses them.
    """
    _quiet_libraries(False)
    spec = _load(job, limit, set_)
    checked = _preflight(spec)
    from batchgen.preflight import committed_first_pass, preview_prompts, sample_outputs, truncation_estimate

    loaded, built, max_len = checked.loaded, checked.built, checked.max_model_len
    rejected = loaded.rejected + built.rejected
    lengths = built.prompts["n_prompt_tokens"]
    measured = None
    if sample and len(built.prompts):
        import batchgen.engine

        try:
            measured = sample_outputs(spec, checked, sample)
        finally:
            batchgen.engine.shutdown_all()
    truncation, warnings = truncation_estimate(spec, checked, measured)
    prompts = preview_prompts(checked)
    from tasks.generate import store_for

    resume = committed_first_pass(spec, checked, store_for(spec))
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
        "truncation": truncation,
        "resume": resume,
        "prompts": prompts,
        "warnings": warnings,
    }
    if not quiet:
        for shown in prompts:
            typer.echo(f"--- prompt of row {shown['row']} (item {shown['item_id']}, {shown['n_prompt_tokens']} "
                       f"tokens), as the model sees it ---\n{shown['text']}", err=True)
        if prompts:
            typer.echo("---", err=True)
        for warning in warnings:
            typer.echo(f"batchgen: warning: {warning}", err=True)
        if resume["committed"]:
            rest = (f"generates the other {resume['to_generate']} (and the retries they need)" if resume["to_generate"]
                    else "generates no first pass again")
            typer.echo(f"batchgen: {resume['committed']} of {len(built.prompts)} first-pass outputs are already "
                       f"committed in {resume['store']}: a run reuses them and {rest}", err=True)
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
    from batchgen.resolve import resolve_job

    with _user_errors():  # the job as the sharded flow reads it here: its mistakes stop before any shard is started
        spec = resolve_job(job, limit, None, output_dir, list(set_ or []))
    _preflight(spec, model=False)
    with _user_errors(run_failed=""):
        from flows.sharded_batch_generation import sharded_batch_generation

        manifest = sharded_batch_generation(job, shards=shards, deployment=deployment, limit=limit,
                                            output_dir=output_dir, overrides=list(set_ or []))
    typer.echo(json.dumps({"publication": manifest.publication, "counts": manifest.counts.to_json(),
                           "shards": [{k: s[k] for k in ("shard", "flow_run_id")} for s in manifest.shards]},
                          indent=2))


def ui_api_url(host: str, port: int) -> str:
    """The API URL the UI in a browser talks to: the server's own address (a wildcard host means this machine's
    name, since a browser cannot reach 0.0.0.0)."""
    if host in ("0.0.0.0", "::", ""):
        import socket

        host = socket.getfqdn()
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/api"


@app.command("run-batch")
def run_batch(
    input_file: Annotated[Path, typer.Option("--input-file", "-i", help="OpenAI Batch input file (JSONL): custom_id, "
                                             "method, url (/v1/chat/completions or /v1/completions), body.",
                                             show_default=False)],
    output_file: Annotated[Path, typer.Option("--output-file", "-o", help="Output file: one response line per "
                                              "completed request, in input order.", show_default=False)],
    error_file: Annotated[Optional[Path], typer.Option(help="Error file: one line per failed request, in input order; "
                                                       "OUTPUT.errors.jsonl beside the output by default.")] = None,
    model: Annotated[Optional[str], typer.Option(help="Model folder or hub id (engine.model); the embedded "
                                                 "SmolLM2-135M-Instruct by default.")] = None,
    served_model_name: Annotated[Optional[list[str]], typer.Option(
        help="A name body.model may use (repeatable); --model and its folder name by default.")] = None,
    job: Annotated[Optional[Path], typer.Option(
        help="A job file without input, prompt and output: its engine, sampling defaults, expectations and retry "
             "apply to every line.")] = None,
    output_dir: Annotated[Optional[Path], typer.Option(help="Where each group's run publishes and keeps its result "
                                                       "store (a rerun resumes from it); OUTPUT.batchgen/ by default.")]
    = None,
    dtype: Annotated[Optional[str], typer.Option(help="engine.dtype (auto, float32, bfloat16, float16).")] = None,
    max_model_len: Annotated[Optional[int], typer.Option(min=16, help="engine.max_model_len.")] = None,
    seed: Annotated[Optional[int], typer.Option(help="engine.seed (the engine is seeded, not each request).")] = None,
    tensor_parallel_size: Annotated[Optional[int], typer.Option(min=1, help="engine.tensor_parallel_size.")] = None,
    gpu_memory_utilization: Annotated[Optional[float], typer.Option(help="engine.gpu_memory_utilization.")] = None,
    max_num_seqs: Annotated[Optional[int], typer.Option(min=1, help="engine.max_num_seqs.")] = None,
    retries: Annotated[Optional[int], typer.Option(
        "--retries", min=0, help="Retries of each group's run after a failure (default 1).")] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Run an OpenAI Batch file (the flags of `vllm run-batch`) through the batch-generation flow.

    Lines are grouped by their sampling settings (max_tokens and temperature may differ within a group); each
    group is one flow run. Prints the counts; exit code 0 also when some lines failed (see the error file).
    """
    _quiet_libraries(verbose)
    from batchgen import openai_batch

    engine = {"model": model, "dtype": dtype, "max_model_len": max_model_len, "seed": seed,
              "tensor_parallel_size": tensor_parallel_size, "gpu_memory_utilization": gpu_memory_utilization,
              "max_num_seqs": max_num_seqs}
    with _user_errors():
        base = openai_batch.base_job(job, engine)

    def flow_fn(spec):  # Prefect and the flow are imported once a group runs: a bad file fails fast
        return _batch_flow(retries)(spec)

    with _user_errors(run_failed=" (run the same command again to resume)"):
        summary = openai_batch.run_batch_file(
            input_file, output_file, error_file or openai_batch.default_error_file(output_file),
            output_dir or openai_batch.default_work_dir(output_file), base,
            openai_batch.served_names(base["engine"].get("model"), served_model_name), flow_fn,
            log=lambda line: typer.echo(line, err=True))
    typer.echo(json.dumps(summary, indent=2))


@app.command()
def ui(
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port of the server and its UI.")] = 4200,
    host: Annotated[str, typer.Option(help="Address to listen on; loopback by default.")] = "127.0.0.1",
    api_url: Annotated[Optional[str], typer.Option(
        help="The API URL the UI in the browser uses; http://HOST:PORT/api by default (set it when the server is "
             "reached through a proxy or another name).")] = None,
) -> None:
    """Start a Prefect server with its UI (runs, deployments, artifacts) at http://HOST:PORT.

    Run history is kept in $PREFECT_HOME/prefect.db (SQLite), or in PostgreSQL when
    PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://USER:PASSWORD@HOST:PORT/DB is set.
    Point runs, `prefect deploy` and workers at it with PREFECT_API_URL=http://HOST:PORT/api.
    """
    prefect = str(Path(sys.executable).with_name("prefect"))
    api = api_url or ui_api_url(host, port)
    # Prefect's UI asks the server for its API URL (PREFECT_UI_API_URL, server.ui.api_url), which otherwise
    # follows PREFECT_API_URL or PREFECT_SERVER_API_PORT (4200), not `--port`: the UI would talk to another server.
    env = {**os.environ, "PREFECT_UI_API_URL": api, "PREFECT_SERVER_API_HOST": host,
           "PREFECT_SERVER_API_PORT": str(port)}
    env.pop("PREFECT_SERVER_UI_API_URL", None)  # the other name of the same setting would win over ours
    typer.echo(f"batchgen: Prefect UI at http://{host}:{port} (PREFECT_API_URL={api})", err=True)
    os.execve(prefect, [prefect, "server", "start", "--host", host, "--port", str(port)], env)


@app.command()
def serve(
    job: JobArg,
    name: DeploymentNameOpt = None,
    cron: Annotated[Optional[str], typer.Option(help='A cron schedule, e.g. "0 2 * * *" (UTC).')] = None,
    interval: IntervalOpt = None,
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
    from deployments.register import deployment_parameters
    from flows.batch_generation import batch_generation

    parameters = deployment_parameters(job, limit, set_)
    batch_generation.serve(name=name or spec.name, parameters=parameters, cron=cron, interval=interval,
                           limit=1, description=f"{spec.name}: served by `batchgen serve {job}`")


@app.command()
def deploy(
    job: JobArg,
    name: DeploymentNameOpt = None,
    cron: Annotated[Optional[str], typer.Option(help='A cron schedule, e.g. "0 2 * * *".')] = None,
    interval: IntervalOpt = None,
    timezone: Annotated[str, typer.Option(help="Time zone of the cron schedule.")] = "UTC",
    pool: Annotated[str, typer.Option(help="Work pool whose workers run it (a process pool is created when "
                                           "missing).")] = "batchgen",
    limit: LimitOpt = None,
    set_: SetOpt = None,
) -> None:
    """Register a deployment of a job file on the Prefect server PREFECT_API_URL points at.

    The deployment `batch-generation/NAME` runs the job on the pool's workers (`prefect worker start --pool
    POOL`), from this project folder, on the schedule, from the UI's Run button (its form: job path, limit,
    max_tokens, temperature, output_dir, overrides) or with `prefect deployment run`. Deploying again under the
    same name updates it. The job is checked first; its path is recorded as an absolute path, so workers must see
    the same files (one machine, or a shared folder).
    """
    _quiet_libraries(False)
    if cron is not None and interval is not None:
        _fail(EXIT_BAD_JOB, "--cron and --interval: give one schedule")
    from deployments.register import DeployError, deploy_job, server_api_url

    spec = _load(job, limit, set_)
    try:
        server_api_url()  # before the slower checks: without a server there is nothing to deploy to
    except DeployError as exc:
        _fail(EXIT_RUN_FAILED, str(exc))
    _preflight(spec, model=False)
    try:
        deployed = deploy_job(job.resolve(), name or spec.name, pool=pool, cron=cron, interval=interval,
                              timezone=timezone, limit=limit, overrides=list(set_ or []), description=spec.name)
    except DeployError as exc:
        _fail(EXIT_RUN_FAILED, str(exc))
    typer.echo(json.dumps(deployed, indent=2))


@app.command()
def schema(
    markdown: Annotated[bool, typer.Option("--markdown", help="The job reference in Markdown "
                                                              "(docs/job-reference.md) instead.")] = False,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write to this file instead of stdout.")]
    = None,
) -> None:
    """Print the job file's JSON Schema, for editors that complete and check job files.

    Save it (`batchgen schema -o job.schema.json`) and start a job file with
    `# yaml-language-server: $schema=job.schema.json`. With --markdown: the job reference, every field with its
    type, default, bounds and description.
    """
    from batchgen.jobdoc import reference_markdown, schema_text

    text = reference_markdown() if markdown else schema_text()
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        typer.echo(str(output), err=True)


@app.command()
def init(
    data_file: Annotated[Path, typer.Argument(metavar="DATA_FILE", help="A CSV, JSONL or Parquet file, one item per "
                                                                        "row.", show_default=False)],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the job.")] = Path("job.yaml"),
    force: Annotated[bool, typer.Option("--force", help="Replace the job file if it exists.")] = False,
) -> None:
    """Write a starter job for a data file: a prompt template naming its columns, sensible defaults, comments.

    Then `batchgen check JOB` shows what it would do and `batchgen run JOB --limit 20` tries it.
    """
    _quiet_libraries(False)
    from batchgen.jobdoc import starter_job

    if output.exists() and not force:
        _fail(EXIT_BAD_JOB, f"{output}: exists; choose another file with -o, or replace it with --force")
    with _user_errors():
        text = starter_job(data_file, output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    typer.echo(f"batchgen: wrote {output}; next: batchgen check {output}", err=True)


def main() -> None:
    sys.exit(app())


if __name__ == "__main__":
    main()
