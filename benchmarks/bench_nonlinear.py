"""Nonlinear party blocks (docs/party-models.md), side by side in one run.

Sections (``--sections``, comma-separated; default all):

``featuremaps``  a9a, breast cancer and two untuned sets (digits even/odd, a make_classification
                 set), 2 parties, default settings: the linear block beside 'rff', 'spline' and
                 'bins' after 50 rounds and converged (tol 1e-6); test accuracy, rounds, seconds.
``private``      a9a subsample (12k train, 8k test), party 0 private at epsilon = 1 (delta 1e-5, one
                 model release; tests/test_private_parties.py's settings), party 1 non-private: party
                 0's linear block beside its 'rff' block; epsilon from each fit's ledger.
``split``        split learning on the same split (not in the default sections): an MLP per party, a
                 head over the concatenated embeddings, minibatch Adam; accuracy, bytes and CPU per epoch.
``fmnist``       Fashion-MNIST (K = 10), pixel columns split left/right between 2 parties (or into
                 quadrants, ``--parties 4``): the linear
                 route, MLP blocks by ADMM sharing (in process, the kind's defaults), and the same
                 additive model (the party networks summed into one softmax) trained centrally with
                 torch, its learning rate decayed linearly to 0 over its epochs (a converged
                 reference: its last epoch is reported, never its best epoch on the test rows).

    python benchmarks/bench_nonlinear.py [--sections fmnist] [--n 60000] [--rounds 40] [--parties 4]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def _untuned(name):
    """Data sets nobody tuned the feature maps on, 2 parties (the columns halved), a stratified 25 %
    test split (random_state 0), columns standardized on the training rows: scikit-learn's bundled
    digits as a binary task (even vs odd digit) and a ``make_classification`` set (3000 rows, 20
    columns, 10 informative, random_state 0)."""
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler
    if name == "digits-parity":
        from sklearn.datasets import load_digits
        X, y = load_digits(return_X_y=True)
        y = np.where(y % 2 == 0, 1.0, -1.0)
    else:
        from sklearn.datasets import make_classification
        X, y = make_classification(n_samples=3000, n_features=20, n_informative=10, random_state=0)
        y = np.where(y == 1, 1.0, -1.0)
    tr, te = train_test_split(np.arange(y.size), test_size=0.25, random_state=0, stratify=y)
    X = StandardScaler().fit(X[tr]).transform(X)
    h = X.shape[1] // 2
    return [X[tr, :h], X[tr, h:]], y[tr], [X[te, :h], X[te, h:]], y[te]


FEATUREMAP_DATA = ("breast_cancer", "a9a", "digits-parity", "synthetic")


def featuremap_data(name):
    """A data set of the featuremaps section as 2 parties' training and test blocks."""
    if name not in ("breast_cancer", "a9a"):
        return _untuned(name)
    from flower_vfl.io.data import column_ranges, load_all
    X, y, Xt, yt = load_all(name)
    cols = column_ranges(name, X.shape[1], 2)
    sl = (lambda A, a, b: A[:, a:b].tocsr()) if name == "a9a" else (lambda A, a, b: A[:, a:b])
    return [sl(X, a, b) for a, b in cols], y, [sl(Xt, a, b) for a, b in cols], yt


def featuremaps(datasets=FEATUREMAP_DATA):
    """Each kind with its default settings beside the linear block, 2 parties: after the default 50
    rounds, and converged (Boyd's residual rule at tol 1e-6, at most 2000 rounds: the comparison of
    the models themselves, since a fit stopped at a fixed round is a snapshot of its trajectory)."""
    from flower_vfl import VerticalADMM
    for name in datasets:
        B, y, Bt, yt = featuremap_data(name)
        for label, kw in (("50 rounds", {}), ("converged", {"tol": 1e-6, "max_rounds": 2000})):
            base = None
            for pm in ("linear", "rff", "spline", "bins"):
                t, k = time.perf_counter(), [0]
                m = VerticalADMM(party_model=pm, callback=lambda r, e: k.__setitem__(0, r), **kw).fit(B, y)
                acc = float(np.mean(m.predict(Bt) == yt))
                base = acc if base is None else base
                print(f"featuremaps {name:13s} {label:9s} {pm:7s} acc={acc:.4f} (vs linear {acc - base:+.4f}) "
                      f"rounds={k[0]} {time.perf_counter() - t:6.1f}s", flush=True)


