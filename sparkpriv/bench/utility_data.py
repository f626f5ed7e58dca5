"""The person x item tables of ``sparkpriv bench utility`` (docs/utility.md; the full results in docs/research/utility-results.md).

Every table is held in memory as a scipy CSR 0/1 matrix ``(people, items)`` of
float64, one row per person, the distinct items they touched (indices sorted,
no duplicates), uncapped: each method applies its own per-person cap.

Real tables (read in place from ``../shared/datasets`` beside the project root,
never copied; the formats are in that folder's README):

* ``bms_webview_1``: web sessions x product pages (one line per session,
  comma-separated page ids);
* ``bms_webview_2``: web sessions x pages (gzip; ids separated by `` -1 ``, CRLF);
* ``groceries``: baskets x products (one basket per line, names split on commas only);
* ``lastfm_hetrec2011``: users x artists (gzip; ``userID<TAB>artistID<TAB>weight``,
  header line; weights ignored).

Generated tables (``sparkpriv generate cdr|transit --people N --seed 0``'s people,
:func:`sparkpriv.spark.generate_events.person_matrix`): ``cdr`` (1,303 towers)
and ``transit`` (342 stations).

Items are numbered in the order of their first appearance in the file (an
item's label is kept in ``Table.items``); people in file order (last.fm: by
user id).
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import sparse

__all__ = ["REAL_TABLES", "GENERATED_TABLES", "README_FACTS", "Table", "datasets_dir", "load_table",
           "cap_rows", "sample_people"]

# the README's stated (people, items, person-item pairs) of each real table
README_FACTS = {
    "bms_webview_1": (59602, 497, 149639),
    "bms_webview_2": (77512, 3340, 358278),
    "groceries": (9835, 169, 43367),
    "lastfm_hetrec2011": (1892, 17632, 92834),
}
REAL_TABLES = tuple(README_FACTS)
GENERATED_TABLES = ("cdr", "transit")
_FILES = {
    "bms_webview_1": "bms_webview_1/BMS1_itemset_mining.txt",
    "bms_webview_2": "bms_webview_2/BMS2.txt.gz",
    "groceries": "groceries/groceries.csv",
    "lastfm_hetrec2011": "lastfm_hetrec2011/user_artists.dat.gz",
}
DATASETS_ENV = "SPARKPRIV_DATASETS"


@dataclass(frozen=True)
class Table:
    """A person x item table: ``X`` (people, items) CSR float64 0/1, uncapped."""

    name: str
    X: sparse.csr_matrix
    kind: str  # "real" or "generated"
    source: str
    items: np.ndarray  # (d,) the item labels (file ids or names; generated: 0..d-1)

    @property
    def n(self) -> int:
        return int(self.X.shape[0])

    @property
    def d(self) -> int:
        return int(self.X.shape[1])

    def describe(self) -> dict:
        lengths = np.diff(self.X.indptr)
        return {"table": self.name, "kind": self.kind, "source": self.source, "people": self.n, "items": self.d,
                "pairs": int(self.X.nnz), "mean_items": round(float(lengths.mean()), 3),
                "max_items": int(lengths.max()), "p90_items": float(np.percentile(lengths, 90))}


def datasets_dir(path: str | os.PathLike | None = None) -> Path:
    """The real datasets' folder: ``path``, else ``$SPARKPRIV_DATASETS``, else ``../shared/datasets``
    beside the project root (the folder that holds ``sparkpriv/``)."""
    if path is not None:
        return Path(path)
    if os.environ.get(DATASETS_ENV):
        return Path(os.environ[DATASETS_ENV])
    return Path(__file__).resolve().parents[2].parent / "shared" / "datasets"


def _from_lists(rows: list, *, name: str, source: str) -> Table:
    """A table from one list of item labels per person (duplicates within a person counted once)."""
    vocab: dict = {}
    indptr = np.zeros(len(rows) + 1, np.int64)
    cols: list = []
    for i, r in enumerate(rows):
        ids = {vocab.setdefault(t, len(vocab)) for t in r}
        cols.extend(ids)
        indptr[i + 1] = indptr[i] + len(ids)
    X = sparse.csr_matrix((np.ones(len(cols)), np.asarray(cols, np.int64), indptr), shape=(len(rows), len(vocab)))
    X.sort_indices()
    return Table(name, X, "real", source, np.asarray(list(vocab), dtype=object))


def _lines(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        for line in f:
            line = line.rstrip("\r\n")
            if line:
                yield line


def _load_real(name: str, root: Path) -> Table:
    path = root / _FILES[name]
    if not path.exists():
        raise FileNotFoundError(f"table {name!r}: {path} is absent (the real datasets' folder is {root}; "
                                f"set --datasets or ${DATASETS_ENV} to the folder ../shared/datasets)")
    source = f"../shared/datasets/{_FILES[name]}"
    if name == "bms_webview_1":
        rows = [line.split(",") for line in _lines(path)]
    elif name == "bms_webview_2":
        rows = [[t for t in (s.strip() for s in line.split(" -1 ")) if t] for line in _lines(path)]
    elif name == "groceries":
        rows = [line.split(",") for line in _lines(path)]
    else:  # lastfm_hetrec2011: userID artistID weight, header line
        users: dict = {}
        it = _lines(path)
        next(it)
        for line in it:
            user, artist, _ = line.split("\t")
            users.setdefault(int(user), []).append(artist)
        rows = [users[u] for u in sorted(users)]
    return _from_lists(rows, name=name, source=source)


def _load_generated(name: str, people: int, seed: int) -> Table:
    from sparkpriv.spark.generate_events import CDR_MODEL, TRANSIT_MODEL, person_matrix

    model = {"cdr": CDR_MODEL, "transit": TRANSIT_MODEL}[name]
    X = person_matrix(model, people, seed).astype(np.float64)
    return Table(name, sparse.csr_matrix(X), "generated",
                 f"sparkpriv generate {name} --people {people} --seed {seed} (distinct items per person)",
                 np.arange(model.items))


def load_table(name: str, *, root: str | os.PathLike | None = None, people: int | None = None,
               seed: int = 0) -> Table:
    """The table ``name`` (one of :data:`REAL_TABLES` or :data:`GENERATED_TABLES`).

    ``people``: a generated table's size (required for those); for a real
    table, a uniformly random subset of this many people (``seed``), or the
    whole table when None.
    """
    if name in GENERATED_TABLES:
        if people is None:
            raise ValueError(f"table {name!r} is generated: give its number of people")
        return _load_generated(name, int(people), seed)
    if name not in README_FACTS:
        raise ValueError(f"unknown table {name!r}: choose from {', '.join(REAL_TABLES + GENERATED_TABLES)}")
    t = _load_real(name, datasets_dir(root))
    if people is not None and people < t.n:
        keep = np.sort(np.random.default_rng(seed).choice(t.n, int(people), replace=False))
        X = t.X[keep]
        used = np.flatnonzero(np.diff(X.tocsc().indptr))  # drop the items no kept person has
        t = Table(name, sparse.csr_matrix(X[:, used]), t.kind, f"{t.source} ({people} people drawn with seed {seed})",
                  t.items[used])
    return t


def cap_rows(X: sparse.csr_matrix, L: int, rng: np.random.Generator) -> sparse.csr_matrix:
    """At most ``L`` items per person: a uniformly random subset of each longer row (CSR float64)."""
    X = sparse.csr_matrix(X)
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    order = np.lexsort((rng.random(rows.size), rows))
    start = X.indptr[:-1]
    rank = np.empty(rows.size, np.int64)
    rank[order] = np.arange(rows.size) - start[rows[order]]
    keep = rank < L
    Y = sparse.csr_matrix((np.ones(int(keep.sum()), np.float64), (rows[keep], X.indices[keep])), shape=X.shape)
    Y.sort_indices()
    return Y


def sample_people(X: sparse.csr_matrix, fraction: float, rng: np.random.Generator) -> sparse.csr_matrix:
    """A uniformly random ``round(fraction n)`` of the rows (without replacement, at least 1)."""
    n = X.shape[0]
    m = max(1, int(round(fraction * n)))
    return sparse.csr_matrix(X[np.sort(rng.choice(n, m, replace=False))])
