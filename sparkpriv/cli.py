"""The ``sparkpriv`` command line (thin: parse, call one library function, exit).

Exit codes: 0 ok, 2 bad arguments or input, 3 budget refused, 1 anything else.
Every command takes ``--config FILE.toml`` holding the same options (the
command line wins); unknown keys are errors.

Fixed seeds are refused: no command runs (exit 2, before Spark starts) while
the environment variable ``SPARKPRIV_INSECURE_TEST_SEED`` is set or inside
:class:`sparkpriv.privacy.random.insecure_fixed_seed` (tests only).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from typing import Sequence

from sparkpriv.config import Option, build_config, load_toml, split_file_values
from sparkpriv.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, ParameterError, SparkPrivError

__all__ = ["main", "build_parser"]

_log = logging.getLogger("sparkpriv")

GENERATE_BLOBS_OPTIONS = (
    Option("rows", "int", "number of rows", required=True),
    Option("cols", "int", "number of feature columns f0..", required=True),
    Option("output", "str", "output Parquet directory", required=True),
    Option("clusters", "int", "number of blobs (label column)", default=2),
    Option("separation", "float", "distance between the closest blob centres", default=4.0),
    Option("cluster_std", "float", "standard deviation around each centre", default=1.0),
    Option("seed", "int", "public seed of the sample data", default=0),
    Option("partitions", "int", "Spark partitions (default: by size)"),
    Option("overwrite", "bool", "replace an existing output", default=False),
)

GENERATE_EVENTS_OPTIONS = (
    Option("people", "int", "number of people (callers / card holders)", required=True),
    Option("output", "str", "output Parquet directory of the event table", required=True),
    Option("map_output", "str", "also write the public map (item id, x, y) as CSV here: usable as --vocabulary"),
    Option("items", "int", "number of towers / stations [default: 1303 cdr, 342 transit]"),
    Option("mu", "float", "log-normal mu of the distinct items per person (see docs/generators.md)"),
    Option("sigma", "float", "log-normal sigma of the distinct items per person"),
    Option("events_per_item", "float", "mean events per (person, visited item) [default: 2 cdr, 3 transit]"),
    Option("period_days", "int", "days covered by the timestamps", default=30),
    Option("seed", "int", "public seed of the sample data", default=0),
    Option("partitions", "int", "Spark partitions (default: by size)"),
    Option("overwrite", "bool", "replace an existing output", default=False),
)

EVALUATE_COUNTING_OPTIONS = (
    Option("source", "str", "the PRIVATE source event table (path or table name; owner side)", required=True),
    Option("source_format", "str", "format of the source", choices=("parquet", "csv", "table")),
    Option("person_col", "str", "person-key column of the source", required=True),
    Option("item_col", "str", "item column of the source", required=True),
    Option("vocabulary", "str", "the public item ids: a file of ids or a range 'a..b'", required=True),
    Option("release", "str", "the release table to evaluate (path or table name)", required=True),
    Option("release_format", "str", "format of the release", choices=("parquet", "csv", "table")),
    Option("release_columns", "strs", "dense release: one column per item, in vocabulary order"),
    Option("release_prefix", "str", "dense release: columns PREFIX0..PREFIX{d-1}"),
    Option("release_items_col", "str", "sparse release: array<int> column of item indices", default="items"),
    Option("release_item_ids", "bool", "sparse release: the array column holds item ids of --vocabulary, not "
           "indices (sparkpriv synthesize of a model released on --events)", default=False),
    Option("release_events", "bool", "the release is an event table, one row per (person, item) (sparkpriv "
           "synthesize --explode)", default=False),
    Option("release_person_col", "str", "event-table release: its person column [default: --person-col]"),
    Option("release_item_col", "str", "event-table release: its item column [default: --item-col]"),
    Option("threshold", "float", "dense release: an item is visited when its value >= this", default=0.5),
    Option("queries", "int", "number of random queries", default=1000),
    Option("groups", "int", "query groups of growing length", default=5),
    Option("max_length", "int", "longest query [default: max distinct items of a person in the source]"),
    Option("seed", "int", "seed of the random queries", default=0),
    Option("release_people", "int", "the people the release stands for; its answers are scaled by the "
           "source's people / this [default: the release's rows; give the --rows of the synthesis for an "
           "event-table release]"),
)


SYNTHESIZE_OPTIONS = (
    Option("model", "str", "the output directory of a DPGM or synthetic release (sparkpriv release dpgm|synthetic)",
           required=True),
    Option("rows", "int", "number of synthetic rows (people, for a model released on --events)", required=True),
    Option("output", "str", "output Parquet directory of the synthetic table", required=True),
    Option("explode", "bool", "a model released on --events: one row per (person, item) under the source's "
           "person and item column names, instead of one row per person (person, items array)", default=False),
    Option("wide", "bool", "a model released on --events: one 0/1 column per vocabulary item (x0, x1, ...) "
           "instead of the events", default=False),
    Option("partitions", "int", "Spark partitions, i.e. output files (default: by size)"),
    Option("seed", "int", "a public seed that makes the synthetic table reproducible (recorded in its receipt; "
           "default: fresh entropy)"),
    Option("writer", "str", "who writes the part files", choices=("auto", "spark", "arrow"), default="auto"),
    Option("overwrite", "bool", "replace an existing output", default=False),
)


class _ArgParser(argparse.ArgumentParser):
    def error(self, message):  # exit code 2 with a clear message (argparse's default too)
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"sparkpriv: error: {message}\n")


def _add_options(p: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    for o in options:
        flag = "--" + o.name.replace("_", "-")
        if o.required:
            unless = getattr(o, "required_unless", None)
            help_ = o.help + (f" (required without --{unless.replace('_', '-')}; refused with it)" if unless
                             else " (required)")
            if o.name in ("lower", "upper"):
                help_ += "; or give all bounds in --bounds-file"
        else:
            help_ = o.help
        if o.default not in (None, (), False):
            help_ += f" [default: {o.default}]"
        if o.type == "bool":
            p.add_argument(flag, dest=o.name, action="store_const", const=True, default=None, help=help_)
        else:
            p.add_argument(flag, dest=o.name, default=None, metavar=o.name.upper(), help=help_)


def _leaf(sub, name: str, help_: str, handler, options: Sequence[Option] = ()):
    p = sub.add_parser(name, help=help_, description=help_)
    _add_options(p, options)
    p.add_argument("--config", help="TOML file with the same options (command line wins)")
    p.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING, ERROR")
    p.set_defaults(_handler=handler, _options=tuple(options), _leaf=p, _spark={})
    return p


def _command_words(argv: Sequence[str]) -> list[str]:
    """The sub-command words of ``argv`` before its first option, e.g. ``["release", "projection"]``."""
    words = []
    for a in argv:
        if a.startswith("-"):
            break
        words.append(a)
    return words


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``argv``, only the branch ``argv`` names gets its leaves' options
    (a mechanism's options only when ``argv`` releases with it, a benchmark's only when it runs
    it): their modules are costly to import, and ``sparkpriv --help``, ``--version`` and the
    ledger commands import neither them nor numpy (docs/architecture.md, "Start-up time")."""
    from sparkpriv.runner import MECHANISMS

    words = None if argv is None else _command_words(argv)
    command = None if not words else words[0]
    leaf = None if words is None or len(words) < 2 else words[1]

    def wanted(cmd: str) -> bool:  # does argv reach the leaves of this command?
        return words is None or command == cmd

    parser = _ArgParser(prog="sparkpriv", description="Differentially private releases of large tables on Spark.")
    from sparkpriv import __version__

    parser.add_argument("--version", action="version", version=f"sparkpriv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgParser)

    rel = sub.add_parser("release", help="release a private table").add_subparsers(
        dest="mechanism", required=True, parser_class=_ArgParser)
    if wanted("release"):
        from sparkpriv.config import COMMON_OPTIONS
        from sparkpriv.runner import options_for

        for name, spec in sorted(MECHANISMS.items()):
            releasing = words is None or leaf == name
            _leaf(rel, name, spec.summary, _cmd_release, options_for(name) if releasing else COMMON_OPTIONS)

    gen = sub.add_parser("generate", help="generate sample tables on Spark").add_subparsers(
        dest="what", required=True, parser_class=_ArgParser)
    _leaf(gen, "blobs", "Gaussian blobs with a label column, generated in parallel", _cmd_generate_blobs,
          GENERATE_BLOBS_OPTIONS)
    for what, help_ in (("cdr", "call-detail records (caller_id, tower_id, ts) on a map of towers"),
                        ("transit", "smart-card taps (card_id, station_id, ts) on a map of lines")):
        _leaf(gen, what, help_ + ", generated in parallel", _cmd_generate_events, GENERATE_EVENTS_OPTIONS)

    ev = sub.add_parser("evaluate", help="owner-side utility evaluations (read the private source)").add_subparsers(
        dest="evaluation", required=True, parser_class=_ArgParser)
    _leaf(ev, "counting-queries", "relative error of random item-set counting queries on a release",
          _cmd_evaluate_counting, EVALUATE_COUNTING_OPTIONS)

    _leaf(sub, "synthesize", "a synthetic table from a released DPGM or synthetic model (post-processing: no budget)",
          _cmd_synthesize, SYNTHESIZE_OPTIONS)

    demo_help = ("generate a sample call-detail table and make a useful private table of it on local Spark "
                 "(the synthetic release and its table, beside DP per-tower counts and the DPGM); 'demo projection': "
                 "the JL projection demo")
    if wanted("demo"):
        from sparkpriv.demo import DEMO_OPTIONS, PROJECTION_DEMO_OPTIONS  # imports numpy

        demo = _leaf(sub, "demo", demo_help, _cmd_demo, DEMO_OPTIONS)
        dsub = demo.add_subparsers(dest="demo_what", required=False, parser_class=_ArgParser)
        _leaf(dsub, "projection", "Gaussian blobs released by a private JL projection on local Spark",
              _cmd_demo_projection, PROJECTION_DEMO_OPTIONS)
    else:
        sub.add_parser("demo", help=demo_help)

    bench = sub.add_parser("bench", help="benchmarks against baselines (prints a JSON last line)").add_subparsers(
        dest="bench", required=True, parser_class=_ArgParser)
    if wanted("bench"):
        from sparkpriv.bench import BENCHMARKS

        for name, (mod_name, help_) in BENCHMARKS.items():
            p = _leaf(bench, name, help_, _cmd_bench)
            if words is None or leaf == name:  # the benchmark's module (and its imports) only when it runs
                import importlib

                importlib.import_module(mod_name).add_arguments(p)
            p.set_defaults(_bench_module=mod_name)

    led_parser = sub.add_parser("ledger", help="privacy-budget ledger")
    rec_parser = sub.add_parser("receipt", help="privacy receipts: check one against the ledger")
    if not (wanted("ledger") or wanted("receipt")):  # the ledger's modules import dp_accounting (numpy, scipy)
        return parser
    try:
        from sparkpriv.ledger.cli import add_ledger_subparsers, add_receipt_subparsers
    except ImportError:  # pragma: no cover - ledger always ships
        add_ledger_subparsers = None
    if add_ledger_subparsers is not None:
        led = led_parser.add_subparsers(dest="ledger_command", required=True, parser_class=_ArgParser)
        add_ledger_subparsers(led)
        rec = rec_parser.add_subparsers(dest="receipt_command", required=True, parser_class=_ArgParser)
        add_receipt_subparsers(rec)
        for p in [*led.choices.values(), *rec.choices.values()]:
            if not any(a.dest == "config" for a in p._actions):
                p.add_argument("--config", help="TOML file with the same options (command line wins)")
            if not any(a.dest == "log_level" for a in p._actions):
                p.add_argument("--log-level", default=None)
            p.set_defaults(_leaf=p, _spark={}, _options=())
    return parser


def _apply_config(parser, argv, args):
    """Re-parse with the config file's values as defaults (command line wins)."""
    values = load_toml(args.config)
    leaf = args._leaf
    dests = {a.dest for a in leaf._actions if a.dest not in ("help", "config")}
    spark_conf = split_file_values(values, getattr(args, "mechanism", None), dests, f"config file {args.config!r}")
    opt_types = {o.name: o for o in args._options}
    defaults = {}
    for k, v in values.items():
        if k in opt_types:
            defaults[k] = v  # coerced later with the option's type
        elif isinstance(v, list):
            defaults[k] = ",".join(map(str, v))
        else:
            defaults[k] = v
    leaf.set_defaults(**defaults, _spark={str(k): str(v) for k, v in spark_conf.items()})
    return parser.parse_args(argv)


def _values(args) -> dict:
    return {o.name: getattr(args, o.name, None) for o in args._options}


class ProgressBar:
    """Progress on a terminal for a release's long steps (k-means iterations, DP-SGD, the
    event bounding pass, synthesis): one bar line per step, e.g.
    ``kmeans iteration [#########.....] 3/8 2.1 s``.

    Each step is a finished line, so that Spark's own console progress (on for the
    command line on a terminal: ``[Stage 3:===>  (5 + 2) / 8]``, redrawn in place while
    a stage runs) stays below it instead of overwriting it. Without a terminal the steps
    are log lines (``sparkpriv.<mechanism>`` at INFO, with the release's epsilon and delta).
    """

    def __init__(self, stream, width: int = 30):
        self.stream, self.width, self.drawn = stream, width, False

    def __call__(self, what: str, i: int, n: int, message: str = "") -> None:
        done = int(self.width * i / max(n, 1))
        self.stream.write(f"\r{what} [{'#' * done}{'.' * (self.width - done)}] {i}/{n} {message[:60]}\x1b[K\n")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        self.stream.flush()


def _terminal(spark_conf: dict) -> tuple[dict, ProgressBar | None]:
    """On a terminal: Spark's console progress on (unless the configuration says otherwise) and a
    :class:`ProgressBar` for sparkpriv's steps; else neither (one log line per step)."""
    if not sys.stderr.isatty():
        return spark_conf, None
    return {"spark.ui.showConsoleProgress": "true", **spark_conf}, ProgressBar(sys.stderr)


def _cmd_release(args) -> int:
    from sparkpriv.runner import options_for, run_release

    cfg = build_config(args.mechanism, options_for(args.mechanism), None, _values(args),
                       source="config file")
    spark_conf, bar = _terminal(dict(args._spark))
    cfg = type(cfg)(mechanism=cfg.mechanism, values=cfg.values, spark=spark_conf)
    try:
        res = run_release(cfg, on_step=bar)
    finally:
        if bar is not None:
            bar.close()
    print(f"private table: {res.output}")
    print(f"receipt:       {res.receipt_path}")
    print(f"guarantee:     epsilon={res.epsilon:.6g} delta={res.delta:.3g}")
    if res.ledger_entry:
        print(f"ledger entry:  {res.ledger_entry}")
    for note in res.notes:
        print(f"note:          {note}")
    return EXIT_OK


def _cmd_synthesize(args) -> int:
    from sparkpriv.io.synthesize import synthesize_dpgm

    cfg = build_config("synthesize", SYNTHESIZE_OPTIONS, None, _values(args))
    spark_conf, bar = _terminal(dict(args._spark))  # no terminal: one log line per step
    try:
        res = synthesize_dpgm(**cfg.values, spark_conf=spark_conf, on_step=bar)
    finally:
        if bar is not None:
            bar.close()
    what = {"items": "people, one row each", "events": "people, one row per (person, item)"}.get(res.layout, "rows")
    print(f"synthetic table: {res.output} ({res.rows} {what}: {', '.join(res.columns)})")
    print(f"provenance:      {res.receipt_path} (post-processing of {res.model_receipt}; no budget spent)")
    print(f"guarantee:       epsilon={res.epsilon:.6g} delta={res.delta:.3g} (the model release's)")
    return EXIT_OK


def _cmd_generate_blobs(args) -> int:
    from sparkpriv.spark.generate import generate_blobs
    from sparkpriv.spark.session import get_spark

    cfg = build_config("generate blobs", GENERATE_BLOBS_OPTIONS, None, _values(args))
    v = dict(cfg.values)
    spark = get_spark(args._spark)
    df = generate_blobs(spark, rows=v["rows"], cols=v["cols"], clusters=v["clusters"],
                        separation=v["separation"], cluster_std=v["cluster_std"], seed=v["seed"],
                        partitions=v["partitions"])
    df.write.mode("overwrite" if v["overwrite"] else "errorifexists").parquet(v["output"])
    print(f"sample table: {v['output']} ({v['rows']} rows x {v['cols']} features + id, label)")
    return EXIT_OK


def _cmd_generate_events(args) -> int:
    from sparkpriv.spark.generate_events import write_events
    from sparkpriv.spark.session import get_spark

    cfg = build_config(f"generate {args.what}", GENERATE_EVENTS_OPTIONS, None, _values(args))
    v = dict(cfg.values)
    out = write_events(get_spark(args._spark), args.what, **v)
    print(f"event table: {v['output']} ({out['vocabulary']})")
    if v["map_output"]:
        print(f"public map:  {v['map_output']} (use it as --vocabulary)")
    return EXIT_OK


def evaluate_tables(spark, *, source: str, release: str, person_col: str, item_col: str, vocabulary: str,
                    source_format: str | None = None, release_format: str | None = None,
                    release_columns=None, release_prefix: str | None = None, release_items_col: str = "items",
                    release_item_ids: bool = False, release_events: bool = False,
                    release_person_col: str | None = None, release_item_col: str | None = None,
                    threshold: float = 0.5, queries: int = 1000, groups: int = 5, max_length: int | None = None,
                    seed: int = 0, release_people: int | None = None) -> dict:
    """Read ``source`` and ``release`` (paths or table names) and evaluate (the CLI's entry point)."""
    from sparkpriv.io.inputs import read_table
    from sparkpriv.mechanisms.sparse import Vocabulary
    from sparkpriv.spark.counting_queries import evaluate_counting_queries

    if release_prefix and release_columns:
        raise ParameterError("Give either release_columns or release_prefix, not both.")
    if release_prefix:
        release_columns = [f"{release_prefix}{j}" for j in range(Vocabulary.parse(vocabulary).size)]
    return evaluate_counting_queries(
        spark, source=read_table(spark, source, source_format, format_option="--source-format"),
        release=read_table(spark, release, release_format, format_option="--release-format"),
        person=person_col, item=item_col, vocabulary=vocabulary, release_columns=release_columns,
        release_items_col=release_items_col, release_item_ids=release_item_ids, release_events=release_events,
        release_person=release_person_col, release_item=release_item_col, threshold=threshold, n_queries=queries,
        groups=groups, max_length=max_length, seed=seed, release_people=release_people)


def _cmd_evaluate_counting(args) -> int:
    from sparkpriv.spark.counting_queries import format_table
    from sparkpriv.spark.session import get_spark

    cfg = build_config("evaluate counting-queries", EVALUATE_COUNTING_OPTIONS, None, _values(args))
    result = evaluate_tables(get_spark(args._spark), **cfg.values)
    print(format_table(result))
    print(json.dumps(result))
    return EXIT_OK


def _cmd_demo(args) -> int:
    from sparkpriv.demo import DEMO_OPTIONS, run_demo

    cfg = build_config("demo", DEMO_OPTIONS, None, _values(args))
    spark_conf, _ = _terminal(dict(args._spark))  # Spark's console progress on a terminal
    run_demo(**cfg.values, spark_conf=spark_conf)
    return EXIT_OK


def _cmd_demo_projection(args) -> int:
    from sparkpriv.demo import PROJECTION_DEMO_OPTIONS, run_projection_demo

    cfg = build_config("demo projection", PROJECTION_DEMO_OPTIONS, None, _values(args))
    spark_conf, _ = _terminal(dict(args._spark))
    run_projection_demo(**cfg.values, spark_conf=spark_conf)
    return EXIT_OK


def _cmd_bench(args) -> int:
    import importlib

    mod = importlib.import_module(args._bench_module)
    mod.run_from_args(args)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, (args.log_level or "INFO").upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Spark's own console log (executor stack traces before sparkpriv's one-line error)
    # stays off unless --log-level DEBUG or SPARKPRIV_SPARK_LOG_LEVEL says otherwise
    debug = (args.log_level or "").upper() == "DEBUG"
    if not debug:
        logging.getLogger("py4j").setLevel(logging.WARNING)  # its connection chatter
    own_level = "SPARKPRIV_SPARK_LOG_LEVEL" not in os.environ
    if own_level:
        os.environ["SPARKPRIV_SPARK_LOG_LEVEL"] = "WARN" if debug else "OFF"
    try:
        return _run(parser, argv, args)
    finally:
        if own_level:
            os.environ.pop("SPARKPRIV_SPARK_LOG_LEVEL", None)


