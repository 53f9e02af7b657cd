"""In Flower's simulation the central node wakes the engine's delivery thread after it pushes
(flower_vfl/strategies/sim_delivery.py), instead of leaving the round to Flower's next 0.1 s
tick. Checked against Flower's own delivery loop function (``vce_api.add_messages_to_queue``)
running in a thread: the wake reaches the Event it sleeps on (its wait returns by a notify, which
only a wake can cause: a timeout returns False), the loop goes on (the Event's flag untouched),
a pushed message is delivered; on a Flower whose loop differs, nothing is touched and one exact
warning says so."""

import queue
import threading
import warnings

import pytest
from flwr.server.superlink.fleet.vce import vce_api

from flower_vfl.strategies import exchange, sim_delivery


def _fresh(monkeypatch):
    """Nothing found or warned yet in this process (as in a new ServerApp process)."""
    monkeypatch.setattr(sim_delivery, "_found", {"thread": None, "event": None, "usable": None,
                                                 "warned": False, "woken": 0})


def _said_once():
    """The warnings of two calls after an exchange (the second must say nothing)."""
    with pytest.warns(UserWarning) as rec:
        sim_delivery.warn_if_absent()
        sim_delivery.warn_if_absent()
    return [str(w.message) for w in rec]


class SpyEvent(threading.Event):
    """Flower's f_stop, recording how each wait ended: True = woken by a notify (flag unset)."""

    def __init__(self):
        super().__init__()
        self.ends = []

    def wait(self, timeout=None):
        r = super().wait(timeout)
        self.ends.append(bool(r) and not self.is_set())
        return r


class FakeState:
    """The LinkState calls the delivery loop makes: get_message_ins(node_id=, limit=)."""

    def __init__(self):
        self.pending, self.lock = [], threading.Lock()

    def get_message_ins(self, node_id, limit):
        with self.lock:
            out, self.pending = self.pending[:limit], self.pending[limit:]
        return out


@pytest.fixture
def loop(monkeypatch):
    """Flower's delivery loop in a thread, as its engine starts it (positional arguments)."""
    _fresh(monkeypatch)
    monkeypatch.delenv(sim_delivery.ENV, raising=False)
    state, q, f_stop = FakeState(), queue.Queue(), SpyEvent()
    th = threading.Thread(target=vce_api.add_messages_to_queue, args=(state, q, {7: 0}, f_stop))
    th.start()
    yield state, q, f_stop, th
    f_stop.set()
    th.join(timeout=5)


class InMemoryGrid:
    """Named as Flower's simulation grid; a push lands in the fake LinkState, a worker thread
    answers what the delivery loop queued."""

    def __init__(self, state, q):
        self.state, self.q, self.replies = state, q, []
        threading.Thread(target=self._worker, daemon=True).start()

    def _worker(self):
        from types import SimpleNamespace
        msg = self.q.get(timeout=30)
        self.replies.append(SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=msg)))

    def push_messages(self, messages):
        messages = list(messages)
        with self.state.lock:
            self.state.pending += messages
        return messages

    def pull_messages(self, ids):
        got, self.replies = self.replies, []
        return got


def _woken(f_stop, tries=500):
    """Wake until one wake lands while the loop sleeps (one landing while it scans is lost)."""
    for _ in range(tries):
        if sim_delivery.wake_delivery() and any(f_stop.ends):
            return True
        threading.Event().wait(0.001)
    return any(f_stop.ends)


def test_a_wake_reaches_flowers_delivery_loop_and_the_loop_goes_on(loop):
    state, q, f_stop, th = loop
    assert sim_delivery._delivery_event() is f_stop            # found by its target, not by name
    assert _woken(f_stop)
    assert th.is_alive() and not f_stop.is_set()              # the flag untouched: the loop goes on
    n = len(f_stop.ends)
    threading.Event().wait(0.25)                               # and still ticks on its own
    assert len(f_stop.ends) > n and th.is_alive()


def test_the_exchange_wakes_after_each_push_to_the_simulation_grid(loop, monkeypatch):
    state, q, f_stop, th = loop
    calls = []
    real = sim_delivery.wake_delivery

    def spy():
        calls.append(list(state.pending))                     # what was pushed when it woke
        return real()

    monkeypatch.setattr(sim_delivery, "wake_delivery", spy)
    grid = InMemoryGrid(state, q)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                         # found: no warning
        replies = exchange.send_and_receive(grid, ["message to node 7"], timeout=30)
    assert [r.metadata.reply_to_message_id for r in replies] == ["message to node 7"]
    assert calls and calls[0] in (["message to node 7"], [])   # after the push (delivered or not yet)
    assert sim_delivery._found["woken"] >= 1


