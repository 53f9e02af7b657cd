"""The SuperNode wakes its warm executor when it stored a message (``--wake-executor`` /
``--wake-port``) instead of the executor polling for tasks every 10 ms, and the node's waits for
its ClientApp's reply grow with the time the ClientApp has taken (docs/benchmarks.md, "The floor
of a round"). Fast: no deployment."""

from __future__ import annotations

import socket
import time

import pytest

from _deploy_fakes import deploy_local_commands


def test_executor_sleep_returns_when_woken_and_polls_otherwise(monkeypatch):
    from flower_vfl.deploy import warm_exec

    monkeypatch.setattr(warm_exec, "WAKE_POLL_S", 0.3)
    sock = warm_exec.wake_socket(0)
    try:
        clock = warm_exec._HotTime(sock)
        t = time.monotonic()
        clock.sleep(0.2)                                    # nothing came: the fallback poll (>= WAKE_POLL_S)
        assert 0.25 <= time.monotonic() - t < 2.0 and clock.wakes == 0
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as node:
            for _ in range(3):                              # three messages while the loop was busy
                node.sendto(b"m", sock.getsockname())
        time.sleep(0.05)
        t = time.monotonic()
        clock.sleep(0.2)
        assert time.monotonic() - t < 0.2 and clock.wakes == 1
        t = time.monotonic()
        clock.sleep(0.2)                                    # drained: one wake for all three
        assert time.monotonic() - t >= 0.25
        clock.active()                                      # no hot polling with a wake socket
        clock.poke()                                        # a forked ClientApp's end wakes the loop
        t = time.monotonic()
        clock.sleep(0.2)
        assert time.monotonic() - t < 0.2 and clock.wakes == 2
    finally:
        sock.close()


def test_executor_without_wake_socket_polls_as_before(monkeypatch):
    from flower_vfl.deploy import warm_exec

    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    clock = warm_exec._HotTime()
    clock.poke()                                            # no socket: nothing
    clock.sleep(0.2)
    assert slept == [0.2]


def test_supernode_wakes_the_executor_only_when_a_message_was_stored(monkeypatch):
    import flwr.supernode.start_client_internal as sci

    from flower_vfl.deploy import supernode

    results = iter([None, 7, None, 8])
    monkeypatch.setattr(sci, "_pull_and_store_message", lambda **k: next(results))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as exe:
        exe.bind(("127.0.0.1", 0))
        exe.settimeout(0.5)
        assert supernode.wake_executor(exe.getsockname()[1]) is True
        assert supernode.wake_executor(exe.getsockname()[1]) is True      # twice: one wrapper
        got = [sci._pull_and_store_message(state=None) for _ in range(4)]
        assert got == [None, 7, None, 8]
        assert exe.recv(8) == b"m" and exe.recv(8) == b"m"
        with pytest.raises(socket.timeout):
            exe.recv(8)


def test_supernode_wake_refuses_another_flower_release(monkeypatch):
    import flwr
    import flwr.supernode.start_client_internal as sci

    from flower_vfl.deploy import supernode

    monkeypatch.setattr(sci, "_pull_and_store_message", sci._pull_and_store_message)
    before = sci._pull_and_store_message
    monkeypatch.setattr(flwr, "__version__", "1.99.0")
    with pytest.warns(UserWarning, match=r"^flower-vfl: Flower patch 'supernode-wake-executor' not applied \(flwr "
                                         r"1\.99\.0 .*\); --wake-executor is ignored"):
        assert supernode.wake_executor(9) is False
    assert sci._pull_and_store_message is before


def test_supernode_wake_argument(capsys):
    from flower_vfl.deploy import supernode

    assert supernode._wake_arg(["--insecure", "--wake-executor", "4711", "--port", "1"]) == \
        (4711, ["--insecure", "--port", "1"])
    assert supernode._wake_arg(["--insecure"]) == (None, ["--insecure"])
    assert supernode.main(["--wake-executor", "x", "--insecure"]) == 2
    assert "--wake-executor needs a UDP port" in capsys.readouterr().err



@pytest.fixture
def clock(monkeypatch):
    """Flower's SuperNode loop module with a fake clock: (module, [now], the sleeps asked for)."""
    import flwr.supernode.start_client_internal as sci

    monkeypatch.setattr(sci, "time", time)
    monkeypatch.setattr(sci, "_push_messages", lambda *a, **k: None)
    monkeypatch.setattr(sci, "_pull_and_store_message", lambda *a, **k: None)
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    return sci, now, slept


