"""``sparkpriv synthesize``: a synthetic table from a released DPGM model (docs/research/dpgm.md).

:func:`synthesize_dpgm` reads a DPGM release (the directory the ``dpgm``
mechanism published: its ``_dpgm_model.npz`` and ``_privacy_receipt.json``),
checks the model against its receipt, generates ``rows`` synthetic records in
parallel on Spark (:mod:`sparkpriv.spark.synthesize`: each partition its slice,
from keyed streams of a fresh secret seed that is never written anywhere) and
publishes them atomically like a release (:func:`sparkpriv.io.writer.publish`).

Layouts: a model released on a table gives one column per declared column (in the
source's types). A model released on event records (``sparkpriv release dpgm
--events``; its file holds the public vocabulary and the event table's column
names and item type) gives by default one row per synthetic person, ``person``
(bigint, ``0 .. rows-1``) and ``items`` (the item ids, sorted); ``explode`` one row
per (person, item) under the source's person and item column names; ``wide`` the
0/1 table of one column per vocabulary item.

Post-processing: the generation reads no data, only the released model, so it
spends no budget and makes no ledger entry. The output's receipt
(``_privacy_receipt.json``, also in ``_common_metadata`` and the part files'
footers) is a provenance record: it says the table is post-processing of the
model release, points to that release's receipt (path and SHA-256) and repeats
its guarantee, which is the table's guarantee too.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import logging
import math
import platform
from dataclasses import dataclass

import numpy as np

from sparkpriv.errors import InputError, ParameterError

__all__ = ["synthesize_dpgm", "SynthesisResult", "SYNTHESIS_FORMAT"]

_log = logging.getLogger("sparkpriv.synthesize")

SYNTHESIS_FORMAT = "sparkpriv.synthesis/1"
_CALLER = "synthesize_dpgm"
PERSON_COLUMN, ITEMS_COLUMN = "person", "items"  # event_columns.PERSON, ITEMS


@dataclass(frozen=True)
class SynthesisResult:
    """What :func:`synthesize_dpgm` published."""

    output: str
    receipt_path: str
    rows: int
    columns: tuple
    partitions: int
    model_receipt: str
    epsilon: float
    delta: float
    types: tuple = ()  # the type of each column (the source's; all double for a model of format 1)
    layout: str = "wide"  # "wide" (one column per model column), "items" (person, items) or "events"


def _check_rows(rows) -> int:
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1:
        raise ParameterError(f"The 'rows' parameter of {_CALLER} must be an integer >= 1 (--rows). "
                             f"Got {rows!r} instead.")
    return int(rows)


def _check_partitions(partitions, rows: int):
    if partitions is None:
        return None
    if isinstance(partitions, bool) or not isinstance(partitions, (int, np.integer)) or partitions < 1:
        raise ParameterError(f"The 'partitions' parameter of {_CALLER} must be an integer >= 1 "
                             f"(--partitions). Got {partitions!r} instead.")
    return int(min(int(partitions), rows))


def _read_release(spark, model: str):
    """(release directory, model bytes, receipt bytes) of a DPGM release directory (or its
    ``_dpgm_model.npz``, the receipt beside it)."""
    from sparkpriv.io.writer import RECEIPT_FILE, _store_for_check
    from sparkpriv.mechanisms.dpgm import MODEL_FILE

    path = str(model).rstrip("/")
    directory = path[: -len(MODEL_FILE) - 1] if path.endswith("/" + MODEL_FILE) else path
    fs = _store_for_check(spark, directory)
    directory = fs.qualify(directory)
    model_path, receipt_path = f"{directory}/{MODEL_FILE}", f"{directory}/{RECEIPT_FILE}"
    for what, p in (("model file", model_path), ("receipt", receipt_path)):
        if not fs.exists(p):
            raise InputError(f"The model {model!r} is not a DPGM release: its {what} {p} is missing. Give the "
                             "output directory of a `sparkpriv release dpgm` run (--model).")
    return directory, fs.read_bytes(model_path), _whole_receipt(fs, directory)


def _whole_receipt(fs, directory: str) -> bytes:
    """The receipt's bytes with the lists of its side file (when published) put back."""
    from sparkpriv.io.writer import RECEIPT_FILE
    from sparkpriv.receipt_form import DETAILS_FILE, with_details

    details = f"{directory}/{DETAILS_FILE}"
    return with_details(fs.read_bytes(f"{directory}/{RECEIPT_FILE}"),
                        fs.read_bytes(details) if fs.exists(details) else None)