def private():
    from flower_vfl import VerticalADMM
    from flower_vfl.io.data import column_ranges, load_all
    from flower_vfl.privacy.party import PrivacyConfig
    X, y, Xt, yt = load_all("a9a")
    cols = column_ranges("a9a", X.shape[1], 2)
    rng = np.random.default_rng(0)
    tr = np.sort(rng.choice(y.size, 12_000, replace=False))
    te = np.sort(rng.choice(yt.size, 8_000, replace=False))
    B = [X[tr][:, a:b].tocsr() for a, b in cols]
    Bt = [Xt[te][:, a:b].tocsr() for a, b in cols]
    n = tr.size
    rho = 0.125 / n
    for seed in (0, 1, 2):
        cfg = PrivacyConfig(epsilon=1.0, delta=1e-5, train_rounds=0, eval_rounds=1, b1=4.0, c_v=1 / (n * rho * 2),
                            c_s=1.0, lam=3e-3, seed=seed)
        for pm in ("linear", "rff"):
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m = VerticalADMM(lam=1e-4, rho=rho, max_rounds=40, tol=1e-5, privacy=[cfg, None],
                                 party_model=[pm, "linear"]).fit(B, y[tr])
            acc = float(np.mean(m.predict(Bt) == yt[te]))
            rep = m.privacy_report()[0]
            print(f"private a9a-12k seed={seed} party0={pm:6s} acc={acc:.4f} epsilon(exact)="
                  f"{rep['totals']['exact']:.4f} releases={len(rep['ledger']['entries'])}", flush=True)


def _fmnist(n, parties=2):
    """Fashion-MNIST's first n training rows, pixel columns split left/right (2 parties) or into
    quadrants (4)."""
    from flower_vfl.datasets.fashion_mnist import load_fashion_mnist
    X, y, Xt, yt = load_fashion_mnist()
    X, y = X[:n], y[:n]
    img, imt = X.reshape(-1, 28, 28), Xt.reshape(-1, 28, 28)
    parts = [(slice(None), slice(0, 14)), (slice(None), slice(14, 28))] if parties == 2 else \
        [(r, c) for r in (slice(0, 14), slice(14, 28)) for c in (slice(0, 14), slice(14, 28))]
    B = [img[:, r, c].reshape(len(X), -1) for r, c in parts]
    Bt = [imt[:, r, c].reshape(len(Xt), -1) for r, c in parts]
    return B, y, Bt, yt


#: the MLP blocks of the bench: the kind's defaults (width 256, 1 layer, 1 epoch a round, Adam at 1e-3
#: decayed by 0.97 a round, batch 256), spelled out
MLP = {"party-model": "mlp", "party-model-width": 256, "party-model-epochs": 1, "party-model-lr-decay": 0.97}


def central_additive(B, y, Bt, yt, epochs, lam=1e-4, settings=MLP, log=print, decay=True):
    """The additive model trained centrally on pooled data: the parties' networks (same
    architecture, same seeds: core/blocks_mlp.py) summed into one softmax, minibatch Adam. With
    ``decay`` (the reference) the learning rate decays linearly to 0 over the ``epochs`` (per
    minibatch step), so the last epoch is a converged model; the accuracy returned is the last
    epoch's, never the best epoch's on the test rows."""
    import torch
    from flower_vfl.core.blocks import block_from_config
    K = int(np.max(y)) + 1
    torch.set_num_threads(1)
    blocks = [block_from_config(settings).fit(D) for D in B]
    nets = [b.net(K) for b in blocks]
    bias = torch.zeros(K, requires_grad=True)
    params = [p for net in nets for p in net.parameters()] + [bias]
    opt = torch.optim.Adam(params, lr=float(settings.get("party-model-lr", 1e-3)))
    Dt = [torch.as_tensor(D, dtype=torch.float32) for D in B]
    Et = [torch.as_tensor(D, dtype=torch.float32) for D in Bt]
    yt_ = torch.as_tensor(y)
    gen = torch.Generator().manual_seed(0)
    batch = int(settings.get("party-model-batch", 256))
    steps = epochs * -(-len(y) // batch)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, (lambda t: 1.0 - t / steps) if decay else (lambda t: 1.0))
    for ep in range(epochs):
        perm = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y), batch):
            idx = perm[i:i + batch]
            opt.zero_grad()
            logits = sum(net(D[idx]) for net, D in zip(nets, Dt)) + bias
            loss = torch.nn.functional.cross_entropy(logits, yt_[idx])
            loss = loss + 0.5 * lam * sum((p * p).sum() for p in params[:-1])
            loss.backward()
            opt.step()
            sched.step()
        with torch.no_grad():
            acc = float((torch.argmax(sum(net(E) for net, E in zip(nets, Et)) + bias, 1).numpy() == yt).mean())
        log(f"fmnist central-additive epoch={ep + 1} acc={acc:.4f}")
    return acc