def test_no_wake_for_a_remote_grid(monkeypatch):
    calls = []
    monkeypatch.setattr(sim_delivery, "wake_delivery", lambda: calls.append(1))

    class Remote(InMemoryGrid):
        pass
    Remote.__name__ = "GrpcGrid"
    state, q = FakeState(), queue.Queue()
    grid = Remote(state, q)
    q.put("m")                                                 # the worker answers without a loop
    assert len(exchange.send_and_receive(grid, ["m"], timeout=30)) == 1
    assert calls == []


def test_a_push_before_the_engine_started_its_thread_is_not_a_warning(monkeypatch):
    """The first exchange (identify) pushes while Flower still starts Ray: no thread to wake yet.
    By the time its replies came the thread runs: found, no warning (as in a real simulation)."""
    _fresh(monkeypatch)
    assert sim_delivery.wake_delivery() is False              # the push: no engine thread yet
    f_stop = SpyEvent()
    th = threading.Thread(target=vce_api.add_messages_to_queue, args=(FakeState(), queue.Queue(), {}, f_stop))
    th.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sim_delivery.warn_if_absent()                      # the replies came: it runs now
        assert sim_delivery._found["event"] is f_stop and _woken(f_stop)
    finally:
        f_stop.set()
        th.join(timeout=5)


def test_off_by_env(loop, monkeypatch):
    state, q, f_stop, th = loop
    monkeypatch.setenv(sim_delivery.ENV, "0")
    assert sim_delivery.wake_delivery() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sim_delivery.warn_if_absent()                     # off on purpose: silent
    assert not any(f_stop.ends)


def test_an_unknown_env_value_is_said_once_and_the_wake_stays_on(loop, monkeypatch):
    state, q, f_stop, th = loop
    monkeypatch.setenv(sim_delivery.ENV, "false")
    with pytest.warns(UserWarning) as rec:
        assert _woken(f_stop)
    assert [str(w.message) for w in rec] == [
        "flower-vfl: $FLOWER_VFL_SIM_WAKE='false' is not 0 or 1; the simulation delivery wake stays on "
        "(set FLOWER_VFL_SIM_WAKE=0 to turn it off)"]


def test_a_changed_flower_loop_is_left_alone_and_said_once(monkeypatch):
    import flwr

    _fresh(monkeypatch)

    def add_messages_to_queue(state, queue, nodes_mapping, f_stop):   # a loop that sleeps otherwise
        while not f_stop.is_set():
            threading.Event().wait(0.01)

    monkeypatch.setattr(vce_api, "add_messages_to_queue", add_messages_to_queue)
    f_stop = SpyEvent()
    th = threading.Thread(target=add_messages_to_queue, args=(FakeState(), queue.Queue(), {}, f_stop))
    th.start()
    try:
        assert sim_delivery.wake_delivery() is False
        assert _said_once() == [
            f"flower-vfl: Flower patch 'sim-delivery-wake' not applied (flwr {flwr.__version__}'s code has no "
            "vce_api.add_messages_to_queue(state, queue, nodes_mapping, f_stop) sleeping on f_stop.wait); "
            "each round waits for Flower's 0.1 s delivery tick"]
    finally:
        f_stop.set()
        th.join(timeout=5)


def test_another_flower_release_is_left_alone(loop, monkeypatch):
    import flwr
    state, q, f_stop, th = loop
    monkeypatch.setattr(flwr, "__version__", "1.43.0")
    assert sim_delivery.wake_delivery() is False
    assert not any(f_stop.ends)
    with pytest.warns(UserWarning, match=r"^flower-vfl: Flower patch 'sim-delivery-wake' not applied \(flwr 1\.43\.0 "
                                         r"is not one of 1\.41\.x, 1\.42\.x\); each round waits for Flower's 0\.1 s "
                                         r"delivery tick$"):
        sim_delivery.warn_if_absent()


def test_no_engine_thread_in_this_process_is_said_once(monkeypatch):
    import flwr

    _fresh(monkeypatch)
    assert sim_delivery.wake_delivery() is False
    assert _said_once() == [
        f"flower-vfl: no thread running Flower's simulation delivery loop (flwr {flwr.__version__}, "
        "vce_api.add_messages_to_queue) was found in the ServerApp's process; each round waits for "
        "Flower's 0.1 s delivery tick"]