def _check_model(model, receipt: dict, where: str):
    """The model is the one its receipt describes: a DPGM release, the cluster sizes it
    recorded, finite parameters. Returns the column names."""
    if receipt.get("mechanism") != "dpgm":
        raise InputError(f"{where} is a {receipt.get('mechanism')!r} release, not a DPGM one (--model).")
    sizes = np.asarray(model.sizes, float)
    if sizes.shape != (model.k,) or not np.all(np.isfinite(sizes)) or np.any(sizes < 0):
        raise InputError(f"The model of {where} has invalid cluster sizes (k={model.k}): not a released model.")
    recorded = (receipt.get("mechanism_details", {}).get("model") or {}).get("cluster_sizes")
    if recorded is not None and not np.allclose(np.asarray(recorded, float), sizes, rtol=1e-12, atol=0.0):
        raise InputError(f"The model file of {where} does not match its receipt (cluster sizes differ): "
                         "the directory was altered.")
    recorded_model = receipt.get("mechanism_details", {}).get("model") or {}
    if "events" in recorded_model and recorded_model["events"] != (
            None if model.events is None else model.events.to_public_dict()):
        raise InputError(f"The model file of {where} does not match its receipt (event columns or vocabulary "
                         "differ): the directory was altered.")
    recorded_types = (receipt.get("mechanism_details", {}).get("model") or {}).get("column_types")
    if recorded_types is not None and tuple(recorded_types) != tuple(model.types):
        raise InputError(f"The model file of {where} does not match its receipt (column types differ): "
                         "the directory was altered.")
    dim = model.generator().dim
    if np.shape(model.thetas) != (model.k, dim) or not np.all(np.isfinite(model.thetas)):
        raise InputError(f"The model of {where} has parameters of shape {np.shape(model.thetas)} (expected "
                         f"({model.k}, {dim}), finite): not a released model.")
    columns = model.params.columns or receipt.get("input", {}).get("columns") or \
        [f"x{j}" for j in range(model.d)]
    columns = tuple(str(c) for c in columns)
    if len(columns) != model.d or len(set(columns)) != len(columns):
        raise InputError(f"The model of {where} names {len(columns)} column(s) for {model.d} model columns.")
    return columns


def _check_flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ParameterError(f"The '{name}' parameter of {_CALLER} must be True or False (--{name}). "
                             f"Got {value!r} instead.")
    return value


def _layout(mdl, explode: bool, wide: bool, where: str) -> str:
    """The output layout of ``mdl`` for the flags (checked against the model)."""
    if mdl.events is None:
        if explode:
            raise ParameterError(
                f"The 'explode' parameter of {_CALLER} (--explode) applies to a model released on event "
                f"records (sparkpriv release dpgm --events); the model of {where} was released on a table, "
                "whose synthetic table has one column per declared column. Remove --explode.")
        return "wide"
    return "wide" if wide else "events" if explode else "items"


