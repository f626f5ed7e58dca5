"""MNIST with the DPGM (VAE per cluster): synthetic digits and the accuracy of a classifier
trained on them, against DP-SGD on the real digits and the non-private classifier (docs/research/dpgm.md,
section "MNIST: samples and classifier accuracy").

One DPGM release per label (``sparkpriv.api.release_dpgm`` on the label's training digits,
``model="vae"``, each at the full ``(epsilon, delta)``): the label groups are disjoint, so with
the labels (and the per-label counts) treated as PUBLIC the ten releases compose in parallel and
the whole is ``(epsilon, delta)``-DP for the images. If the label of a digit is itself secret, a
replaced record can change two groups and the guarantee is ``(2 epsilon, 2 delta)``-ish by basic
composition; the baselines below protect image and label together at ``(epsilon, delta)``.
Labels as a column was not used: the release's VAE models ``[0, 1]`` columns with a Bernoulli
likelihood, a label column would be one pixel among 785 and the generated label would hardly
depend on the digit drawn.

From every release 6,000 digits are generated (the decoder's pixel means, post-processing); a
softmax regression (the same model in every row of the table) is trained on the 60,000
synthetic labelled digits and tested on the real 10,000 test digits. Baselines: the same
softmax regression trained on the real 60,000 (non-private), and trained with DP-SGD on the real
data (Poisson sampling, per-example clipping with the exact norm ``||p - y|| ||(x, 1)||``,
discrete Gaussian noise and PLD accounting from ``sparkpriv.mechanisms.dpsgd``, replace-one, the
same ``(epsilon, delta)``). diffprivlib's LogisticRegression is added when it imports.

Fixed seeds (``insecure_fixed_seed``): these are measurements, not private releases.

    python scripts/dpgm_mnist.py                 # the full run (docs/research/dpgm.md)
    python scripts/dpgm_mnist.py --small         # a few thousand digits, 1 epoch (seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time

import numpy as np

from sparkpriv.bench.regression import read_idx  # the MNIST idx reader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MNIST_DIR = os.path.normpath(os.path.join(ROOT, "..", "shared", "datasets", "mnist"))
HUGE_EPSILON = 1e4  # "model only": the noise is negligible


def load_mnist(directory: str = MNIST_DIR):
    """``(Xtr, ytr, Xte, yte)``: pixels scaled to [0, 1], float64, labels int."""
    f = lambda name: read_idx(os.path.join(directory, name))  # noqa: E731
    Xtr = f("train-images.idx3-ubyte.gz").reshape(-1, 784) / 255.0
    Xte = f("t10k-images.idx3-ubyte.gz").reshape(-1, 784) / 255.0
    return Xtr, f("train-labels.idx1-ubyte.gz").astype(int), Xte, f("t10k-labels.idx1-ubyte.gz").astype(int)


# ----------------------------------------------------------------------------- softmax regression

def _softmax(Z):
    Z = Z - Z.max(axis=1, keepdims=True)
    E = np.exp(Z)
    return E / E.sum(axis=1, keepdims=True)


def _aug(X):
    return np.hstack([X, np.ones((X.shape[0], 1))])


def train_softmax(X, y, *, epochs=10, batch=256, lr=0.01, l2=1e-4, seed=0):
    """Non-private softmax regression (Adam, mini-batches): weights (785, 10)."""
    from sparkpriv.mechanisms.dpsgd import Adam

    rng = np.random.default_rng(seed)
    A, Y = _aug(X), np.eye(10)[y]
    W = np.zeros(A.shape[1] * 10)
    opt = Adam(lr=lr)
    for _ in range(int(epochs)):
        order = rng.permutation(A.shape[0])
        for s in range(0, A.shape[0], batch):
            b = order[s: s + batch]
            P = _softmax(A[b] @ W.reshape(-1, 10))
            g = (A[b].T @ (P - Y[b])).ravel() / len(b) + l2 * W
            W = opt.step(W, g)
    return W.reshape(-1, 10)


def per_example_sq_norms(A, P, Y):
    """Squared norms of the per-example gradients ``a_i (p_i - y_i)^T`` of the softmax loss:
    ``||p_i - y_i||^2 ||a_i||^2`` (an outer product's Frobenius norm)."""
    return np.einsum("ij,ij->i", P - Y, P - Y) * np.einsum("ij,ij->i", A, A)


def train_softmax_dpsgd(X, y, *, epsilon, delta, clip=1.0, sampling_rate=0.01, epochs=10, lr=0.01,
                        seed=0):
    """DP-SGD softmax regression, replace-one, accounted as sparkpriv.mechanisms.dpsgd accounts
    (``SelfComposed(PoissonSampled(q, Gaussian(sigma / 2)), T)``, PLD): ``(W, sigma, T)``."""
    from sparkpriv.mechanisms import dpsgd
    from sparkpriv.privacy.random import stream

    n = X.shape[0]
    steps = int(np.ceil(epochs / sampling_rate))
    sigma = dpsgd.calibrate_noise_multiplier(epsilon=epsilon, delta=delta, sampling_rate=sampling_rate,
                                             steps=steps)
    A, Y = _aug(X), np.eye(10)[y]
    dim = A.shape[1] * 10
    noise = dpsgd.step_noise(clip=clip, noise_multiplier=sigma, dim=dim, max_abs=n * clip)
    W = np.zeros(dim)
    opt = dpsgd.Adam(lr=lr)
    for t in range(1, steps + 1):
        mask = dpsgd.poisson_mask(n, sampling_rate, stream(seed, dpsgd.SAMPLE_STAGE, 0, t))
        Ab, Yb = A[mask], Y[mask]
        P = _softmax(Ab @ W.reshape(-1, 10))
        f = dpsgd.clip_factors(per_example_sq_norms(Ab, P, Yb), clip)
        s = (Ab.T @ ((P - Yb) * f[:, None])).ravel()
        g = dpsgd.noisy_sum(s, noise, stream(seed, dpsgd.NOISE_STAGE, 0, t)) / (sampling_rate * n)
        W = opt.step(W, g)
    return W.reshape(-1, 10), sigma, steps


def accuracy(W, X, y) -> float:
    return float(np.mean(np.argmax(_aug(X) @ W, axis=1) == y))


# ----------------------------------------------------------------------------- the DPGM per label

def _memoize_calibration():
    """The ten releases of one setting share their public parameters, so the DPGM's calibration
    (a pure function of them and ``d``; seconds to minutes at a huge epsilon) is computed once."""
    from sparkpriv.mechanisms import dpgm

    if getattr(dpgm.calibrate_dpgm, "_memo", False):
        return
    plain, memo = dpgm.calibrate_dpgm, {}

    def calibrate(params, d, caller="dpgm"):
        key = (params, d)
        if key not in memo:
            memo[key] = plain(params, d, caller)
        return memo[key]

    calibrate._memo = True
    dpgm.calibrate_dpgm = calibrate


def dpgm_per_label(Xtr, ytr, *, epsilon, delta, per_label, seed, latent=2, hidden=200, k=2,
                   epochs=10.0, sampling_rate=0.1, clip=10.0, learning_rate=0.01, kmeans_share=0.1,
                   kmeans_iterations=4, average_tail=None):
    """Ten DPGM releases (one per label) through the public API and ``per_label`` synthetic
    digits of each (pixel means of the decoder, mixture weights the released noisy sizes).
    Returns ``(X_syn, y_syn, info)``."""
    from sparkpriv.api import release_dpgm
    from sparkpriv.privacy.random import insecure_fixed_seed, stream

    _memoize_calibration()
    xs, ys, info = [], [], {"releases": [], "per_cluster": []}
    for lab in range(10):
        Xl = Xtr[ytr == lab]
        with insecure_fixed_seed(seed * 100 + lab):
            rel = release_dpgm(Xl, epsilon=epsilon, delta=delta, model="vae", k=k, hidden=hidden,
                               latent=latent, epochs=epochs, sampling_rate=sampling_rate, clip=clip,
                               learning_rate=learning_rate, kmeans_share=kmeans_share,
                               kmeans_iterations=kmeans_iterations,
                               **({} if average_tail is None else {"average_tail": average_tail}))
        m = rel.model
        g = rel.receipt()["guarantee"]
        info["releases"].append({"label": lab, "rows": int(Xl.shape[0]), "accounted_epsilon": g["epsilon"],
                                 "noisy_sizes": [float(s) for s in m.sizes],
                                 "noise_multiplier": m.plan_public.get("noise_multiplier"),
                                 "steps": m.plan_public.get("steps")})
        # post-processing: the mixture's sampler, decoder means instead of Bernoulli draws
        w = np.maximum(np.asarray(m.sizes, float), 0.0)
        w = np.ones_like(w) if not np.any(w > 0) else w
        rng = stream(seed, 90, lab)
        counts = rng.multinomial(per_label, w / w.sum())
        gen = m.generator()
        part = np.concatenate([gen.sample(m.thetas[j], int(c), stream(seed, 91, lab, j), binary=False)
                               for j, c in enumerate(counts) if c > 0])
        # 8 draws of every cluster's model, whatever its weight (the figure per cluster)
        info["per_cluster"].append(np.stack([np.clip(gen.sample(m.thetas[j], 8, stream(seed, 93, lab, j),
                                                                binary=False), 0.0, 1.0) for j in range(m.k)]))
        part = part[stream(seed, 92, lab).permutation(part.shape[0])]  # clusters mixed, as synthesize() does
        xs.append(np.clip(part, 0.0, 1.0))
        ys.append(np.full(part.shape[0], lab))
    return np.concatenate(xs), np.concatenate(ys), info


def diffprivlib_accuracy(Xtr, ytr, Xte, yte, epsilon, seed):
    try:
        from diffprivlib.models import LogisticRegression
    except Exception as e:  # not a dependency; this sklearn breaks its import
        # the message without the machine's paths (a shared JSON file keeps it)
        msg = re.sub(r"\(/[^)]*\)", "(...)", str(e))
        return None, f"diffprivlib unavailable: {type(e).__name__}: {msg}"
    clf = LogisticRegression(epsilon=epsilon, data_norm=float(np.sqrt(784)), random_state=seed, max_iter=200)
    clf.fit(Xtr, ytr)
    return float(np.mean(clf.predict(Xte) == yte)), None


def run(*, small=False, epsilons=(1.0, 4.0, HUGE_EPSILON), latents=(2, 16), delta=1e-5, seed=1, epochs=None,
        dpgm_epochs=None, per_label=None, hidden=200, average_tail=None, log=print):
    """Every number of the evaluation (a JSON-ready dict) and the sample grids per (latent, epsilon)."""
    from threadpoolctl import threadpool_limits

    t_start = time.perf_counter()
    Xtr, ytr, Xte, yte = load_mnist()
    if small:
        keep = np.random.default_rng(0).permutation(Xtr.shape[0])[:3000]
        Xtr, ytr = Xtr[keep], ytr[keep]
        Xte, yte = Xte[:2000], yte[:2000]
    epochs = (1 if small else 10) if epochs is None else epochs
    dpgm_epochs = (1 if small else 10) if dpgm_epochs is None else dpgm_epochs
    per_label = (200 if small else 6000) if per_label is None else per_label
    res = {"setting": {"train_rows": int(Xtr.shape[0]), "test_rows": int(Xte.shape[0]), "delta": delta,
                       "seed": seed, "classifier": "softmax regression (Adam, 256 per batch, l2 1e-4)",
                       "classifier_epochs": epochs, "dpgm_epochs": dpgm_epochs, "dpgm_hidden": hidden,
                       "dpgm_k": 2, "dpgm_sampling_rate": 0.1, "dpgm_clip": 10.0, "dpgm_kmeans_share": 0.1,
                       "dpgm_average_tail": "library default" if average_tail is None else average_tail,
                       "synthetic_per_label": per_label, "dpsgd_clip": 1.0, "dpsgd_sampling_rate": 0.01,
                       "small": bool(small)},
           "rows": []}
    samples = {}
    with threadpool_limits(1):
        W = train_softmax(Xtr, ytr, epochs=epochs, seed=seed)
        res["rows"].append({"method": "non-private (real data)", "epsilon": None, "latent": None,
                            "accuracy": accuracy(W, Xte, yte)})
        log(f"non-private: {res['rows'][-1]['accuracy']:.4f} ({time.perf_counter() - t_start:.0f} s)")
        for eps in epsilons:
            W, sigma, T = train_softmax_dpsgd(Xtr, ytr, epsilon=eps, delta=delta, epochs=epochs, seed=seed)
            res["rows"].append({"method": "DP-SGD softmax (real data)", "epsilon": eps, "latent": None,
                                "accuracy": accuracy(W, Xte, yte), "noise_multiplier": sigma, "steps": T})
            log(f"DP-SGD eps={eps:g}: {res['rows'][-1]['accuracy']:.4f} (sigma {sigma:.3g}, {T} steps; "
                f"{time.perf_counter() - t_start:.0f} s)")
            acc, why = diffprivlib_accuracy(Xtr, ytr, Xte, yte, eps, seed)
            if acc is not None:
                res["rows"].append({"method": "diffprivlib LogisticRegression (pure eps)", "epsilon": eps,
                                    "latent": None, "accuracy": acc})
            else:
                res["setting"]["diffprivlib"] = why
        for lat in latents:
            for eps in epsilons:
                t0 = time.perf_counter()
                Xs, ys, info = dpgm_per_label(Xtr, ytr, epsilon=eps, delta=delta, per_label=per_label, seed=seed,
                                              latent=lat, hidden=hidden, epochs=dpgm_epochs,
                                              average_tail=average_tail)
                W = train_softmax(Xs, ys, epochs=epochs, seed=seed)
                res["rows"].append({"method": "DPGM (VAE) synthetic", "epsilon": eps, "latent": lat,
                                    "accuracy": accuracy(W, Xte, yte),
                                    "accounted_epsilon_max": max(r["accounted_epsilon"] for r in info["releases"]),
                                    "seconds": time.perf_counter() - t0, "releases": info["releases"]})
                samples[(lat, eps)] = np.stack([Xs[ys == lab][:8] for lab in range(10)])
                samples[("clusters", lat, eps)] = np.stack(info.pop("per_cluster"))  # (10, k, 8, 784)
                log(f"DPGM latent={lat} eps={eps:g}: {res['rows'][-1]['accuracy']:.4f} "
                    f"({time.perf_counter() - t0:.0f} s; total {time.perf_counter() - t_start:.0f} s)")
    res["seconds"] = time.perf_counter() - t_start
    return res, samples


def table(res) -> str:
    lines = ["| method | latent | epsilon | test accuracy |", "|---|---|---|---|"]
    for r in res["rows"]:
        eps = "-" if r["epsilon"] is None else (f"{r['epsilon']:g}" + (" (model only)" if r["epsilon"] >= 1e3 else ""))
        lines.append(f"| {r['method']} | {r['latent'] or '-'} | {eps} | {r['accuracy']:.4f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="3,000 training digits, 1 epoch (a test run)")
    ap.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0, HUGE_EPSILON])
    ap.add_argument("--latents", type=int, nargs="+", default=[2, 16])
    ap.add_argument("--dpgm-epochs", type=float, default=None, help="DP-SGD epochs of every VAE (default 10)")
    ap.add_argument("--average-tail", type=float, default=None,
                    help="DPGMParams.average_tail of every VAE (default: the library's)")
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="dpgm_mnist.json", help="where to write every number")
    a = ap.parse_args()
    res, _ = run(small=a.small, epsilons=tuple(a.epsilons), latents=tuple(a.latents), delta=a.delta, seed=a.seed,
                  dpgm_epochs=a.dpgm_epochs, average_tail=a.average_tail)
    print(table(res))
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {a.json} ({res['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
