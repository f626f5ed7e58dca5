"""MST and AIM (private-pgm through smartnoise-synth) for ``sparkpriv bench utility``, in their own venv.

They are peers, never sparkpriv dependencies: ``sparkpriv bench utility --setup-peers`` (or
by hand: ``python -m venv .bench-venvs/pgm && .bench-venvs/pgm/bin/pip install
smartnoise-synth==1.0.8``) installs them beside the project in a git-ignored folder; the
suite runs them there through a subprocess (:data:`DRIVER`), exchanging ``.npz`` files.

They cannot run on a whole catalogue (MST's and AIM's graphical models over 500-17,000
binary columns do not finish), so they run on a COLUMN SAMPLE: the ``columns`` most popular
items by the workload's DP item counts (public), each person keeping those of their items.
Queries are answered from the synthetic people's items in the sample only (an item outside
it is never held); the results table says so. Their neighbour relation is add/remove one
person (sensitivity 1 per marginal); ours replace-one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy import sparse

__all__ = ["VENV", "peer_python", "setup_peers", "pgm_peer", "DRIVER"]

VENV = Path(__file__).resolve().parents[2] / ".bench-venvs" / "pgm"
PEER_PACKAGE = "smartnoise-synth==1.0.8"

DRIVER = r'''
import sys, time, numpy as np, pandas as pd
from snsynth import Synthesizer
args = np.load(sys.argv[1], allow_pickle=False)
X = args["X"].astype(np.int64)
name, eps, delta, seed, n_out = str(args["name"]), float(args["eps"]), float(args["delta"]), int(args["seed"]), int(args["n_out"])
np.random.seed(seed)
cols = [f"t{j}" for j in range(X.shape[1])]
df = pd.DataFrame(X, columns=cols)
kw = {"epsilon": eps, "delta": delta}
if name == "aim":
    kw["rounds"] = int(args["rounds"])
t = time.time()
syn = Synthesizer.create(name, **kw)
syn.fit(df, categorical_columns=cols, preprocessor_eps=0.0)
out = syn.sample(n_out)
np.savez(sys.argv[2], S=np.asarray(out[cols], dtype=np.int8), seconds=time.time() - t)
'''


def peer_python() -> Path | None:
    """The peers' interpreter, or None when the venv is not set up."""
    py = VENV / "bin" / "python"
    return py if py.exists() else None


def setup_peers() -> Path:
    """Create the peers' venv (git-ignored) and install smartnoise-synth there."""
    if peer_python() is None:
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", PEER_PACKAGE], check=True)
    return VENV


def pgm_peer(name: str, columns: int, rounds: int | None = None, time_limit: float = 1800.0):
    """A method running MST or AIM (``name``) on the ``columns`` most popular items (module docstring).

    The column sample comes from ``popular``: a function of the public workload (its DP item
    counts), set by the runner as the method's ``popular_items`` attribute before each table."""

    def fn(X, *, epsilon, delta, seed):
        py = peer_python()
        if py is None:
            raise RuntimeError("the peers' venv is absent: run `sparkpriv bench utility --setup-peers`")
        top = np.asarray(fn.popular_items[:columns])
        Xs = sparse.csr_matrix(X)[:, top].toarray().astype(np.int8)
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")
            np.savez(src, X=Xs, name=name, eps=float(epsilon), delta=float(delta), seed=int(seed) % 2**31,
                     n_out=X.shape[0], rounds=int(rounds or 2 * columns))
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
            env.setdefault("JAX_PLATFORMS", "cpu")
            subprocess.run([str(py), "-c", DRIVER, src, dst], check=True, timeout=time_limit, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            S = np.load(dst)["S"]
        r, c = np.nonzero(S)
        return sparse.csr_matrix((np.ones(r.size), (r, top[c])), shape=(S.shape[0], X.shape[1]))

    fn.popular_items = np.arange(0)
    return fn