def synthesize_dpgm(model: str, *, rows: int, output: str, overwrite: bool = False,
                    partitions: int | None = None, writer: str = "auto", explode: bool = False,
                    wide: bool = False, spark=None, spark_conf=None, on_step=None,
                    seed: int | None = None) -> SynthesisResult:
    """Write ``rows`` synthetic records of the DPGM release ``model`` to ``output``.

    Parameters
    ----------
    model : str
        The output directory of a DPGM release (path or URI; or its ``_dpgm_model.npz``).
    rows : int >= 1
        Synthetic records to generate.
    output : str
        Where to publish the synthetic table (Parquet; atomically, like a release).
    overwrite : bool
        Replace an existing ``output``.
    partitions : int, optional
        Public number of Spark partitions (output files); default from ``rows``.
    writer : {"auto", "spark", "arrow"}
        Who writes the part files (:func:`sparkpriv.io.writer.publish`).
    explode : bool
        A model released on event records: one row per (synthetic person, item), under the
        source's person and item column names, instead of one row per person (``person``,
        ``items``). Refused for a model released on a table.
    wide : bool
        A model released on event records: the 0/1 table of one column per vocabulary item
        (``x0, x1, ...``) instead of the events. A table model's output is always wide.
    seed : int >= 0, optional
        A PUBLIC seed that makes the synthetic table reproducible (the same model, rows,
        partitions and seed give the same table); recorded in the receipt. The model is
        public, so a known seed reveals nothing more. Default: fresh OS entropy, never written.
    spark : SparkSession, optional
        Default: :func:`sparkpriv.spark.session.get_spark` with ``spark_conf``, started after
        the parameters are checked.
    on_step : callable, optional
        ``(what, i, n, message)``: progress of the generation (completed / total Spark tasks);
        every step is also logged (``sparkpriv.synthesize`` at INFO).

    Privacy
    -------
    Post-processing of the released model: no data is read, no budget is spent and
    no ledger entry is made; the table has the model release's guarantee, which its
    receipt repeats and points to. The generation seed is fresh OS entropy per run
    and is never written.
    """
    from sparkpriv.io.writer import RECEIPT_FILE, check_output_path, publish
    from sparkpriv.mechanisms.dpgm import MODEL_FILE, DPGMModel

    if _is_synthetic_release(model, spark, spark_conf):
        return synthesize_items(model, rows=rows, output=output, overwrite=overwrite, partitions=partitions,
                                writer=writer, explode=explode, wide=wide, spark=spark, spark_conf=spark_conf,
                                on_step=on_step, seed=seed)
    from sparkpriv.mechanisms.event_columns import ITEMS, PERSON, THRESHOLD
    from sparkpriv.mechanisms.protocol import Progress
    from sparkpriv.privacy.random import active_fixed_seed, new_secret_seed
    from sparkpriv.spark.progress import TaskProgress
    from sparkpriv.spark.synthesize import batch_rows_for, default_partitions, synthetic_events, synthetic_rows

    rows = _check_rows(rows)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise ParameterError(f"The 'seed' parameter of {_CALLER} must be an integer in [0, 2^63) (--seed). "
                             f"Got {seed!r} instead.")
    partitions = _check_partitions(partitions, rows)
    if writer not in ("auto", "spark", "arrow"):
        raise ParameterError(f"The 'writer' parameter of {_CALLER} must be auto, spark or arrow (--writer). "
                             f"Got {writer!r} instead.")
    explode, wide = _check_flag("explode", explode), _check_flag("wide", wide)
    if explode and wide:
        raise ParameterError(f"The 'explode' and 'wide' parameters of {_CALLER} (--explode, --wide) exclude "
                             "each other: --explode writes one row per (person, item), --wide one 0/1 column "
                             "per item. Give one of them.")
    if spark is None:
        from sparkpriv.spark.session import get_spark

        spark = get_spark(spark_conf, size_local_driver=True)
    directory, model_bytes, receipt_bytes = _read_release(spark, model)
    try:
        mdl = DPGMModel.load(io.BytesIO(model_bytes))
        receipt = json.loads(receipt_bytes.decode())
    except ParameterError:
        raise
    except Exception as exc:
        raise InputError(f"The DPGM release {directory} cannot be read ({type(exc).__name__}): its model file "
                         "or receipt is damaged (--model).") from None
    columns = _check_model(mdl, receipt, directory)
    layout = _layout(mdl, explode, wide, directory)
    target = check_output_path(spark, output, overwrite)  # refused before anything is generated
    if partitions is None:
        partitions = default_partitions(rows, spark.sparkContext.defaultParallelism
                                        if hasattr(spark, "_jsc") else 2)
    if seed is None:
        seed, seed_note = new_secret_seed("dpgm-synthesis"), "fresh OS entropy for this run; not recorded"
    else:
        from sparkpriv.privacy.random import derive_seed

        seed_note = int(seed)
        seed = derive_seed(int(seed).to_bytes(16, "little"), "dpgm-synthesis-public")
    batch_rows = batch_rows_for(mdl)
    if layout == "wide":
        batch_map = synthetic_rows(spark, mdl, rows, seed, columns, partitions=partitions, batch_rows=batch_rows)
        out_columns, out_types = columns, tuple(mdl.types)
        values = "in the declared box [0, 1]"
    else:
        ev = mdl.events
        batch_map = synthetic_events(spark, mdl, rows, seed, partitions=partitions, explode=layout == "events",
                                     batch_rows=batch_rows)
        t = ev.synthetic_item_type
        out_columns, out_types = ((ev.person, ev.item), ("bigint", t)) if layout == "events" else \
            ((PERSON, ITEMS), ("bigint", f"array<{t}>"))
        values = (f"synthetic person ids 0..{rows - 1} (not the source's keys); a person holds the items "
                  f"whose model value is >= {THRESHOLD}, as item ids of the declared vocabulary, sorted" +
                  ("; one row per (person, item), a person without items has no row" if layout == "events"
                   else ""))
    guarantee = dict(receipt.get("guarantee") or {})
    test_seed = active_fixed_seed() is not None
    if test_seed:
        guarantee.update(holds=False, statement="made with a fixed test seed: the synthetic rows are "
                         "reproducible, the model release's own receipt says what it guarantees")
    provenance = {
        "format": SYNTHESIS_FORMAT,
        "mechanism": "dpgm-synthesis",
        "post_processing": True,
        "statement": "synthetic records sampled from a released DPGM model: post-processing of that release, "
                     "no data read, no budget spent, no ledger entry; the guarantee is the model release's",
        "post_processing_of": {
            "release": directory,
            "receipt": f"{directory}/{RECEIPT_FILE}",
            "receipt_sha256": hashlib.sha256(receipt_bytes).hexdigest(),
            "model_file": f"{directory}/{MODEL_FILE}",
            "model_sha256": hashlib.sha256(model_bytes).hexdigest(),
            "mechanism": receipt.get("mechanism"),
            "created_at": receipt.get("created_at"),
            "ledger": receipt.get("ledger"),
        },
        "guarantee": guarantee,
        "spent": {"epsilon": 0.0, "delta": 0.0},
        "library": {"name": "sparkpriv", "version": _version(), "python": platform.python_version()},
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "synthesis": {"rows": rows, "columns": list(out_columns), "partitions": partitions,
                      "cluster_sizes": [float(v) for v in mdl.sizes], "values": values, "layout": layout,
                      "seed": seed_note},
        "insecure_test_seed": test_seed,
    }
    if mdl.events is not None:
        provenance["synthesis"]["events"] = mdl.events.to_public_dict()
    _log.info("synthesize: %d %s of the DPGM model of %s (k=%d, %s), %d partition(s), layout %s; "
              "post-processing, no budget spent", rows, "rows" if mdl.events is None else "people", directory,
              mdl.k, mdl.params.model, partitions, layout)
    df = batch_map.to_df()
    provenance["output"] = {"path": target, "schema": [{"name": c, "type": t} for c, t in zip(out_columns, out_types)]}
    progress = Progress(_CALLER, _log, on_step, spent="post-processing: no budget spent")
    with TaskProgress(spark, "synthesis", progress.step):
        out = publish(df, output, receipt=provenance, overwrite=overwrite, rows=batch_map, writer=writer)
    del seed
    return SynthesisResult(output=out, receipt_path=f"{out}/{RECEIPT_FILE}", rows=rows, columns=tuple(out_columns),
                           partitions=partitions, model_receipt=f"{directory}/{RECEIPT_FILE}",
                           epsilon=float(guarantee.get("epsilon", math.nan)),
                           delta=float(guarantee.get("delta", math.nan)), types=tuple(out_types), layout=layout)