def test_reply_waits_grow_with_the_clientapps_time(clock):
    from flower_vfl.deploy import supernode

    sci, now, slept = clock
    assert supernode.cap_idle_sleep(0.5, 0.02) is True
    for dt in (0.0, 0.1, 0.5, 1.0, 3.0, 30.0):            # the ClientApp has taken dt s so far
        now[0] = 100.0 + dt
        sci.time.sleep(0.5)
    assert slept == pytest.approx([supernode.REPLY_POLL_S, supernode.REPLY_POLL_S, 0.025, 0.05,
                                   supernode.REPLY_POLL_CAP_S, supernode.REPLY_POLL_CAP_S])
    sci._push_messages("state")                             # the reply went out: the next wait starts anew
    now[0] += 0.001
    sci.time.sleep(0.5)
    assert slept[-1] == supernode.REPLY_POLL_S


def test_deploy_local_wires_the_wake_port(monkeypatch, tmp_path):
    cmds = deploy_local_commands(monkeypatch, tmp_path, 2, auth=False, tls=False)
    for m in range(2):
        node, exe = cmds[f"node{m}"], cmds[f"exec{m}"]
        port = node[node.index("--wake-executor") + 1]
        assert exe[exe.index("--wake-port") + 1] == port and int(port) > 0
    assert cmds["node0"][cmds["node0"].index("--wake-executor") + 1] != \
        cmds["node1"][cmds["node1"].index("--wake-executor") + 1]
    stock = deploy_local_commands(monkeypatch, tmp_path / "stock", 1, auth=False, tls=False, idle_poll=None)
    assert not any("--wake" in a for cmd in stock.values() for a in cmd)


def test_hot_window_opens_near_when_the_next_message_came_last_time(clock):
    from flower_vfl.deploy import supernode

    sci, now, slept = clock
    assert supernode.cap_idle_sleep(0.5, 0.1) is True
    sci._push_messages("state")                             # a reply at t=100: nothing seen yet
    sci.time.sleep(3)
    assert slept[-1] == 0.1                                 # hot at once
    now[0] = 110.0
    sci.time.sleep(0.5)                                     # the next message came 10 s after the reply
    assert sci.time.gaps == [10.0]
    sci._push_messages("state")                             # its reply at t=110
    sci.time.sleep(3)
    assert slept[-1] == 0.5                                 # 8 s before the window: idle polls
    now[0] = 110.0 + 7.8
    sci.time.sleep(3)
    assert slept[-1] == pytest.approx(0.2)                  # wakes when the window opens (8 s)
    now[0] = 110.0 + 8.5
    sci.time.sleep(3)
    assert slept[-1] == 0.1                                 # in the window
    now[0] = 110.0 + 10.5
    sci.time.sleep(3)
    assert slept[-1] == 0.5                                 # past it
    now[0] = 121.0
    sci.time.sleep(0.5)                                     # came after 11 s; then one after 1 s
    sci._push_messages("state")
    now[0] = 122.0
    sci.time.sleep(0.5)
    assert sci.time.gaps == [10.0, 11.0, 1.0] and sci.time.hot_start() == pytest.approx(0.8)


def test_the_gap_ends_when_the_pull_that_found_the_message_began(clock):
    """The pull itself (0.1-0.3 s with TLS) is not part of the gap: counted in, it moved the window
    later every round until the node slept through part of each round's message."""
    from flower_vfl.deploy import supernode

    sci, now, slept = clock
    assert supernode.cap_idle_sleep(0.5, 0.02) is True
    for _ in range(4):                                      # the message comes 1.0 s after each reply
        reply = now[0]
        sci._push_messages("state")
        now[0] = reply + 1.0
        assert sci._pull_and_store_message("found it") is None   # Flower's pull, begun at reply + 1.0
        now[0] = reply + 1.25                               # ... took 0.25 s
        sci.time.sleep(0.5)                                 # the first wait for the ClientApp's reply
        now[0] = reply + 2.0
    assert sci.time.gaps == [1.0, 1.0, 1.0]
    assert sci.time.hot_start() == pytest.approx(0.8)       # the window opens before the message


def test_deploy_local_stretches_the_idle_poll_beyond_8_parties(monkeypatch, tmp_path):
    from flower_vfl.deploy.local import idle_poll_for

    assert [idle_poll_for(m) for m in (1, 2, 8, 16, 32, 100)] == [0.5, 0.5, 0.5, 1.0, 2.0, 3.0]
    assert idle_poll_for(16, 0.2) == 0.4
    cmds = deploy_local_commands(monkeypatch, tmp_path, 16, auth=False, tls=False)
    assert cmds["node3"][cmds["node3"].index("--idle-poll") + 1] == "1.0"
