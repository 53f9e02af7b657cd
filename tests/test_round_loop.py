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