def _is_synthetic_release(model: str, spark, spark_conf) -> bool:
    """Whether ``model`` names a ``synthetic`` release (its model file), not a DPGM one. Local paths
    are looked at directly; others when Spark is given (else the DPGM path says what is missing)."""
    import os

    from sparkpriv.mechanisms.synthetic import MODEL_FILE as SYN_FILE

    path = str(model).rstrip("/")
    if path.endswith("/" + SYN_FILE):
        return True
    local = path[len("file:"):] if path.startswith("file:") else path
    if ":" not in local:
        return os.path.exists(os.path.join(local, SYN_FILE))
    if spark is None:
        return False
    from sparkpriv.io.writer import _store_for_check

    fs = _store_for_check(spark, path)
    return fs.exists(f"{fs.qualify(path)}/{SYN_FILE}")


def synthesize_items(model: str, *, rows: int, output: str, overwrite: bool = False, partitions: int | None = None,
                     writer: str = "auto", explode: bool = False, wide: bool = False, spark=None, spark_conf=None,
                     on_step=None, seed: int | None = None) -> SynthesisResult:
    """Write ``rows`` synthetic people of a ``synthetic`` release (``sparkpriv release synthetic``) to
    ``output``: ``person``, ``items`` (the item ids, sorted), or with ``explode`` one row per (person,
    item) under the source's column names. Post-processing of the released model (no data read, no
    budget spent, no ledger entry); ``seed`` as in :func:`synthesize_dpgm`."""
    from sparkpriv.io.writer import RECEIPT_FILE, _store_for_check, check_output_path, publish
    from sparkpriv.mechanisms.protocol import Progress
    from sparkpriv.mechanisms.synthetic import MODEL_FILE as SYN_FILE, SyntheticModel
    from sparkpriv.privacy.random import active_fixed_seed, derive_seed, new_secret_seed
    from sparkpriv.spark.progress import TaskProgress
    from sparkpriv.spark.synthesize import default_partitions, sparse_synthetic_events

    rows = _check_rows(rows)
    partitions = _check_partitions(partitions, rows)
    explode, wide = _check_flag("explode", explode), _check_flag("wide", wide)
    if wide:
        raise ParameterError(f"The 'wide' parameter of {_CALLER} (--wide) does not apply to a synthetic release: "
                             "its tables are sparse (person, items). Remove --wide.")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise ParameterError(f"The 'seed' parameter of {_CALLER} must be an integer in [0, 2^63) (--seed). "
                             f"Got {seed!r} instead.")
    if spark is None:
        from sparkpriv.spark.session import get_spark

        spark = get_spark(spark_conf)
    path = str(model).rstrip("/")
    directory = path[: -len(SYN_FILE) - 1] if path.endswith("/" + SYN_FILE) else path
    fs = _store_for_check(spark, directory)
    directory = fs.qualify(directory)
    model_bytes = fs.read_bytes(f"{directory}/{SYN_FILE}")
    receipt_bytes = _whole_receipt(fs, directory)
    try:
        mdl = SyntheticModel.load(io.BytesIO(model_bytes))
        receipt = json.loads(receipt_bytes.decode())
    except ParameterError:
        raise
    except Exception as exc:
        raise InputError(f"The synthetic release {directory} cannot be read ({type(exc).__name__}): its model "
                         "file or receipt is damaged (--model).") from None
    if receipt.get("mechanism") != "synthetic" or mdl.events is None:
        raise InputError(f"{directory} is not a synthetic release of an event table (--model).")
    recorded = (receipt.get("mechanism_details", {}).get("model") or {}).get("n_people")
    if recorded is not None and int(recorded) != mdl.n:
        raise InputError(f"The model file of {directory} does not match its receipt: the directory was altered.")
    target = check_output_path(spark, output, overwrite)
    if partitions is None:
        partitions = default_partitions(rows, spark.sparkContext.defaultParallelism if hasattr(spark, "_jsc") else 2)
    if seed is None:
        key, seed_note = new_secret_seed("synthetic-synthesis"), "fresh OS entropy for this run; not recorded"
    else:
        key, seed_note = derive_seed(int(seed).to_bytes(16, "little"), "synthetic-synthesis-public"), int(seed)
    batch_map = sparse_synthetic_events(spark, mdl, rows, key, partitions=partitions, explode=explode)
    ev = mdl.events
    t = ev.synthetic_item_type
    out_columns, out_types = ((ev.person, ev.item), ("bigint", t)) if explode else \
        ((PERSON_COLUMN, ITEMS_COLUMN), ("bigint", f"array<{t}>"))
    guarantee = dict(receipt.get("guarantee") or {})
    test_seed = active_fixed_seed() is not None
    if test_seed:
        guarantee.update(holds=False, statement="made with a fixed test seed: the model release's own receipt "
                         "says what it guarantees")
    provenance = {
        "format": SYNTHESIS_FORMAT, "mechanism": "synthetic-synthesis", "post_processing": True,
        "statement": "synthetic people sampled from a released synthetic model: post-processing of that release, "
                     "no data read, no budget spent, no ledger entry; the guarantee is the model release's",
        "post_processing_of": {"release": directory, "receipt": f"{directory}/{RECEIPT_FILE}",
                               "receipt_sha256": hashlib.sha256(receipt_bytes).hexdigest(),
                               "model_file": f"{directory}/{SYN_FILE}",
                               "model_sha256": hashlib.sha256(model_bytes).hexdigest(),
                               "mechanism": "synthetic", "created_at": receipt.get("created_at"),
                               "ledger": receipt.get("ledger")},
        "guarantee": guarantee, "spent": {"epsilon": 0.0, "delta": 0.0},
        "library": {"name": "sparkpriv", "version": _version(), "python": platform.python_version()},
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "synthesis": {"rows": rows, "columns": list(out_columns), "partitions": partitions,
                      "layout": "events" if explode else "items", "seed": seed_note,
                      "values": f"synthetic person ids 0..{rows - 1} (not the source's keys); each person's items "
                                "are item ids of the declared vocabulary, sorted",
                      "events": ev.to_public_dict()},
        "insecure_test_seed": test_seed,
        "output": {"path": target, "schema": [{"name": c, "type": t} for c, t in zip(out_columns, out_types)]},
    }
    _log.info("synthesize: %d people of the synthetic model of %s, %d partition(s); post-processing, no budget "
              "spent", rows, directory, partitions)
    progress = Progress(_CALLER, _log, on_step, spent="post-processing: no budget spent")
    with TaskProgress(spark, "synthesis", progress.step):
        out = publish(batch_map.to_df(), output, receipt=provenance, overwrite=overwrite, rows=batch_map,
                      writer=writer)
    del key
    return SynthesisResult(output=out, receipt_path=f"{out}/{RECEIPT_FILE}", rows=rows, columns=tuple(out_columns),
                           partitions=partitions, model_receipt=f"{directory}/{RECEIPT_FILE}",
                           epsilon=float(guarantee.get("epsilon", math.nan)),
                           delta=float(guarantee.get("delta", math.nan)), types=tuple(out_types),
                           layout="events" if explode else "items")


def _version() -> str:
    from sparkpriv._version import __version__

    return __version__