_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def worker_import_error(exc: BaseException) -> str | None:
    """A one-line message when Spark's Python workers could not import a module, else None."""
    m = _MISSING_MODULE.search(str(exc))
    if m is None or type(exc).__name__ == "ModuleNotFoundError":  # the driver's own: a normal failure
        return None
    py = os.environ.get("PYSPARK_PYTHON") or "the interpreter Spark chose"
    return (f"Spark's Python workers cannot import {m.group(1)!r}: they run {py}, which lacks sparkpriv's "
            "dependencies. Install them there (pip install sparkpriv), or set PYSPARK_PYTHON (or "
            "spark.pyspark.python) to an interpreter that has them, e.g. the one running sparkpriv.")


def _run(parser, argv, args) -> int:
    try:
        from sparkpriv.privacy.random import refuse_fixed_seed  # numpy: not for --help

        refuse_fixed_seed("sparkpriv")
        if getattr(args, "config", None):
            args = _apply_config(parser, argv, args)
        handler = args._handler
        return int(handler(args) or 0)
    except SparkPrivError as exc:
        print(f"sparkpriv: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_FAILURE
    except BrokenPipeError:  # the reader of our output went away (`sparkpriv ledger show | head`)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes stdout at exit
        return EXIT_FAILURE
    except Exception as exc:  # unexpected: log the trace, exit 1
        missing = worker_import_error(exc)
        if missing is not None:
            _log.debug("worker import failure", exc_info=True)
            print(f"sparkpriv: error: {missing}", file=sys.stderr)
            return EXIT_FAILURE
        _log.exception("failed: %s", type(exc).__name__)
        print(f"sparkpriv: failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
              file=sys.stderr)
        return EXIT_FAILURE



def main_job(argv: Sequence[str]) -> int:
    """``jobs/release.py``: the mechanism comes from the config file."""
    p = _ArgParser(prog="jobs/release.py", description="Run the release a config file describes.")
    p.add_argument("--config", required=True, help="TOML file naming the mechanism and its options")
    known, rest = p.parse_known_args(argv)
    try:
        from sparkpriv.privacy.random import refuse_fixed_seed

        refuse_fixed_seed("jobs/release.py")
        mech = load_toml(known.config).get("mechanism")
    except ParameterError as exc:
        print(f"sparkpriv: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not isinstance(mech, str):
        print(f"sparkpriv: error: the config file {known.config!r} must name the mechanism, e.g. "
              'mechanism = "projection".', file=sys.stderr)
        return EXIT_BAD_INPUT
    return main(["release", mech, "--config", known.config, *rest])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