def split_learning(B, y, Bt, yt, epochs, embed=64, width=256, lr=1e-3, batch=256, log=print):
    """Split learning as Flower's vertical example does it: an MLP per party (to an ``embed``-wide
    embedding), a head over the concatenated embeddings at the label owner, minibatch Adam. Per
    party and epoch it sends N x embed float32 forward and receives as many gradients back."""
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    K = int(np.max(y)) + 1
    bottoms = [torch.nn.Sequential(torch.nn.Linear(D.shape[1], width), torch.nn.ReLU(), torch.nn.Linear(width, embed))
               for D in B]
    head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(embed * len(B), K))
    params = [p for m in bottoms + [head] for p in m.parameters()]
    opt = torch.optim.Adam(params, lr=lr)
    Dt = [torch.as_tensor(D, dtype=torch.float32) for D in B]
    Et = [torch.as_tensor(D, dtype=torch.float32) for D in Bt]
    yt_ = torch.as_tensor(y)
    gen = torch.Generator().manual_seed(0)
    t0 = time.process_time()
    accs = []
    for ep in range(epochs):
        perm = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y), batch):
            idx = perm[i:i + batch]
            opt.zero_grad()
            logits = head(torch.cat([m(D[idx]) for m, D in zip(bottoms, Dt)], dim=1))
            torch.nn.functional.cross_entropy(logits, yt_[idx]).backward()
            opt.step()
        with torch.no_grad():
            acc = float((torch.argmax(head(torch.cat([m(E) for m, E in zip(bottoms, Et)], 1)), 1).numpy() == yt).mean())
        accs.append(acc)
        mb = 2 * len(y) * embed * 4 * (ep + 1) / 1e6
        log(f"fmnist split-learning epoch={ep + 1} acc={acc:.4f} MB/party={mb:.0f} cpu={time.process_time() - t0:.0f}s")
    return accs


def fmnist(n, rounds, epochs_central, parties=2):
    from flower_vfl import VerticalADMM
    B, y, Bt, yt = _fmnist(n, parties)
    t = time.perf_counter()
    lin = VerticalADMM(loss="multinomial", lam=1e-4, max_rounds=50).fit(B, y)
    print(f"fmnist linear {parties} parties acc={np.mean(lin.predict(Bt) == yt):.4f} {time.perf_counter() - t:.0f}s",
          flush=True)
    t = time.perf_counter()

    def cb(k, e):
        print(f"fmnist mlp-admm parties={parties} round={k} acc={np.mean(e.predict(Bt) == yt):.4f} "
              f"{time.perf_counter() - t:.0f}s", flush=True)
    m = VerticalADMM(loss="multinomial", lam=1e-4, max_rounds=rounds, acceleration="none",
                     variant="sharing-fixed", party_model=MLP, callback=cb).fit(B, y)
    acc_admm = float(np.mean(m.predict(Bt) == yt))
    K = int(np.max(y)) + 1
    print(f"fmnist mlp-admm bytes/party: {2 * len(y) * K * 8 * rounds / 1e6:.0f} MB over {rounds} rounds (N x K "
          "float64 up, the target v down, each round)", flush=True)
    t = time.perf_counter()
    acc_c = central_additive(B, y, Bt, yt, epochs_central, log=lambda s: print(s, flush=True))
    print(f"fmnist summary parties={parties} n={n} mlp-admm={acc_admm:.4f} ({rounds} rounds) central-additive={acc_c:.4f} "
          f"(last of {epochs_central} epochs, lr decayed to 0, {time.perf_counter() - t:.0f}s) gap={acc_c - acc_admm:+.4f}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sections", default="featuremaps,private,fmnist")
    ap.add_argument("--n", type=int, default=60000, help="Fashion-MNIST training rows")
    ap.add_argument("--rounds", type=int, default=40, help="ADMM rounds of the MLP blocks")
    ap.add_argument("--epochs-central", type=int, default=None,
                    help="epochs of the central reference (default: rounds x the MLP blocks' local epochs a round, "
                         "the same passes over the data)")
    ap.add_argument("--split-epochs", type=int, default=20, help="split learning: epochs")
    ap.add_argument("--parties", type=int, default=2, choices=(2, 4), help="fmnist: halves or quadrants")
    a = ap.parse_args()
    print("load:", os.getloadavg())
    for s in a.sections.split(","):
        {"featuremaps": featuremaps, "private": private,
         "fmnist": lambda: fmnist(a.n, a.rounds, a.epochs_central or a.rounds * MLP["party-model-epochs"], a.parties),
         "split": lambda: split_learning(*_fmnist(a.n, a.parties), a.split_epochs,
                                         log=lambda t: print(t, flush=True))}[s]()
    print("load:", os.getloadavg())


if __name__ == "__main__":
    main()
