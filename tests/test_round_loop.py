"""The one round loop (core/rounds.py ``run_rounds``, ``eval_due``) on its own: which rounds run,
which are evaluated, what a resume and the stop rule do, and the order of a round's steps. Every
route counts its rounds through it (tests/test_architecture.py checks that no route has its own)."""

from flower_vfl.core.rounds import eval_due, run_rounds


def _loop(last, stop_at=None, **kw):
    calls = []

    def step(k):
        calls.append(("step", k))
        return {"round": k}, k == stop_at

    def evaluate(k, row):
        calls.append(("evaluate", k))
        row["acc"] = k / 10

    def on_round(k, row, stop):
        calls.append(("on_round", k, stop, dict(row)))

    history = []
    out = run_rounds(step, last, history=history, evaluate=evaluate, on_round=on_round, **kw)
    return out, history, calls


def test_rounds_one_to_last_each_step_then_append_then_evaluate_then_callback():
    (k, stopped), history, calls = _loop(3, eval_every=2)
    assert (k, stopped) == (3, False)
    assert history == [{"round": 1}, {"round": 2, "acc": 0.2}, {"round": 3, "acc": 0.3}]
    assert calls == [("step", 1), ("on_round", 1, False, {"round": 1}),
                     ("step", 2), ("evaluate", 2), ("on_round", 2, False, {"round": 2, "acc": 0.2}),
                     ("step", 3), ("evaluate", 3), ("on_round", 3, False, {"round": 3, "acc": 0.3})]


def test_the_stop_rule_ends_the_loop_at_its_round_which_is_evaluated_as_the_last():
    (k, stopped), history, calls = _loop(10, stop_at=4, eval_every=3)
    assert (k, stopped) == (4, True)
    assert [r["round"] for r in history] == [1, 2, 3, 4]
    assert [c[1] for c in calls if c[0] == "evaluate"] == [3, 4]
    assert calls[-1] == ("on_round", 4, True, {"round": 4, "acc": 0.4})


def test_a_resume_starts_at_first_and_a_loop_with_nothing_left_runs_no_round():
    (k, stopped), history, _ = _loop(5, first=4)
    assert (k, stopped) == (5, False) and [r["round"] for r in history] == [4, 5]
    (k, stopped), history, calls = _loop(5, first=6)
    assert (k, stopped) == (5, False) and history == [] and calls == []


def test_eval_due_every_k_rounds_the_ending_round_as_at_end_says_and_the_first_point():
    assert [k for k in range(1, 8) if eval_due(k, 7, 3)] == [3, 6, 7]
    assert [k for k in range(1, 8) if eval_due(k, 7, 3, at_end=False)] == [3, 6]
    assert [k for k in range(1, 7) if eval_due(k, 6, 3, at_end=False)] == [3]
    assert [k for k in range(1, 8) if eval_due(k, 7, 0, at_end=None)] == []
    assert [k for k in range(1, 8) if eval_due(k, 7, 0, at_end=None, start=1)] == [1]
    assert eval_due(2, 7, 0, stopped=True) is True and eval_due(2, 7, 0, at_end=False, stopped=True) is False


def test_the_train_loss_row_is_the_loss_of_the_releases_sum_and_leaves_every_array_as_it_was():
    """The driver's train loss works in the round's own sum of the releases (core/rounds.py
    ``_train_loss``, from INPLACE_MIN entries): each row's train_loss is bitwise LogisticLoss.mean of
    s_1 + s_2 + b recomputed from the releases the parties sent, the value_().mean() reference to
    1e-13, the stop rule (Boyd's thresholds on s_sum) stops at the round the same thresholds
    recomputed from the releases say, and no release, z, y or q array is written by the row."""
    import numpy as np

    from flower_vfl.core.central import CentralUpdate, residuals
    from flower_vfl.core.losses import LogisticLoss
    from flower_vfl.core.rounds import INPLACE_MIN, RoundDriver

    rng = np.random.default_rng(4)
    n = INPLACE_MIN + 3
    t = np.where(rng.random(n) < 0.4, -1.0, 1.0)
    loss = LogisticLoss()
    central = CentralUpdate(loss, t, rho=0.5, theta=0.5)
    sent, seen = [], []

    class Exchange:
        evaluates = False

        def train(self, k, parties, qs):
            # releases that approach a fixed point, so the residual rule stops the run
            rel = {m: (1 + 0.5 ** k) * (0.3 + m) * np.sin(np.arange(n) * (m + 1) / n) for m in parties}
            sent.append({m: s.copy() for m, s in rel.items()})
            return rel, {m: 0.0 for m in parties}

        def finish(self, k):
            pass

    driver = RoundDriver(central, 2, max_rounds=40, tol=1e-3, tol_abs=1e-12)
    driver.plan([False, False], [], acceleration="none")

    def on_round(k, row, phase, j, stopped):
        seen.append((central.z.copy(), central.y.copy(), central.q.copy(), dict(driver.last_s), float(central.b),
                     stopped))

    driver.run(Exchange(), on_round=on_round)
    assert 2 < len(driver.history) < 40 and driver.converged
    for row, rel, (z, y, q, last, b, stopped) in zip(driver.history, sent, seen):
        s = rel[0] + rel[1]
        assert row["train_loss"] == LogisticLoss().mean(s + b, t)
        assert abs(row["train_loss"] - float(loss.value(s + b, t).mean())) <= 1e-13
        for m in (0, 1):
            assert np.array_equal(last[m], rel[m])          # the releases kept are those sent
        eps_pri, eps_dual = residuals(row["primal_residual"], row["dual_residual"], s, z, y, 1e-3, 1e-12)
        assert stopped == (row["primal_residual"] <= eps_pri and row["dual_residual"] <= eps_dual)
